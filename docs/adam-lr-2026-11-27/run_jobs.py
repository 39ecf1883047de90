"""Run one parameter-server job (tests/jobs.py's real daemons on loopback) N times; print each
run's rank-0 test accuracy as a JSON line. Run from the repository root:

    W=3 python docs/adam-lr-2026-11-27/run_jobs.py SYNC OPTIMIZER N STEPS [PS FLAGS...]

``W``: workers (default 3); ``WA``: extra worker flags (e.g. ``"--transport tcp"``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
from tests.jobs import Job, ok  # (the repository root is on the path first)


def main() -> None:
    sync, optimizer, runs, steps, *extra = sys.argv[1:]
    workers = int(os.environ.get("W", "3"))
    worker_flags = os.environ.get("WA", "").split()
    for _ in range(int(runs)):
        where = Path(tempfile.mkdtemp(prefix="acc"))
        began = time.monotonic()
        job = Job(
            where,
            ps=["--sync", sync, "--steps", steps, "--optimizer", optimizer, *extra],
            workers=workers,
            worker=worker_flags,
        )
        try:
            ok(job)
            accuracy = job.metrics("w0")["test_accuracy"]
        finally:
            job.kill()
        line = {"sync": sync, "opt": optimizer, "steps": steps, "extra": extra, "acc": accuracy}
        print(json.dumps({**line, "s": round(time.monotonic() - began, 1)}), flush=True)


if __name__ == "__main__":
    main()
