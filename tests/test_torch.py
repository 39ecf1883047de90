"""PyTorch models and user factories through the parameter server (real daemons on loopback).

The servers run no model code: the workers bring a torch ``nn.Module`` (examples/torch_digits.py)
or a numpy model named by import path, and the servers learn the parameters from them.
"""

from __future__ import annotations

import json
import re
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorwire.server import optim

from .jobs import assert_params_close, cli, digits_bsp_job, digits_reference, log_has, ok

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = str(ROOT / "examples" / "torch_digits.py") + ":make"


def _torch_reference(steps: int, workers: int, batch: int, lr: float) -> dict[str, Any]:
    """One process, the same module and seed, on the union of the workers' batches; the same
    optimizer code the server runs, on numpy copies of the parameters."""
    from tensorwire.client.tasks import JobInfo, load_factory

    per_rank = [load_factory(EXAMPLE)(JobInfo(r, workers, batch, 0)) for r in range(workers)]
    module = per_rank[0][0]
    params = {n: p.detach().numpy().copy() for n, p in module.named_parameters()}
    opt = optim.make("sgd", lr)
    for step in range(steps):
        with torch.no_grad():
            for n, p in module.named_parameters():
                p.copy_(torch.from_numpy(params[n]))
        xs, ys = zip(*(made[1](step) for made in per_rank), strict=True)
        module.zero_grad()
        torch.nn.functional.cross_entropy(module(torch.cat(xs)), torch.cat(ys)).backward()
        for n, p in module.named_parameters():
            assert p.grad is not None
            opt.step(n, params[n], p.grad.numpy().copy())
    return params


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_torch_bsp_equals_one_process_on_the_union_of_batches(job: Any, transport: str) -> None:
    steps, lr = 20, 0.05
    j = job(
        ps=["--steps", str(steps), "--lr", str(lr), "--split-bytes", "4096"],
        servers=2,
        worker=["--model", EXAMPLE, "--transport", transport],
    )
    ok(j)
    ref = _torch_reference(steps, 2, 32, lr)
    for rank in (0, 1):
        got = j.params(rank)
        assert list(got) == list(ref)  # the module's own parameter names, in its order
        assert_params_close(got, ref, 1e-5)


def test_a_compiled_module_trains_as_the_module_does_and_compiles_once(job: Any) -> None:
    """``torch.compile(module)`` from the factory: a BSP job ends where the same job of the
    module uncompiled ends (its parameters named with the compiled wrapper's ``_orig_mod.``),
    and neither worker compiles again once started but for the evaluation's ``no_grad``
    (``TORCH_LOGS=recompiles`` logs each recompilation and its cause), although the servers
    write the parameters' buffers at every step."""
    steps = ["--steps", "30", "--optimizer", "momentum", "--lr", "0.1"]
    compiled = job(
        ps=steps,
        worker=["--model", "tests.torch_compiled_model:make"],
        env={"TORCH_LOGS": "recompiles"},
    )
    plain = job(ps=steps, worker=["--model", "tests.torch_compiled_model:plain"])
    ok(compiled, timeout=300)  # (the first compilation takes seconds on a small machine)
    ok(plain)
    want = plain.params(0)
    for rank in (0, 1):
        got = compiled.params(rank)
        assert sorted(got) == sorted(f"_orig_mod.{n}" for n in want)
        assert_params_close({n.removeprefix("_orig_mod."): v for n, v in got.items()}, want, 1e-5)
        log = compiled.log(f"w{rank}")
        recompiled = log.count("Recompiling")
        # (the evaluation's no_grad: "changed: grad_mode", which torch 2.3, the floor, logs
        # as its guard of the global state, "___check_global_state()")
        grad_mode = "changed: grad_mode" in log or "___check_global_state()" in log
        assert recompiled == 0 or (recompiled == 1 and grad_mode), log


def test_torch_cnn_trains_digits_to_97_percent(job: Any) -> None:
    j = job(
        ps=["--steps", "600", "--optimizer", "momentum", "--lr", "0.05"],
        worker=["--model", EXAMPLE],
    )
    ok(j)
    acc = j.metrics("w0")["test_accuracy"]
    assert acc >= 0.97, f"test accuracy {acc}"


def test_torch_job_resumes_from_its_checkpoint(job: Any, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    common = ["--optimizer", "momentum", "--checkpoint-dir", str(ckpt)]
    # --threads pinned: auto's count depends on the workers running here as each joins, and
    # another count sums a convolution in another order (a fresh clone's run failed on it)
    model = ["--model", EXAMPLE, "--threads", "1"]
    # the job without a break runs beside the two others (each worker process spends seconds
    # of CPU importing torch: one worker a job, the server's checkpoint is what is tested)
    straight = job(ps=["--optimizer", "momentum", "--steps", "20"], worker=model, workers=1)
    ok(job(ps=[*common, "--steps", "10"], worker=model, workers=1))
    resumed = job(ps=[*common, "--steps", "20", "--resume"], worker=model, workers=1)
    ok(resumed)
    assert "resumed shard 0" in resumed.log("ps0") and "at step 10" in resumed.log("ps0")
    ok(straight)
    a, b = resumed.params(0), straight.params(0)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_a_torch_modules_buffers_are_saved_beside_its_parameters(job: Any) -> None:
    """A module with batch norm, trained by a job of one worker: ``--save-params`` writes its
    whole ``state_dict``, the parameters the servers wrote and the buffers the worker kept
    (running statistics moved from their start, a batch count of one a step), so that
    ``load_state_dict(strict=True)`` takes the file and the model evaluates as the worker did
    at its end. Before, the file held the parameters alone: a strict load failed on the
    missing buffers, and a lenient one evaluated with statistics never trained."""
    from tensorwire.client import models

    from .torch_bn_model import accuracy, module

    steps = 30
    j = job(
        ps=["--steps", str(steps), "--lr", "0.1"],
        worker=["--model", "tests.torch_bn_model:make"],
        workers=1,
    )
    ok(j)
    saved = j.params(0)
    model = module()
    assert sorted(saved) == sorted(model.state_dict())
    assert int(saved["1.num_batches_tracked"]) == steps
    assert not np.allclose(saved["1.running_mean"], 0)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in saved.items()}, strict=True)
    assert accuracy(model, models.load("digits", 0)) == j.metrics("w0")["test_accuracy"]


