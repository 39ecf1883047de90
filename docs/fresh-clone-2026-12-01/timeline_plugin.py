"""A pytest plugin that writes each test's start and end (epoch seconds) and id, one file per
pytest-xdist process, under $TIMELINE_DIR (default /tmp/tl): where a run's time went, and
whether its processes sat idle. Use: PYTHONPATH=docs/fresh-clone-2026-12-01 pytest -p
timeline_plugin ..."""

from __future__ import annotations

import os
import time

_start: dict[str, float] = {}


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _start[nodeid] = time.time()


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    folder = os.environ.get("TIMELINE_DIR", "/tmp/tl")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(folder, f"{worker}.txt"), "a") as f:
        f.write(f"{_start.get(nodeid, 0):.3f} {time.time():.3f} {nodeid}\n")
