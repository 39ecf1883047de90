"""What launching through Ray costs (issue 13): the time from the launch to a job's first step.

``python -m tensorwire.bench.ray_launch`` runs the same parameter-server job (digits, one server,
``--workers`` workers, ``--steps`` steps) alternately by hand (``tensorwire.client.launch``: the
daemons as subprocesses of this process, on loopback) and through ``tensorwire.ray.run_job`` on a
Ray cluster started here for the purpose (its own start-up is not counted: a cluster is started
once and runs many jobs). Setup = wall time - the server's training seconds: starting the
daemons, the workers joining, the model's specs and the first parameters, plus Ray's placement
group and actors. Medians over ``--repeat`` jobs each way.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from tensorwire.client.launch import run_job as run_by_hand
from tensorwire.job.files import output_file
from tensorwire.ray import RayJob
from tensorwire.ray import run_job as run_on_ray

from .common import machine_facts
from .report import write_json


def by_hand(steps: int, workers: int) -> dict[str, float]:
    start = time.monotonic()
    result = run_by_hand(transport="auto", steps=steps, workers=workers)
    wall = time.monotonic() - start
    training = max(s["seconds"] for s in result.servers)
    return {"wall": wall, "setup": wall - training, "accuracy": result.accuracy}


def on_ray(steps: int, workers: int) -> dict[str, float]:
    job = RayJob(
        workers=workers,
        ps_args=["--steps", str(steps), "--no-progress", "--log-level", "WARNING"],
        worker_args=["--no-progress", "--log-level", "WARNING"],
        placement="pack",  # one machine here: the same placement as by hand
    )
    result = run_on_ray(job, log=lambda _message: None)
    return {
        "wall": result.wall_seconds,
        "setup": result.setup_seconds,
        "accuracy": float(result.workers[0]["test_accuracy"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensorwire.bench.ray_launch", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default=None, metavar="PATH", type=output_file)
    args = parser.parse_args(argv)
    import ray

    ray.init(num_cpus=args.workers + 1, include_dashboard=False, log_to_driver=False)
    try:
        runs: dict[str, list[dict[str, float]]] = {"by hand": [], "ray": []}
        for _ in range(args.repeat):  # alternately: drifts of the machine hit both alike
            runs["by hand"].append(by_hand(args.steps, args.workers))
            runs["ray"].append(on_ray(args.steps, args.workers))
    finally:
        ray.shutdown()
    table: dict[str, Any] = {}
    print("| launch | setup s (median) | wall s (median) | test accuracy |")
    print("|---:|---:|---:|---:|")
    for how, rows in runs.items():
        setup = statistics.median(r["setup"] for r in rows)
        wall = statistics.median(r["wall"] for r in rows)
        accuracy = statistics.median(r["accuracy"] for r in rows)
        table[how] = {"setup_s": setup, "wall_s": wall, "accuracy": accuracy, "runs": rows}
        print(f"| {how} | {setup:.2f} | {wall:.2f} | {accuracy:.4f} |")
    extra = table["ray"]["setup_s"] - table["by hand"]["setup_s"]
    print(f"\nRay adds {extra:.2f} s before the first step ({args.repeat} jobs each way)")
    if args.json:
        write_json(args.json, {"machine": machine_facts(), "args": vars(args), "results": table})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