def test_a_user_factory_named_by_import_path_trains(job: Any) -> None:
    j = job(ps=["--steps", "300", "--lr", "0.5"], worker=["--model", "tests.user_model:make"])
    ok(j)
    assert j.metrics("w0")["test_accuracy"] >= 0.9
    assert set(j.params(0)) == {"w", "b"}


def test_a_built_in_model_in_torch_trains_as_the_numpy_one(job: Any) -> None:
    """--framework torch: the digits MLP as a torch module (the numpy model's names, shapes
    and initial values) through a BSP job equals the numpy model trained in one process.
    Worker 0 computes with the threads --threads auto gives it (the usable cores divided among
    the tensorwire workers on this host, at least the job's two), worker 1 with --threads 3."""
    steps, lr = 20, 0.1
    j = digits_bsp_job(
        job,
        servers=2,
        optimizer="sgd",
        lr=lr,
        steps=steps,
        ps=[],
        worker=["--framework", "torch", "--log-level", "INFO"],
        each_worker={1: ["--threads", "3"]},
    )
    ok(j)
    ref = digits_reference(steps, 2, 32, optim.make("sgd", lr))
    for rank in (0, 1):
        got = j.params(rank)
        assert list(got) == list(ref)
        assert_params_close(got, ref, 1e-5)
    said = re.search(
        r"PyTorch computes with (\d+) thread\(s\) \((\d+) usable cores, (\d+) tensorwire "
        r"worker\(s\) here; --threads sets it\)",
        j.log("w0"),
    )
    assert said is not None, j.log("w0")
    count, cores, workers = (int(g) for g in said.groups())
    assert workers >= 2 and count == max(1, cores // workers) == j.metrics("w0")["threads"]
    assert "PyTorch computes with 3 thread(s) (--threads)" in j.log("w1")
    assert j.metrics("w1")["threads"] == 3


@pytest.mark.parametrize("residual", [0.0, 0.5], ids=["plain", "residual"])
def test_the_torch_twin_of_a_built_in_model_computes_what_the_numpy_one_does(
    residual: float,
) -> None:
    """BuiltinMlp against client.models on one batch: the same loss and, through autograd,
    the same gradients as the hand-written backprop (a residual chain's inputs padded and
    cut on the way)."""
    from tensorwire.client import models
    from tensorwire.client.torch_task import BuiltinMlp

    spec = models.ModelSpec("tiny", (5, 7, 4, 6, 3), gain=1.0, residual=residual)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((8, 5)).astype(np.float32), rng.integers(0, 3, 8)
    loss, grads, _ = models.loss_and_grads(spec, spec.init(2), x, y)
    module = BuiltinMlp(spec, 2)
    got = torch.nn.functional.cross_entropy(module(torch.from_numpy(x)), torch.from_numpy(y))
    got.backward()
    assert float(got.detach()) == pytest.approx(loss, rel=1e-5)
    for name, param in module.named_parameters():
        assert param.grad is not None
        np.testing.assert_allclose(param.grad.numpy(), grads[name], rtol=1e-4, atol=1e-6)


def test_a_framework_the_model_is_not_in_is_one_line() -> None:
    cases = [
        ("numpy", EXAMPLE, 1, "--framework numpy: the model factory built a torch model"),
        ("torch", "tests.user_model:make", 1, "--framework torch: the model factory built a numpy"),
        ("jax", "digits", 2, "invalid choice: 'jax'"),
    ]
    with ThreadPoolExecutor(len(cases)) as pool:  # each worker spends seconds importing torch
        outs = pool.map(
            lambda case: cli(
                *("-m", "tensorwire.client.worker", "--framework", case[0]),
                *("--model", case[1], "--no-progress"),
            ),
            cases,
        )
        for out, (_, _, code, says) in zip(outs, cases, strict=True):
            assert out.returncode == code and "Traceback" not in out.stderr, out.stderr
            assert says in out.stderr.strip().splitlines()[-1], out.stderr


def test_bench_ps_compares_transports_for_a_built_in_model_in_torch(tmp_path: Path) -> None:
    """... and against PyTorch's DistributedDataParallel over gloo (--ddp), the same model."""
    path = tmp_path / "ps.json"
    out = cli(
        *("-m", "tensorwire.bench", "ps", "--framework", "torch", "--model", "digits"),
        *("--transports", "shm,grpc", "--steps", "5", "--json", str(path), "--ddp"),
        "--workers",  # one: each worker process spends seconds of CPU importing torch
        "1",
        # two jobs whose workers import torch: 38.4 s in a run of the suite in six processes,
        # past the 60 s the quick commands get on a slower machine
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "model digits in torch" in out.stdout
    result = json.loads(path.read_text())
    assert result["config"]["framework"] == "torch"
    rows = {r["transport"]: r for r in result["rows"]}
    assert set(rows) == {"shm", "grpc", "ddp-gloo"} and rows["grpc"]["x_grpc"] == 1.0
    assert rows["shm"]["steps_per_s"] > 0
    ddp = rows["ddp-gloo"]
    assert ddp["steps_per_s"] > 0 and ddp["x_ddp"] == 1.0 and 0 < ddp["formed_s"] < 120
    assert rows["shm"]["x_ddp"] == pytest.approx(rows["shm"]["steps_per_s"] / ddp["steps_per_s"])
    assert ddp["x_grpc"] == pytest.approx(ddp["steps_per_s"] / rows["grpc"]["steps_per_s"])
    assert 0 <= ddp["accuracy"][0] <= 1 and result["config"]["ddp"] is True
    assert "vs ddp" in out.stdout.splitlines()[0] and "ddp-gloo" in out.stdout


@pytest.mark.parametrize(
    ("optimizer", "lr", "decay"), [("momentum", 0.05, 0.0), ("adamw", 0.01, 0.01)]
)
def test_the_ddp_row_of_bench_ps_computes_what_a_bsp_job_computes(
    tmp_path: Path, optimizer: str, lr: float, decay: float
) -> None:
    """bench ps --ddp's reference (two DDP processes over gloo, the servers' optimizer as
    torch's) trains the digits MLP to the parameters one process computes on the union of the
    workers' batches with the servers' own optimizer code: what a bsp job computes (1e-5).
    The servers' settings come through their own parser (--momentum 0.5, not the default).
    (In a process of its own: torch's rendezvous store keeps a pipe for the process's life.)"""
    from tensorwire.bench import ddp
    from tensorwire.server import optim

    from .jobs import assert_params_close, digits_reference

    flags = ["--optimizer", optimizer, "--lr", str(lr), "--weight-decay", str(decay)]
    assert ddp.optimizer_of([*flags, "--momentum", "0.5"]) == (optimizer, lr, decay, 0.5)
    steps, out = 20, tmp_path / "ddp.npz"
    run = cli(
        "-c",
        "import json, sys, numpy as np; from tensorwire.bench import ddp; "
        f"job = ddp.DdpJob('digits', 'torch', 2, 32, {steps}, {optimizer!r}, {lr}, {decay}, "
        "0.5, keep_params=True); r = ddp.run(job); "
        f"np.savez({str(out)!r}, **r.pop('params')); print(json.dumps(r))",
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    with np.load(out) as saved:
        params = {k: saved[k] for k in saved.files}
    ref = digits_reference(steps, 2, 32, optim.make(optimizer, lr, decay, momentum=0.5))
    assert list(params) == list(ref)
    assert_params_close(params, ref, 1e-5)
    assert result["steps_per_s"] > 0 and 0 < result["formed_s"] < 120
    assert 0 <= result["accuracy"] <= 1


def test_bench_ps_ddp_asks_what_it_can_compare() -> None:
    """--ddp with a numpy model, another sync than bsp, or workers on a GPU: one line each,
    before any job runs."""
    for more, says in (
        (["--model", "digits"], "--ddp trains a PyTorch module"),
        (["--framework", "torch", "--sync", "asp"], "--sync asp is not that"),
        (["--framework", "torch", "--worker-args", "--device cuda"], "on the CPU"),
    ):
        out = cli("-m", "tensorwire.bench", "ps", "--ddp", "--model", "digits", *more)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert says in out.stderr.strip().splitlines()[-1], out.stderr
    # the workers' device from the variable their daemons read, as from --worker-args
    out = cli(
        *("-m", "tensorwire.bench", "ps", "--ddp", "--model", "digits", "--framework", "torch"),
        env={"TENSORWIRE_DEVICE": "cuda"},
    )
    assert out.returncode == 2 and "on the CPU" in out.stderr.strip().splitlines()[-1], out.stderr


def test_a_bad_model_spec_is_one_line() -> None:

    for spec, says in (
        ("nope", "give a built-in model"),
        ("no.such.module:make", "cannot import no.such.module"),
        ("tests.user_model:missing", "has no callable 'missing'"),
    ):
        out = cli("-m", "tensorwire.client.worker", "--model", spec, "--no-progress")
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert says in out.stderr.strip().splitlines()[-1]


def test_a_custom_torch_loop_trains_through_psclient() -> None:
    from .conftest import free_port

    out = cli(
        str(ROOT / "examples" / "torch_custom_loop.py"),
        "--servers",
        f"tcp://127.0.0.1:{free_port()}",
        "--steps",
        "300",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "final test accuracy" in out.stdout


def test_a_gpu_asked_of_what_cannot_use_one_is_one_line() -> None:
    """--device cuda with a numpy model, or on a machine or torch build without CUDA, stops the
    worker before it joins anything, with one line saying why. (A device that is no device's
    name, tpu, is refused by the parser: test_cli.py.)"""
    cases = [("digits", "numpy models train on the CPU")]
    if not torch.cuda.is_available():
        cases.append((EXAMPLE, "has no CUDA"))
    # the cases at once: each worker spends seconds importing torch
    with ThreadPoolExecutor(len(cases)) as pool:
        outs = pool.map(
            lambda i: cli(
                *("-m", "tensorwire.client.worker", "--model", cases[i][0]),
                *("--device", "cuda", "--no-progress"),
            ),
            range(len(cases)),
        )
        for out, (_, says) in zip(outs, cases, strict=True):
            assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
            assert says in out.stderr.strip().splitlines()[-1], out.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch with CUDA)")
@pytest.mark.parametrize(
    ("transport", "server_device", "pack_bytes"),
    [
        ("shm", "cpu", "262144"),
        ("tcp", "cpu", "262144"),
        ("shm", "cuda", "262144"),
        ("tcp", "cuda", "262144"),
        ("shm", "cuda", "0"),
    ],
)
def test_torch_bsp_on_gpu_workers_equals_one_process(
    job: Any, transport: str, server_device: str, pack_bytes: str
) -> None:
    """Workers with --device cuda: the servers write the parameters into GPU memory, the module
    reads them there through DLPack, gradients leave from GPU memory (into the servers' GPU
    memory too, with their --device cuda). The reference runs on the CPU; GPU convolutions may
    use TF32 (torch's default for cuDNN), hence the looser bound. The CNN's small parameters
    travel in packs (the default: gathered on the GPU by one torch.cat, stepped whole on a GPU
    server), and each alone (--pack-bytes 0)."""
    steps, lr = 20, 0.05
    j = job(
        ps=[
            "--steps",
            str(steps),
            "--lr",
            str(lr),
            "--split-bytes",
            "4096",
            "--device",
            server_device,
            "--pack-bytes",
            pack_bytes,
        ],
        servers=2,
        worker=["--model", EXAMPLE, "--transport", transport, "--device", "cuda"],
    )
    ok(j)
    ref = _torch_reference(steps, 2, 32, lr)
    for rank in (0, 1):
        got = j.params(rank)
        assert list(got) == list(ref)
        assert_params_close(got, ref, 1e-2)
    assert j.metrics("w0")["steps"] == steps


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch with CUDA)")
def test_a_built_in_model_in_torch_on_gpu_workers_trains_as_the_numpy_one(job: Any) -> None:
    """--framework torch --device cuda: the digits MLP as a torch module on the GPU, its
    parameters bound to GPU buffers the servers write, equals the numpy model trained in one
    process on the CPU (matrix products on the GPU sum in another order: a looser bound)."""
    steps, lr = 20, 0.1
    j = digits_bsp_job(
        job,
        servers=2,
        optimizer="sgd",
        lr=lr,
        steps=steps,
        ps=[],
        worker=["--framework", "torch", "--device", "cuda"],
    )
    ok(j)
    ref = digits_reference(steps, 2, 32, optim.make("sgd", lr))
    for rank in (0, 1):
        assert_params_close(j.params(rank), ref, 1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch with CUDA)")
@pytest.mark.parametrize("factory", ["make", "sparse", "tied", "lazy", "tiny_lm"])
def test_gpu_workers_train_models_whose_gradients_are_not_dense_per_step(
    job: Any, factory: str
) -> None:
    """Workers with --device cuda, each of the models whose gradients are not one dense tensor
    per parameter per step: ``make``, a layer no step uses (``grad`` None, pushed flagged) and
    one some steps use, ``sparse``, an ``nn.Embedding(sparse=True)`` (densified on the GPU),
    and ``tied``, two layers sharing one weight, equal one process stepped by ``torch.optim``
    on the CPU (the unused layer bit for bit as it started); ``lazy`` (``nn.LazyLinear``,
    shaped by a forward pass of a batch moved to the GPU) and the tiny language model
    (per-token loss, AdamW) learn."""
    from .torch_grads_model import module, reference

    steps, lr = 20, 0.05
    if factory in ("make", "sparse", "tied"):
        decay = 0.1 if factory == "make" else 0.0
        ps = ["--optimizer", "momentum", "--lr", str(lr), "--weight-decay", str(decay)]
        model = f"tests.torch_grads_model:{factory}"
    elif factory == "lazy":
        steps, ps, model = 60, ["--lr", "0.5"], "tests.torch_grads_model:lazy"
    else:
        steps, ps = 120, ["--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.01"]
        model = str(ROOT / "examples" / "torch_tiny_lm.py") + ":make"
    j = job(
        ps=["--steps", str(steps), *ps],
        worker=["--model", model, "--device", "cuda", "--eval-every", "0"],
    )
    ok(j)
    if factory in ("make", "sparse", "tied"):
        want = reference(steps, 2, 32, lr, 0.9, decay, "branched" if factory == "make" else factory)
        for rank in (0, 1):
            assert_params_close(j.params(rank), want, 1e-4)
        if factory == "make":
            start = {n: p.detach().numpy() for n, p in module().named_parameters()}
            for name in ("spare.weight", "spare.bias"):
                np.testing.assert_array_equal(j.params(0)[name], start[name])
    else:
        # (chance is 0.1 on the digits, 0.0625 for the LM's tokens; the lazy model, its layers
        # drawn by the GPU's generator, reached 0.783 on an H200 where the CPU's reach 0.8)
        assert j.metrics("w0")["test_accuracy"] > (0.5 if factory == "lazy" else 0.9)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch with CUDA)")
def test_a_module_built_on_a_gpu_for_a_cpu_worker_is_moved_and_said(job: Any) -> None:
    """A factory that builds its module on the GPU, run by a worker without ``--device`` (cpu):
    the module trains on the CPU, as ``--device`` says, and the worker's log says it was moved
    and how to train it where it was built. Before, it was moved without a word."""
    j = job(ps=["--steps", "3"], worker=["--model", "tests.torch_grads_model:on_gpu"])
    ok(j)
    says = "the model factory built the module on cuda:0; this worker trains on cpu (--device)"
    for rank in (0, 1):
        assert says in j.log(f"w{rank}") and "pass --device cuda:0" in j.log(f"w{rank}")


def test_a_frozen_layer_is_not_trained_sent_or_decayed(job: Any, tmp_path: Path) -> None:
    """A model fine-tuned on a frozen bfloat16 layer (``requires_grad=False``), trained with
    momentum and weight decay by two workers: the servers keep the head alone, the frozen layer
    ends bit for bit as it started, and each worker's file holds the whole ``state_dict`` (the
    frozen layer as float32, which holds bfloat16 exactly) and loads strictly. Before, every
    parameter went to the servers: a bfloat16 one was refused ("the servers keep float32
    parameters"), and a float32 one was pushed zeros every step and shrunk by the weight decay
    (by 0.11 in 20 steps at 0.1)."""
    from .torch_frozen_model import module

    steps, ckpt = 20, tmp_path / "ckpt"
    j = job(
        ps=[
            *("--steps", str(steps), "--optimizer", "momentum", "--weight-decay", "0.1"),
            *("--checkpoint-dir", str(ckpt), "--checkpoint-every", "0"),
        ],
        worker=["--model", "tests.torch_frozen_model:make"],
    )
    ok(j)
    start = module()
    with np.load(ckpt / "ps-shard0.npz") as kept:
        held = sorted(name for name, _, _ in json.loads(str(kept["__specs__"])))
        fixed = str(kept["__fixed__"])
    assert held == ["head.bias", "head.weight"]
    # what a server resumed from it compares the workers' frozen layers with
    from tensorwire.client.torch_task import frozen_digest

    assert fixed == frozen_digest(start)
    for rank in (0, 1):
        saved = j.params(rank)
        assert sorted(saved) == sorted(start.state_dict())
        for name in ("backbone.weight", "backbone.bias"):
            want = start.state_dict()[name].float().numpy()
            np.testing.assert_array_equal(saved[name], want)
        assert not np.allclose(saved["head.weight"], start.head.weight.detach().numpy())
        model = module()
        model.load_state_dict({k: torch.from_numpy(v) for k, v in saved.items()}, strict=True)


@pytest.mark.parametrize(
    ("servers", "transport", "optimizer"),
    [(1, "shm", "momentum"), (2, "tcp", "momentum"), (1, "shm", "adam"), (2, "shm", "adamw")],
)
def test_a_parameter_a_step_does_not_use_is_stepped_as_pytorch_steps_it(
    job: Any, servers: int, transport: str, optimizer: str
) -> None:
    """A model whose ``extra`` layer some steps of some workers use (and others not) and whose
    ``spare`` layer no step uses, trained by two workers under BSP with weight decay, computes
    what one process computes with PyTorch's own optimizer (SGD with momentum, Adam, AdamW) on
    the mean of the workers' losses: a worker without a gradient of a parameter counts as zeros
    in the average, and a parameter neither worker has one of is not stepped (PyTorch skips a
    parameter whose ``grad`` is None), its momentum and Adam's step count kept. Before, a
    parameter without a gradient was pushed zeros and stepped on them: momentum and weight
    decay moved ``spare``, which no step uses, and ``extra`` at the steps neither worker took
    it."""
    from .torch_grads_model import module, reference

    steps, lr, decay = 20, 0.05 if optimizer == "momentum" else 0.01, 0.1
    common = ["--transport", transport]
    j = job(
        servers=servers,
        ps=[
            *common,
            *("--steps", str(steps), "--optimizer", optimizer, "--lr", str(lr)),
            *("--momentum", "0.9", "--weight-decay", str(decay), "--split-bytes", "1024"),
        ],
        worker=[*common, "--model", "tests.torch_grads_model:make"],
    )
    ok(j)
    want = reference(steps, 2, 32, lr, 0.9, decay, optimizer=optimizer)
    start = {n: p.detach().numpy() for n, p in module().named_parameters()}
    for rank in (0, 1):
        got = j.params(rank)
        for name in ("spare.weight", "spare.bias"):
            np.testing.assert_array_equal(got[name], start[name])
        assert not np.allclose(got["extra.weight"], start["extra.weight"])
        assert_params_close(got, want, 1e-5)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw"])
def test_each_server_optimizer_computes_what_pytorch_s_own_computes(name: str) -> None:
    """The servers' optimizers (server/optim.py, numpy) against PyTorch's (SGD, SGD with
    momentum, Adam, AdamW), with weight decay, on the same 30 gradients, the server's taking
    each as a sum of two workers' scaled by 1/2 as BSP does: the same parameters to 1e-6
    relative. AdamW's decay is decoupled (the parameter shrinks by lr times it, apart from the
    moments), Adam's is L2, as PyTorch's are."""
    from .torch_grads_model import torch_optimizer

    rng = np.random.default_rng(0)
    start = rng.standard_normal((8, 5)).astype(np.float32)
    grads = [rng.standard_normal((8, 5)).astype(np.float32) for _ in range(30)]
    lr, decay = (0.05, 0.1) if name in ("sgd", "momentum") else (0.01, 0.1)
    ours = optim.make(name, lr, decay)
    param = start.copy()
    for g in grads:
        ours.step("w", param, 2 * g, scale=0.5)  # (its scratch buffer: overwritten)
    theirs = torch.nn.Parameter(torch.from_numpy(start.copy()))
    opt = torch_optimizer(name, [theirs], lr, decay)
    for g in grads:
        theirs.grad = torch.from_numpy(g.copy())
        opt.step()
    want = theirs.detach().numpy()
    err = np.linalg.norm(param - want) / np.linalg.norm(want)
    assert err < 1e-6, f"{name}: relative error {err:.2e}"
    if name == "adamw":  # decoupled: not what Adam with the same decay computes
        adam = start.copy()
        other = optim.make("adam", lr, decay)
        for g in grads:
            other.step("w", adam, 2 * g, scale=0.5)
        assert np.linalg.norm(adam - want) / np.linalg.norm(want) > 1e-4


@pytest.mark.parametrize(
    ("schedule", "optimizer", "servers"), [("cosine", "adamw", 2), ("linear", "momentum", 1)]
)
def test_a_learning_rate_schedule_with_warmup_steps_as_pytorch_s_lambda_lr(
    job: Any, schedule: str, optimizer: str, servers: int
) -> None:
    """``--lr-schedule cosine|linear --warmup-steps 5``: a BSP job of two workers equals one
    process whose optimizer's rate follows ``LambdaLR`` with Hugging Face's formulas (written
    out here): rising from 0 over the warmup, then falling to 0 at the job's last step."""
    from .torch_grads_model import reference, schedule_factor

    steps, warmup, lr, decay = 20, 5, 0.02, 0.1
    factor = schedule_factor(schedule, steps, warmup)
    j = job(
        servers=servers,
        ps=[
            *("--steps", str(steps), "--optimizer", optimizer, "--lr", str(lr)),
            *("--weight-decay", str(decay), "--split-bytes", "1024"),
            *("--lr-schedule", schedule, "--warmup-steps", str(warmup)),
        ],
        worker=["--model", "tests.torch_grads_model:make"],
    )
    ok(j)
    want = reference(steps, 2, 32, lr, 0.9, decay, optimizer=optimizer, schedule=factor)
    flat = reference(steps, 2, 32, lr, 0.9, decay, optimizer=optimizer)
    for rank in (0, 1):
        assert_params_close(j.params(rank), want, 1e-5)
    # (the schedule matters here: without it, PyTorch ends elsewhere)
    err = np.linalg.norm(j.params(0)["trunk.weight"] - flat["trunk.weight"])
    assert err > 1e-3 * np.linalg.norm(flat["trunk.weight"])


def test_a_server_killed_and_resumed_keeps_to_its_learning_rate_schedule(
    job: Any, tmp_path: Path
) -> None:
    """A server with a warmup and a cosine schedule, SIGKILLed part way (after a checkpoint of
    step 10 or later, short of the job's 40) and started again with ``--resume``: the workers
    come back by themselves, the steps since the checkpoint are done again, and the job ends
    where one process stepped by ``LambdaLR`` and momentum ends. The rate is taken up at the
    checkpoint's step (a function of the step and the shared settings) and the momentum from
    the checkpoint."""
    from .torch_grads_model import reference, schedule_factor

    steps, warmup, lr, decay = 40, 5, 0.05, 0.1
    j = job(
        ps=[
            *("--steps", str(steps), "--optimizer", "momentum", "--lr", str(lr)),
            *("--weight-decay", str(decay), "--lr-schedule", "cosine"),
            *("--warmup-steps", str(warmup), "--checkpoint-every", "5"),
            *("--checkpoint-dir", str(tmp_path / "ckpt"), "--log-level", "INFO"),
        ],
        worker=["--model", "tests.torch_grads_model:paced"],  # 100 ms a step: 3 s to spare
    )
    log_has(j.tmp / "ps0.log", "checkpoint at step 10", 60)
    j.ps[0].kill()
    assert j.ps[0].wait(10) == -signal.SIGKILL
    saved = int(j.log("ps0").rsplit("checkpoint at step ", 1)[1].split()[0])
    assert 10 <= saved < steps
    again = j.start([*j.ps[0].args, "--resume"], log="ps0-again")
    codes = [p.wait(120) for p in (again, *j.workers)]
    text = (j.tmp / "ps0-again.log").read_text()
    assert codes == [0, 0, 0], text + j.log("w0")
    assert f"at step {saved}" in text, text
    want = reference(
        steps, 2, 32, lr, 0.9, decay, schedule=schedule_factor("cosine", steps, warmup)
    )
    for rank in (0, 1):
        assert_params_close(j.params(rank), want, 1e-5)


@pytest.mark.parametrize("shards", [1, 2])
def test_a_clipped_gradient_norm_as_pytorch_s_clip_grad_norm(job: Any, shards: int) -> None:
    """``--clip-grad-norm 0.5`` (bsp): a job of two workers equals one process that clips its
    mean gradient with ``torch.nn.utils.clip_grad_norm_`` before each momentum step (the
    model's unused layer out of the norm, as PyTorch leaves a parameter whose grad is None),
    and the server counts the steps it clipped; clipping matters here (the unclipped job ends
    elsewhere). Over two shards the norm is the whole gradient's, each server's squared norm
    added up by the workers (before 2026-12-05 refused: no server of several sees the others'
    chunks), and no step fell back on a shard's own norm."""
    from .torch_grads_model import reference

    steps, lr, limit = 20, 0.05, 0.5
    j = job(
        servers=shards,
        ps=[
            *("--steps", str(steps), "--optimizer", "momentum", "--lr", str(lr)),
            *("--weight-decay", "0.1", "--clip-grad-norm", str(limit)),
            # (two shards: small parameters alone, so that both hold some; a pack goes to one)
            *(["--pack-bytes", "0"] if shards > 1 else []),
        ],
        worker=["--model", "tests.torch_grads_model:make"],
    )
    ok(j)
    want = reference(steps, 2, 32, lr, 0.9, 0.1, clip=limit)
    free = reference(steps, 2, 32, lr, 0.9, 0.1)
    for rank in (0, 1):
        assert_params_close(j.params(rank), want, 1e-5)
    clipped = [j.metrics(f"ps{s}")["clipped_steps"] for s in range(shards)]
    assert 0 < clipped[0] <= steps and clipped == [clipped[0]] * shards, clipped
    if shards > 1:
        assert [j.metrics(f"ps{s}")["clipped_alone_steps"] for s in range(shards)] == [0, 0]
    err = np.linalg.norm(want["trunk.weight"] - free["trunk.weight"])
    assert err > 1e-3 * np.linalg.norm(free["trunk.weight"])


@pytest.mark.parametrize(
    ("sync", "shards", "device"),
    [
        ("asp", 1, "cpu"),
        ("asp", 2, "cpu"),
        ("ssp", 2, "cpu"),
        pytest.param(
            "asp",
            2,
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(
                    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch with CUDA)"
                ),
            ],
        ),
    ],
)
def test_an_async_push_is_clipped_as_one_process_clips_its_gradient(
    job: Any, sync: str, shards: int, device: str
) -> None:
    """``--clip-grad-norm 0.5`` under asp and ssp clips each worker's push by the norm of its
    whole gradient (all shards' chunks: the worker takes it and sends it in its meta, and every
    server scales by it): a job of one worker equals one process that clips its gradient with
    ``torch.nn.utils.clip_grad_norm_`` before each momentum step (before 2026-12-05 refused:
    "--clip-grad-norm needs --sync bsp"). Every shard counts the same clipped pushes, and
    clipping matters here (the unclipped job ends elsewhere). ``cuda``: the worker's gradients
    and the servers' parameters on the GPU (the norm taken by torch there, one
    synchronisation)."""
    from .torch_grads_model import reference

    steps, lr, limit = 20, 0.05, 0.5
    j = job(
        servers=shards,
        workers=1,
        ps=[
            *("--sync", sync, "--steps", str(steps), "--optimizer", "momentum"),
            *("--lr", str(lr), "--weight-decay", "0.1", "--clip-grad-norm", str(limit)),
            *(["--pack-bytes", "0"] if shards > 1 else []),
            *(["--device", device] if device != "cpu" else []),
        ],
        worker=[
            *("--model", "tests.torch_grads_model:make"),
            *(["--device", device] if device != "cpu" else []),
        ],
    )
    ok(j)
    want = reference(steps, 1, 32, lr, 0.9, 0.1, clip=limit)
    free = reference(steps, 1, 32, lr, 0.9, 0.1)
    assert_params_close(j.params(0), want, 1e-5 if device == "cpu" else 1e-4)
    clipped = [j.metrics(f"ps{s}")["clipped_steps"] for s in range(shards)]
    assert 0 < clipped[0] <= steps and clipped == [clipped[0]] * shards, clipped
    assert all(j.metrics(f"ps{s}")["clipped_alone_steps"] is None for s in range(shards))
    err = np.linalg.norm(want["trunk.weight"] - free["trunk.weight"])
    assert err > 1e-3 * np.linalg.norm(free["trunk.weight"])


