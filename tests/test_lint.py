"""The code is as the standards say: ruff-clean, formatted by ruff, and typed (mypy).

`make lint` ran these by hand only, and CI runs `make test` alone, so nothing stopped a change
that broke them from landing. Here each is a test of the suite, run by the versions `dev` pins
(a newer ruff or mypy may judge the same code otherwise, and CI installs afresh). mypy checks
for Python 3.10, the oldest `requires-python` admits (``python_version`` in pyproject.toml),
and a module it cannot find is an error outside a list of untyped and optional libraries: its
standard-library stubs know what each version has, so a use of what 3.10 lacks (``tomllib``,
``enum.StrEnum``, ``datetime.UTC``) fails here, on the 3.11 CI runs, where the suite would not
meet it. (What a library does differently on 3.10, as ConfigArgParse's ``--config`` reader did,
only a run on 3.10 shows.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: what mypy checks (`make lint`): the library and the three programs on its public API
TYPED = ["tensorwire", "server", "client", "bench"]


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_ruff_finds_nothing() -> None:
    done = _run("ruff", "check", "--no-cache", ".", timeout=120)
    assert done.returncode == 0, f"ruff check:\n{done.stdout}{done.stderr}"


def test_the_code_is_formatted() -> None:
    done = _run("ruff", "format", "--check", "--no-cache", ".", timeout=120)
    assert done.returncode == 0, (
        f"ruff format --check (run `ruff format .`):\n{done.stdout}{done.stderr}"
    )


@pytest.mark.timeout(600)
def test_mypy_finds_nothing() -> None:
    # (its cache is `make lint`'s, .mypy_cache: a fresh clone's first run checks everything)
    done = _run("mypy", *TYPED, timeout=540)
    assert done.returncode == 0, f"mypy:\n{done.stdout}{done.stderr}"
