"""``tensorwire bench ps``: whole data-parallel training jobs, one per transport, side by side.

Each job is real daemons on this machine (S servers, N workers) training the chosen model for a
fixed number of steps. Reported per transport: steps/s (at the slowest server), time per step
split into the workers' compute and communication (waiting for parameters and pushing
gradients), the server's writes of a step's parameters to the workers (bsp), bytes moved per
step (every worker's gradients up and parameters down), the communication per tensor (a
worker's communication time per step over the number of tensors: what each tensor of the model
costs a step), and the seconds the job took to form (from the servers' start until every worker
had joined and was ready at every server: the workers' own start-up included).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import tensorwire as tw
from tensorwire.client import tasks
from tensorwire.client.launch import JOB_PS_FLAGS, JOB_WORKER_FLAGS, daemon_flags, run_job
from tensorwire.job.config import at_least
from tensorwire.job.files import output_file

from . import ddp
from .common import machine_facts, parse_transports
from .report import SCHEMA

DEFAULT_TRANSPORTS = "shm,tcp,grpc"
#: the flags a run's JSON repeats under "config"
CONFIG_KEYS = (
    "workers",
    "servers",
    "model",
    "framework",
    "steps",
    "sync",
    "repeat",
    "batch",
    "ps_args",
    "worker_args",
    "ddp",
)
#: the row of PyTorch's DistributedDataParallel over gloo (--ddp)
DDP_ROW = "ddp-gloo"
#: the workers' flags this command sets for each job, besides run_job's
OWN_WORKER_FLAGS = ("--batch", "--eval-every", "--framework")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("ps", help="whole parameter-server training jobs, one per transport")
    p.add_argument("--workers", type=at_least(1), default=2, help="workers per job (default 2)")
    p.add_argument("--servers", type=at_least(1), default=1, help="servers per job (default 1)")
    p.add_argument(
        "--transports",
        default=DEFAULT_TRANSPORTS,
        help=f"comma-separated (default {DEFAULT_TRANSPORTS})",
    )
    p.add_argument(
        "--model",
        default="large",
        help="what the workers train: large, many (200 small tensors), digits, or a factory "
        "(package.module:factory, "
        "path/to/file.py:factory, e.g. examples/torch_digits.py:make for a PyTorch CNN); "
        "default large",
    )
    p.add_argument(
        "--framework",
        choices=tasks.FRAMEWORKS,
        default="auto",
        help="the workers' --framework: torch trains a built-in model as a PyTorch module "
        "(default auto: what --model builds)",
    )
    p.add_argument("--steps", type=at_least(1), default=30, help="steps per job (default 30)")
    p.add_argument(
        "--sync",
        default="bsp",
        choices=("bsp", "asp", "ssp"),
        help="the servers' consistency model (default bsp)",
    )
    p.add_argument(
        "--repeat",
        type=at_least(1),
        default=1,
        help="jobs per transport; medians reported (default 1)",
    )
    p.add_argument("--batch", type=at_least(1), default=32, help="batch per worker (default 32)")
    p.add_argument(
        "--ps-args",
        default="",
        help='more flags for the servers, e.g. "--optimizer adamw --lr 0.01" (the update\'s cost '
        "is in each step); --sync, --steps, --workers and --transport are this command's own",
    )
    p.add_argument(
        "--worker-args",
        default="",
        help='more flags for the workers, e.g. "--device cuda" (a PyTorch model on the GPU); '
        "--batch and --framework are this command's own, as are the job's --transport, "
        "--workers and --model",
    )
    p.add_argument(
        "--ddp",
        action="store_true",
        help="also train the model with PyTorch's DistributedDataParallel over gloo (row "
        f"'{DDP_ROW}'): as many processes as --workers, the servers' optimizer, learning rate "
        "and weight decay as a torch optimizer, what a bsp job computes; needs a PyTorch model "
        "(--framework torch, or a factory of a torch module) on the CPU",
    )
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the results as JSON")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    try:
        transports = parse_transports(args.transports)
    except ValueError as exc:
        parser.error(f"--transports: {exc}")
    extra, _ = daemon_flags(
        args.ps_args, "ps", parser.error, (*JOB_PS_FLAGS, "--sync"), "tensorwire bench ps"
    )
    worker_extra, _ = daemon_flags(
        args.worker_args,
        "worker",
        parser.error,
        (*JOB_WORKER_FLAGS, *OWN_WORKER_FLAGS),
        "tensorwire bench ps",
    )
    try:
        factory = tasks.load_factory(args.model, args.framework)
        made = tasks.as_task(tasks.build(factory, args.model, tasks.JobInfo(0, 1, args.batch, 0)))
        tasks.check_framework(made, args.framework)
    except (ValueError, TypeError, tw.MissingDependencyError) as exc:  # TypeError: its return
        parser.error(str(exc))
    initial = made.initial_params()
    param_bytes = sum(a.nbytes for a in initial.values())
    job = _ddp_job(args, parser, made, extra, worker_extra) if args.ddp else None
    rows = []
    samples: dict[str, list[Any]] = {t: [] for t in transports}
    ddp_runs: list[dict[str, Any]] = []
    for _ in range(args.repeat):
        for t in transports:  # interleaved: drift hits every transport alike
            samples[t].append(
                run_job(
                    transport=t,
                    steps=args.steps,
                    workers=args.workers,
                    servers=args.servers,
                    model=args.model,
                    ps_args=["--sync", args.sync, *extra],
                    worker_args=[
                        *("--batch", str(args.batch), "--eval-every", "0"),
                        *("--framework", args.framework),
                        *worker_extra,
                    ],
                )
            )
        if job is not None:
            try:
                ddp_runs.append(ddp.run(job))
            except RuntimeError as exc:
                raise tw.TensorWireError(f"--ddp: {exc}") from None
    for t in transports:
        jobs = samples[t]
        sps = statistics.median(j.steps_per_s for j in jobs)
        compute = statistics.median(
            statistics.mean(w["compute_s"] / w["steps"] for w in j.workers) for j in jobs
        )
        comm = statistics.median(
            statistics.mean(w["communication_s"] / w["steps"] for w in j.workers) for j in jobs
        )
        # The job formed once its last server did: from the servers' start, so the workers'
        # own start-up (their imports, on a shared machine) is in it too.
        formed = [max(s["formed_s"] for s in j.servers) for j in jobs]
        # (bsp) a step's writes of parameters to the workers, at the slowest server
        serves = [max(s.get("serve_s") or 0.0 for s in j.servers) for j in jobs]
        rows.append(
            {
                "transport": t,
                "steps_per_s": sps,
                "formed_s": statistics.median(formed),
                "serve_ms": statistics.median(serves) * 1000 if any(serves) else None,
                "step_ms": 1000 / sps,
                "compute_ms": compute * 1000,
                "communication_ms": comm * 1000,
                "bytes_per_step": 2 * param_bytes * args.workers,
                # a worker's communication per step, spread over the tensors it pushes and pulls
                "communication_us_per_tensor": comm * 1e6 / len(initial),
                "samples_steps_per_s": [j.steps_per_s for j in jobs],
                # where the workers trained (their --device): cpu, or cuda:N
                "worker_device": jobs[0].workers[0].get("device", "cpu"),
            }
        )
    if ddp_runs:
        sps = statistics.median(r["steps_per_s"] for r in ddp_runs)
        rows.append(
            {
                "transport": DDP_ROW,
                "steps_per_s": sps,
                "formed_s": statistics.median(r["formed_s"] for r in ddp_runs),
                "serve_ms": None,
                "step_ms": 1000 / sps,
                # DDP overlaps its all-reduce with the backward pass: no split to report
                "compute_ms": None,
                "communication_ms": None,
                "bytes_per_step": None,
                "samples_steps_per_s": [r["steps_per_s"] for r in ddp_runs],
                "worker_device": "cpu",
                "accuracy": [r["accuracy"] for r in ddp_runs],
            }
        )
    for ref in ("grpc", "grpc-stream", DDP_ROW):  # the baselines, when they ran
        base = next((r for r in rows if r["transport"] == ref), None)
        for r in rows:
            key = "x_ddp" if ref == DDP_ROW else "x_" + ref.replace("-", "_")
            r[key] = r["steps_per_s"] / base["steps_per_s"] if base else None
    return {
        "schema": SCHEMA,
        "kind": "ps",
        "machine": machine_facts(),
        "config": {k: getattr(args, k) for k in CONFIG_KEYS},
        "param_bytes": param_bytes,
        "tensors": len(initial),
        "rows": rows,
    }


def _ddp(result: dict[str, Any]) -> bool:
    return any(r["transport"] == DDP_ROW for r in result["rows"])


def render(result: dict[str, Any]) -> str:
    head = ["transport", "steps/s", "vs grpc", "vs stream", *["vs ddp"] * _ddp(result)]
    head += ["step ms", "compute ms", "comm ms", "serve ms", "MB/step", "us/tensor", "formed s"]
    lines = [" ".join(f"{h:>11}" for h in head)]
    for r in result["rows"]:
        ratios = [r.get(k) for k in ("x_grpc", "x_grpc_stream", *["x_ddp"] * _ddp(result))]
        cells = [
            r["transport"],
            f"{r['steps_per_s']:.2f}",
            *("" if x is None else f"{x:.2f}x" for x in ratios),
            f"{r['step_ms']:.1f}",
            *(
                "" if r.get(k) is None else f"{r[k]:.1f}"
                for k in ("compute_ms", "communication_ms")
            ),
            f"{r['serve_ms']:.2f}" if r.get("serve_ms") is not None else "",
            f"{r['bytes_per_step'] / 1e6:.3g}" if r.get("bytes_per_step") is not None else "",
            f"{r['communication_us_per_tensor']:.0f}"
            if r.get("communication_us_per_tensor") is not None
            else "",
            f"{r['formed_s']:.1f}" if r.get("formed_s") is not None else "",
        ]
        lines.append(" ".join(f"{c:>11}" for c in cells))
    cfg = result["config"]
    lines.append(
        f"model {cfg['model']}"
        + (f" in {cfg['framework']}" if cfg.get("framework", "auto") != "auto" else "")
        + f" ({result.get('tensors', '?')} tensors, "
        f"{result['param_bytes'] / 1e6:.3g} MB of parameters), "
        f"{cfg['workers']} workers, {cfg['servers']} server(s), {cfg['steps']} steps"
        + (f", servers with {cfg['ps_args']}" if cfg.get("ps_args") else "")
        + (f", workers with {cfg['worker_args']}" if cfg.get("worker_args") else "")
    )
    return "\n".join(lines)


def _ddp_job(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    made: Any,
    ps_extra: list[str],
    worker_extra: list[str],
) -> ddp.DdpJob:
    """The DDP job of ``--ddp`` (one line on the parser where it cannot be run)."""
    if getattr(made, "framework", None) != "torch":
        parser.error(
            f"--ddp trains a PyTorch module: --model {args.model} builds a "
            f"{getattr(made, 'framework', 'non-torch')} model (--framework torch trains a "
            "built-in model as one)"
        )
    from tensorwire.client import worker

    # where the workers train, as their own parser reads it (TENSORWIRE_DEVICE included)
    if worker.build_parser().parse_known_args(worker_extra)[0].device != "cpu":
        parser.error("--ddp runs its workers on the CPU (gloo): leave --device out")
    if args.sync != "bsp":
        parser.error(f"--ddp computes what a bsp job computes: --sync {args.sync} is not that")
    optimizer, lr, weight_decay, momentum = ddp.optimizer_of(ps_extra)
    return ddp.DdpJob(
        model=args.model,
        framework=args.framework,
        workers=args.workers,
        batch=args.batch,
        steps=args.steps,
        optimizer=optimizer,
        lr=lr,
        weight_decay=weight_decay,
        momentum=momentum,
    )