@pytest.mark.parametrize("kind", ["sparse", "tied"])
def test_a_sparse_or_shared_weight_trains_as_pytorch_trains_it(job: Any, kind: str) -> None:
    """Two workers under BSP with momentum compute what one process computes with PyTorch's
    own SGD, for ``sparse``, an ``nn.Embedding(sparse=True)`` (its gradient a sparse tensor of
    the rows looked up), whose gradient goes to the servers dense (before, the worker's first
    step ended in a traceback: numpy() refuses a sparse tensor), and ``tied``, two layers
    sharing one weight: it travels once, under its first name, and the layers still share it
    in the worker, the servers' updates landing in the one tensor both read (a layer left with
    a weight of its own would go on with the first values, and part from the reference)."""
    from .torch_grads_model import reference

    steps, lr = 20, 0.05
    j = job(
        ps=[*("--steps", str(steps), "--optimizer", "momentum", "--lr", str(lr))],
        worker=["--model", f"tests.torch_grads_model:{kind}"],
    )
    ok(j)
    want = reference(steps, 2, 32, lr, 0.9, 0.0, kind)
    if kind == "tied":
        assert "first.weight" in want and "second.weight" not in want
    for rank in (0, 1):
        assert_params_close(j.params(rank), want, 1e-5)


@pytest.mark.parametrize("sync", ["asp", "ssp"])
def test_an_async_push_leaves_a_parameter_it_has_no_gradient_of_alone(job: Any, sync: str) -> None:
    """Under asp and ssp each push is applied on its own: a parameter no step uses ends bit for
    bit as it started under momentum and weight decay, while those the steps use train (before,
    the zeros pushed for it were stepped, and decay shrank it)."""
    from .torch_grads_model import module

    j = job(
        ps=[
            *("--sync", sync, "--steps", "20", "--optimizer", "momentum"),
            *("--weight-decay", "0.1", "--split-bytes", "1024"),
        ],
        worker=["--model", "tests.torch_grads_model:make"],
    )
    ok(j)
    start = {n: p.detach().numpy() for n, p in module().named_parameters()}
    for rank in (0, 1):
        got = j.params(rank)
        for name in ("spare.weight", "spare.bias"):
            np.testing.assert_array_equal(got[name], start[name])
        for name in ("trunk.weight", "extra.weight"):
            assert not np.allclose(got[name], start[name]), name


