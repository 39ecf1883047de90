"""How long `tensorwire ping` takes, start to exit, against a live receiver: the cost of the
health check the compose file runs every 2 s and the Kubernetes readiness probe runs.

    python -m tensorwire.bench.startup --runs 10 --json docs/ping-startup.json

``--pythonpath DIR`` runs the ping of another checkout (an older commit's tree) with the same
interpreter and receiver, for a before-and-after in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import tensorwire as tw
from tensorwire.job.argtypes import at_least
from tensorwire.job.files import output_file

from .common import machine_facts
from .report import write_json


def ping_seconds(address: str, runs: int, pythonpath: str | None) -> list[float]:
    """Wall seconds of ``runs`` pings of ``address``, each a fresh interpreter."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "tensorwire", "ping", address],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        out.append(time.perf_counter() - t0)
        if done.returncode != 0:
            raise SystemExit(f"tensorwire ping failed: {done.stderr.strip()}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=at_least(1), default=10, help="pings (default 10)")
    parser.add_argument(
        "--pythonpath", metavar="DIR", help="also time the ping of the checkout in DIR"
    )
    parser.add_argument("--json", metavar="PATH", type=output_file, help="write the results")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tw.Receiver() as rx:
        trees = [("this checkout", None)]
        if args.pythonpath:
            trees.append((args.pythonpath, args.pythonpath))
        for label, path in trees:
            seconds = ping_seconds(rx.address, args.runs, path)
            rows.append({"tree": label, "seconds": seconds, "median": statistics.median(seconds)})
            print(f"{label}: median {statistics.median(seconds):.3f} s over {args.runs} pings")
    if args.json:
        result = {"kind": "ping-startup", "machine": machine_facts(), "rows": rows}
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
