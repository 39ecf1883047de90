"""A pytest plugin that records each test's wall time and CPU time (the pytest process's own and
that of the children it reaped: the daemons and tools a test starts), one JSON file per
pytest-xdist worker, in ``$CPUPROF_DIR`` (default /tmp). Not part of the suite: how
cpu-profile-08adc30.txt was made (``-p cpuprof`` with this folder on PYTHONPATH)."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from typing import Any

import pytest

_rows: list[tuple[str, float, float, float]] = []


def _cpu() -> tuple[float, float]:
    """CPU seconds so far: this process's, and its reaped children's."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    own0, children0 = _cpu()
    began = time.monotonic()
    yield
    own1, children1 = _cpu()
    wall = time.monotonic() - began
    _rows.append(
        (item.nodeid, round(wall, 2), round(own1 - own0, 2), round(children1 - children0, 2))
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder = os.environ.get("CPUPROF_DIR", "/tmp")
    with open(os.path.join(folder, f"cpu-{worker}.json"), "w") as f:
        json.dump(_rows, f)