def test_a_module_not_in_float32_is_refused_naming_its_dtype_and_what_to_do() -> None:
    """A module built in float64 (``.double()``) or bfloat16: refused before it joins, naming
    the parameter, its dtype and how many are so, and what to do (before: "parameter '0.weight':
    the servers keep float32 parameters", no dtype, no way out)."""
    from tensorwire.client.torch_task import TorchTask

    for dtype, name in ((torch.float64, "float64"), (torch.bfloat16, "bfloat16")):
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to(dtype)
        with pytest.raises(TypeError) as info:
            TorchTask(model, lambda step: (None, None), lambda m: 0.0)
        said = str(info.value)
        assert said.startswith(f"parameter '0.weight' is {name} (4 of the module's 4 that train")
        assert "build the module in float32 (module.float())" in said
        assert "--wire-dtype bfloat16" in said


def test_a_module_with_nothing_to_train_is_one_line() -> None:
    out = cli(
        *("-m", "tensorwire.client.worker", "--no-progress"),
        *("--model", "tests.torch_frozen_model:all_frozen"),
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "no parameter to train (all 4 of its parameters are frozen" in out.stderr


def test_a_layer_unfrozen_during_the_job_is_named() -> None:
    """The servers keep the parameters that trained from the start: one unfrozen later would
    have its gradients dropped without a word, so the step that finds one says so."""
    from tensorwire.client.tasks import JobInfo
    from tensorwire.client.torch_task import TorchTask, module_grads, trainable_parameters

    from .torch_frozen_model import make

    model, batches, evaluate = make(JobInfo(0, 1, 8, 0))
    task = TorchTask(model, batches, evaluate)
    assert sorted(task.initial_params()) == ["head.bias", "head.weight"]
    assert sorted(task.step(0).grads) == sorted(module_grads(model))
    assert sorted(trainable_parameters(model)) == ["head.bias", "head.weight"]
    model.backbone.weight.requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"'backbone\.weight' was frozen"):
        task.step(1)


