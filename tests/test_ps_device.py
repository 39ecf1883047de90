"""A parameter-server shard on a GPU (``tensorwire-ps --device cuda``): real daemons on loopback.

The first test runs everywhere: a device the server cannot use stops it in one line. The others
are marked ``gpu`` and need a CUDA device (``make test-gpu``); elsewhere they are skipped with the
reason. There, the shard's parameters, gradient slots and optimizer state are cupy arrays, and a
job must compute what one process computes on the union of the workers' batches.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorwire import cuda
from tensorwire.server import optim

from .jobs import assert_params_close, cli, digits_bsp_job, digits_reference, ok

NO_GPU = "no CUDA device here (cupy and a GPU are needed: `make test-gpu` on a GPU machine)"


def _gpu(test: Any) -> Any:
    """Mark a test ``gpu`` and skip it, with the reason, where there is no CUDA device."""
    return pytest.mark.gpu(pytest.mark.skipif(not cuda.available(), reason=NO_GPU)(test))


@pytest.mark.parametrize(
    ("args", "says", "needs_cupy"),
    [
        (["--device", "cuda:99"], "cuda:99 was asked for, but this host has", True),
        (
            ["--device", "cuda", "--wire-dtype", "bfloat16"],
            "a server on cuda takes float32 on the wire, not bfloat16",
            False,
        ),
    ],
)
def test_a_device_the_server_cannot_use_is_one_line(
    args: list[str], says: str, needs_cupy: bool
) -> None:
    """Checked before the server binds or waits for anyone (without cupy, a check that needs
    it says how to install it instead; one of the flags alone does not). A device that is no
    device's name (tpu) is refused by the parser (test_cli.py,
    test_heartbeats_timeouts_and_counts_out_of_range_are_refused_in_one_line)."""
    out = cli("-m", "tensorwire.server.daemon", "--no-progress", *args)
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    if needs_cupy and importlib.util.find_spec("cupy") is None:
        assert "pip install 'tensorwire[gpu]'" in last
    else:
        assert says in last, out.stderr


@_gpu
@pytest.mark.parametrize(
    ("optimizer", "transport"), [("adam", "shm"), ("momentum", "tcp"), ("sgd", "nixl")]
)
def test_bsp_with_the_server_on_a_gpu_equals_one_process(
    job: Any, optimizer: str, transport: str
) -> None:
    """CPU workers write their gradients into the servers' GPU slots (a host-to-device crossing
    on every transport), the update runs in cupy, the parameters leave from GPU memory, over
    tcp and nixl from several threads at once (--serve-threads); two servers, a weight matrix
    split across them."""
    steps, lr = 25, 0.05
    common = ["--transport", transport]
    serving = {"tcp": ["--serve-threads", "2"], "nixl": ["--serve-threads", "0"]}
    j = digits_bsp_job(
        job,
        servers=2,
        optimizer=optimizer,
        lr=lr,
        steps=steps,
        ps=[*common, "--device", "cuda", *serving.get(transport, [])],
        worker=common,
    )
    ok(j)
    ref = digits_reference(steps, 2, 32, optim.make(optimizer, lr))
    for rank in (0, 1):
        got = j.params(rank)
        assert list(got) == list(ref)
        assert_params_close(got, ref, 1e-5)


@_gpu
@pytest.mark.parametrize("sync", ["bsp", "asp"])
def test_a_gpu_server_steps_what_pytorch_steps_under_adamw_with_unused_parameters(
    job: Any, sync: str
) -> None:
    """A server on the GPU (cupy) with AdamW and weight decay, two CPU workers of a model one
    of whose layers no step uses and another some steps use: under bsp the job equals one
    process stepped by ``torch.optim.AdamW``; under asp (whose zeros that land before their
    step's meta wait for it, ``view.any()`` on GPU memory) the unused layer ends bit for bit as
    it started."""
    pytest.importorskip("torch")
    from .torch_grads_model import module, reference

    steps, lr, decay = 20, 0.01, 0.1
    j = job(
        ps=[
            *("--device", "cuda", "--sync", sync, "--steps", str(steps), "--optimizer", "adamw"),
            *("--lr", str(lr), "--weight-decay", str(decay), "--split-bytes", "1024"),
        ],
        worker=["--model", "tests.torch_grads_model:make"],
    )
    ok(j)
    start = {n: p.detach().numpy() for n, p in module().named_parameters()}
    want = reference(steps, 2, 32, lr, 0.9, decay, optimizer="adamw") if sync == "bsp" else None
    for rank in (0, 1):
        got = j.params(rank)
        for name in ("spare.weight", "spare.bias"):
            np.testing.assert_array_equal(got[name], start[name])
        if want is not None:
            assert_params_close(got, want, 1e-5)


@_gpu
@pytest.mark.parametrize("shards", [1, 2])
def test_a_gpu_server_clips_and_follows_a_schedule_as_pytorch_does(job: Any, shards: int) -> None:
    """``--clip-grad-norm`` (the global norm on the GPU: ``xp.vdot`` in cupy) and ``--lr-schedule
    cosine --warmup-steps`` on a server on the GPU: a BSP job of two CPU workers equals one
    process that clips its mean gradient with ``clip_grad_norm_`` and follows ``LambdaLR`` of
    Hugging Face's formula before each momentum step. Over two shards on the GPU, each
    server's squared norm (one synchronisation) goes to the workers, which add them up."""
    pytest.importorskip("torch")
    from .torch_grads_model import reference, schedule_factor

    steps, warmup, lr, decay, limit = 20, 5, 0.05, 0.1, 0.5
    j = job(
        servers=shards,
        ps=[
            *("--device", "cuda", "--steps", str(steps), "--optimizer", "momentum"),
            *("--lr", str(lr), "--weight-decay", str(decay), "--clip-grad-norm", str(limit)),
            *("--lr-schedule", "cosine", "--warmup-steps", str(warmup)),
            # (two shards: small parameters alone, so that both hold some)
            *(["--pack-bytes", "0"] if shards > 1 else []),
        ],
        worker=["--model", "tests.torch_grads_model:make"],
    )
    ok(j)
    factor = schedule_factor("cosine", steps, warmup)
    want = reference(steps, 2, 32, lr, 0.9, decay, schedule=factor, clip=limit)
    for rank in (0, 1):
        assert_params_close(j.params(rank), want, 1e-5)
    clipped = [j.metrics(f"ps{s}")["clipped_steps"] for s in range(shards)]
    assert 0 < clipped[0] <= steps and clipped == [clipped[0]] * shards, clipped


@_gpu
def test_a_gpu_server_checkpoints_to_host_and_resumes_on_the_gpu(job: Any, tmp_path: Path) -> None:
    """Adam's moments go to the checkpoint from GPU memory and come back into it; the resumed
    job ends where one straight job on the CPU ends."""
    ckpt = tmp_path / "ckpt"
    common = ["--optimizer", "adam", "--lr", "0.01"]
    gpu = [*common, "--device", "cuda", "--checkpoint-dir", str(ckpt)]
    first = job(ps=[*gpu, "--steps", "10", "--checkpoint-every", "5"])
    ok(first)
    with np.load(ckpt / "ps-shard0.npz") as saved:
        assert any(name.endswith(":m") for name in saved.files)  # host arrays, readable here
    resumed = job(ps=[*gpu, "--steps", "20", "--resume"])
    ok(resumed)
    assert "at step 10" in resumed.log("ps0")
    straight = job(ps=[*common, "--steps", "20"])
    ok(straight)
    got, want = resumed.params(0), straight.params(0)
    assert list(got) == list(want)
    assert_params_close(got, want, 1e-5)
