"""``make demo``: the main job. One parameter server and two workers on this machine train the
digits MLP over ``shm``, then the same run over ``grpc``; the two speeds are printed side by side.

Every process is a real daemon (``tensorwire-ps``, ``tensorwire-worker``) started with the same
flags an operator would type.
"""

from __future__ import annotations

import argparse
import sys

import tensorwire as tw
from tensorwire import extras
from tensorwire.checks import check_distinct
from tensorwire.job.argtypes import add_version
from tensorwire.job.config import at_least

from . import tasks
from .launch import JOB_PS_FLAGS, JOB_WORKER_FLAGS, daemon_flags, run_job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tensorwire demo",
        description="Train the digits MLP with one parameter server and two workers, over shm "
        "and then over grpc, and compare.",
    )
    add_version(parser)
    parser.add_argument(
        "--steps", type=at_least(1), default=300, help="training steps (default 300)"
    )
    parser.add_argument(
        "--workers", type=at_least(1), default=2, help="training workers (default 2)"
    )
    parser.add_argument(
        "--transports",
        default=None,
        help="comma-separated transports to train over, one job each (default shm,grpc; grpc "
        "only where the gRPC baseline is installed)",
    )
    parser.add_argument(
        "--model",
        default="digits",
        help="what the workers train (tensorwire-worker --model): digits, or a factory such as "
        "examples/torch_digits.py:make (default digits)",
    )
    parser.add_argument(
        "--ps-args",
        default="",
        help='extra flags for the servers, e.g. "--optimizer momentum --lr 0.05"',
    )
    parser.add_argument(
        "--worker-args",
        default="",
        help='extra flags for the workers, e.g. "--device cuda" (a PyTorch model on the GPU)',
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    # Refused here, not by the daemons once started: each job would start them to fail
    # (checked against the servers' own flags: one they lack failed each job's server, and
    # the demo said "ps0: (nothing in its log)" below the server's whole usage)
    ps_args, _ = daemon_flags(args.ps_args, "ps", parser.error, JOB_PS_FLAGS, "tensorwire demo")
    worker_args, _ = daemon_flags(
        args.worker_args, "worker", parser.error, JOB_WORKER_FLAGS, "tensorwire demo"
    )
    try:
        tasks.load_factory(args.model)
    except ValueError as exc:
        parser.error(str(exc))
    if not extras.installed(extras.PS):
        print(
            "error: the demo trains on scikit-learn's digits data set: "
            "pip install 'tensorwire[ps]'",
            file=sys.stderr,
        )
        return 1
    if args.transports is not None:
        transports = [t.strip() for t in args.transports.split(",") if t.strip()]
        bad = [t for t in transports if t not in tw.TRANSPORT_NAMES]
        if bad or not transports:
            parser.error(
                f"--transports: unknown {', '.join(bad) or '(none given)'}; from "
                f"{', '.join(tw.TRANSPORT_NAMES)}"
            )
        try:
            check_distinct("--transports", transports)  # before, shm,shm compared shm with shm
        except ValueError as exc:
            parser.error(str(exc))
    elif extras.installed(extras.GRPC):
        transports = ["shm", "grpc"]
    else:
        print(
            "(the gRPC baseline is not installed, so shm is not compared with it: "
            "pip install 'tensorwire[grpc]')",
            flush=True,
        )
        transports = ["shm"]
    results = []
    for transport in transports:
        print(
            f"training {args.model}: 1 server, {args.workers} workers, {args.steps} steps, "
            f"over {transport}",
            flush=True,
        )
        try:
            r = run_job(
                transport=transport,
                steps=args.steps,
                workers=args.workers,
                model=args.model,
                ps_args=ps_args,
                worker_args=worker_args,
                progress=not args.quiet,
            )
        except (RuntimeError, tw.TensorWireError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        results.append(r)
        print(f"  test accuracy {r.accuracy:.4f}, {r.steps_per_s:.1f} steps/s", flush=True)
    print(
        f"\n{'transport':<12}{'steps/s':>10}{'accuracy':>10}{'worker compute s':>18}"
        f"{'worker comm s':>15}"
    )
    for r in results:
        w = r.workers[0]
        print(
            f"{r.transport:<12}{r.steps_per_s:>10.1f}{r.accuracy:>10.4f}"
            f"{w['compute_s']:>18.2f}{w['communication_s']:>15.2f}"
        )
    if len(results) > 1:
        base = results[-1]
        for r in results[:-1]:
            print(
                f"\n{r.transport} ran {r.steps_per_s / base.steps_per_s:.1f}x the steps/s of "
                f"{base.transport}"
            )
    bad = [r.transport for r in results if r.accuracy < 0.95]
    if bad:
        print(f"accuracy below 95% over {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