def test_a_factory_s_own_loss_trains_a_regression(job: Any) -> None:
    """A factory returning ``(model, batches, evaluate, loss)``: a linear regression trained on
    mean squared error by two workers fits its held-out data (an error near the noise's 0.01,
    from about 8 at the start). Before, every torch module was trained on cross-entropy, which a
    regression's float targets fail at the first step: a model other than a classifier needed a
    Task of its own. Its score is negative (the error, negated): the server reports it as rank
    0 measured it, where a score below 0 was taken for "none" before."""
    j = job(
        ps=["--steps", "150", "--lr", "0.1"],
        worker=["--model", "tests.torch_regression_model:make", "--eval-every", "50"],
    )
    ok(j)
    assert -0.05 < j.metrics("w0")["test_accuracy"] < 0  # (the factory's score)
    assert j.metrics("ps0")["final_loss"] < 0.1
    assert -0.05 < j.metrics("ps0")["accuracy"] < 0  # (rank 0's at step 100)


def test_a_loss_that_is_not_a_scalar_or_a_loss_for_numpy_is_named() -> None:
    from tensorwire.client import tasks
    from tensorwire.client.tasks import JobInfo
    from tensorwire.client.torch_task import TorchTask

    from . import user_model
    from .torch_regression_model import make

    model, batches, evaluate, _ = make(JobInfo(0, 1, 8, 0))
    for loss, says in (
        (lambda out, y: (out.squeeze(-1) - y) ** 2, "it returned a tensor of shape (8,)"),
        (lambda out, y: 1.0, "it returned float"),
        (lambda out, y: torch.tensor(1.0), "with no gradient to follow"),
    ):
        with pytest.raises(TypeError, match="must return a scalar tensor") as err:
            TorchTask(model, batches, evaluate, loss=loss).step(0)
        assert says in str(err.value)
    with pytest.raises(TypeError, match="loss must be a function"):
        tasks.as_task((model, batches, evaluate, "mse"))
    numpy_model = user_model.make(JobInfo(0, 1, 8, 0))
    with pytest.raises(TypeError, match="a numpy model computes its loss in its loss_and_grads"):
        tasks.as_task((*numpy_model, lambda out, y: out))
    with pytest.raises(TypeError, match="got a tuple of 2"):
        tasks.as_task((model, batches))


def test_a_sequence_model_s_hits_are_counted_per_token() -> None:
    """Logits of (batch, tokens, vocabulary) against labels of (batch, tokens), with a loss
    that flattens them: the step counts the tokens predicted right. Before, the hits were the
    argmax over the second axis (the tokens) against the labels: a broadcast error, or a count
    of nothing in particular where the shapes happened to fit."""
    from tensorwire.client.torch_task import TorchTask

    torch.manual_seed(0)
    vocabulary, tokens, batch = 11, 5, 4
    model = torch.nn.Sequential(torch.nn.Embedding(vocabulary, 16), torch.nn.Linear(16, vocabulary))
    x = torch.randint(0, vocabulary, (batch, tokens))

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(out.reshape(-1, vocabulary), y.reshape(-1))

    task = TorchTask(model, lambda step: (x, x), lambda m: 0.0, loss=loss)
    result = task.step(0)
    want = int((model(x).argmax(dim=-1) == x).sum())
    assert (result.correct, result.samples) == (want, batch * tokens)


def test_the_default_loss_takes_a_sequence_model_s_logits_and_outputs_other_than_a_tensor() -> None:
    """Without a loss of the factory's: a sequence model's logits (batch, tokens, vocabulary)
    are trained on the cross-entropy of each token (here as many tokens as classes, where
    ``F.cross_entropy`` took the tokens for the classes without a word), and an output that is
    a dict with ``logits`` (as a Hugging Face ``ModelOutput`` is) or a tuple whose first item
    is the scores trains as the scores would, its hits counted; an output with no scores in it
    is named. Before, those outputs ended in cross-entropy's TypeError."""
    from tensorwire.client.torch_task import TorchTask

    F = torch.nn.functional
    vocabulary = tokens = 5
    x = torch.randint(0, vocabulary, (4, tokens), generator=torch.Generator().manual_seed(0))

    class Wrapped(torch.nn.Module):
        def __init__(self, shape: str) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(vocabulary, 8)
            self.head = torch.nn.Linear(8, vocabulary)
            self.shape = shape

        def forward(self, ids: torch.Tensor) -> Any:
            logits = self.head(self.emb(ids))
            if self.shape == "dict":
                return {"logits": logits, "hidden": self.emb(ids)}
            if self.shape == "tuple":
                return (logits, self.emb(ids))
            if self.shape == "none":
                return {"hidden": logits}
            return logits

    want_loss = None
    for shape in ("tensor", "dict", "tuple"):
        model = Wrapped(shape)
        with torch.no_grad():
            logits = model.head(model.emb(x))
        want = F.cross_entropy(logits.reshape(-1, vocabulary), x.reshape(-1))
        hits = int((logits.argmax(dim=-1) == x).sum())
        result = TorchTask(model, lambda step: (x, x), lambda m: 0.0).step(0)
        assert result.loss == pytest.approx(float(want), rel=1e-6), shape
        assert (result.correct, result.samples) == (hits, x.numel()), shape
        assert result.grads["head.weight"] is not None
        want_loss = want_loss or result.loss
        assert result.loss == want_loss  # the same model, whatever shape its output takes
    with pytest.raises(TypeError, match="the module returned a dict, in which the default loss"):
        TorchTask(Wrapped("none"), lambda step: (x, x), lambda m: 0.0).step(0)


def test_a_lazy_module_gets_its_shapes_from_the_first_batch_and_trains(job: Any) -> None:
    """A factory returning a module of ``nn.LazyLinear`` layers (no shapes until a first forward
    pass): the worker gives them their shapes with a forward pass of the first batch, the job
    trains (two workers, BSP), and each worker's parameters have the layers' shapes. Before,
    the worker stopped at once naming torch's UninitializedParameter."""
    from tensorwire.client.tasks import JobInfo
    from tensorwire.client.torch_task import TorchTask

    from .torch_grads_model import lazy

    model, batches, evaluate = lazy(JobInfo(0, 2, 8, 0))
    task = TorchTask(model, batches, evaluate)
    assert {n: v.shape for n, v in task.initial_params().items()} == {
        "0.weight": (32, 64),
        "0.bias": (32,),
        "2.weight": (10, 32),
        "2.bias": (10,),
    }
    j = job(ps=["--steps", "60", "--lr", "0.5"], worker=["--model", "tests.torch_grads_model:lazy"])
    ok(j)
    assert j.params(0)["0.weight"].shape == (32, 64)
    assert j.metrics("w0")["test_accuracy"] > 0.8


def test_the_tiny_language_model_example_learns_to_count_with_adamw(job: Any) -> None:
    """examples/torch_tiny_lm.py, a causal transformer whose factory gives no loss, trained by
    two workers with AdamW: the default loss is each token's cross-entropy over the logits'
    last axis, and the held-out tokens are predicted right (at most 0.0625 by chance)."""
    example = str(ROOT / "examples" / "torch_tiny_lm.py") + ":make"
    j = job(
        ps=[*("--steps", "120", "--optimizer", "adamw", "--lr", "0.01"), "--weight-decay", "0.01"],
        worker=["--model", example, "--eval-every", "0"],
    )
    ok(j)
    assert j.metrics("w0")["test_accuracy"] > 0.9
    assert j.metrics("ps0")["final_loss"] < 0.5


def test_a_model_of_several_inputs_takes_them_as_arguments_or_keywords() -> None:
    """A batch whose input is a tuple is passed as the module's arguments, a dict as its
    keywords (a transformer's ``input_ids`` and ``attention_mask``), each moved to the module's
    device; the step's gradients are those of one process computing the same. Before, the
    input went through ``torch.as_tensor``, which takes neither."""
    from tensorwire.client.torch_task import TorchTask

    class TwoInputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ids = torch.nn.Embedding(10, 8)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            h = (self.ids(input_ids) * attention_mask.unsqueeze(-1)).sum(dim=1)
            return self.head(h)

    torch.manual_seed(0)
    ids = np.random.default_rng(0).integers(0, 10, (4, 6))
    mask = np.tril(np.ones((4, 6), np.float32))
    y = np.array([0, 1, 2, 1])
    for x in ((ids, mask), {"input_ids": ids, "attention_mask": mask}):
        model = TwoInputs()
        task = TorchTask(model, lambda step, x=x: (x, y), lambda m: 0.0)
        got = task.step(0).grads
        reference = TwoInputs()
        reference.load_state_dict(model.state_dict())
        out = reference(torch.from_numpy(ids), torch.from_numpy(mask))
        torch.nn.functional.cross_entropy(out, torch.from_numpy(y)).backward()
        for name, p in reference.named_parameters():
            assert p.grad is not None
            np.testing.assert_allclose(got[name], p.grad.numpy(), rtol=1e-6)


def test_workers_whose_frozen_layers_differ_are_refused(job: Any) -> None:
    """Frozen parameters stay with each worker, so two workers whose factories drew them
    differently would train on different models without a word: the servers compare a digest
    of them as the workers join, refuse the worker whose digest differs from the job's, and
    the job does not form; the refused worker names the difference, the other is told."""
    j = job(
        ps=["--steps", "20", "--join-timeout", "10"],
        worker=["--model", "tests.torch_frozen_model:unseeded"],
    )
    assert j.wait(120) == [1, 1, 1]
    server = j.log("ps0").strip().splitlines()[-1]
    assert "did not join within 10 s (worker " in server, server
    assert "its frozen parameters differ from the job's (digest " in server
    assert "build them the same on every worker" in server
    logs = [j.log("w0"), j.log("w1")]
    refused = [text for text in logs if "refused this worker" in text]
    assert len(refused) == 1, logs
    assert "its model's frozen parameters (digest " in refused[0]
    assert any("gave up on the job before it formed" in text for text in logs)
