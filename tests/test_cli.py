"""The command-line entry points run end to end: demo, transfer benchmark, info, bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_demo_moves_tensors_byte_exact() -> None:
    out = run("-m", "tensorwire.demo", "--steps", "3")
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(("shm", "tcp"))]
    assert len(lines) == 2 and all(ln.endswith("byte-exact") for ln in lines)
    assert all(int(ln.split()[1]) == 12 for ln in lines)  # 3 steps x 4 tensors


def test_transfer_bench_emits_consistent_json(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    out = run(
        "-m",
        "tensorwire.bench.transfer",
        "--sizes",
        "64K,1M",
        "--repeat",
        "1",
        "--round-trips",
        "20",
        "--json",
        str(path),
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(path.read_text())
    assert result["schema"] == "tensorwire.bench.transfer/1"
    rows = {(r["method"], r["size"]): r for r in result["throughput"]}
    for size in (64 << 10, 1 << 20):
        assert {m for m, s in rows if s == size} == {"memcpy", "shm", "tcp", "raw-tcp"}
        for method in ("shm", "tcp"):
            row = rows[(method, size)]
            limit = rows[(row["limit"], size)]
            assert row["gbps"] > 0
            assert row["ratio_to_limit"] == pytest.approx(row["gbps"] / limit["gbps"])
    assert set(result["latency"]) == {"shm", "tcp"}
    assert all(lat["median_us"] > 0 and lat["n"] == 20 for lat in result["latency"].values())
    assert "memcpy" in out.stdout and "round trip" in out.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "tensorwire.bench.transfer", "--sizes", "12Q"],
        ["-m", "tensorwire.bench.transfer", "--transports", "carrier-pigeon"],
        ["-m", "tensorwire.bench.transfer", "--repeat", "0"],
        ["-m", "tensorwire.cli", "nope"],
        ["-m", "tensorwire.demo", "--steps", "0"],
    ],
)
def test_bad_arguments_are_one_clear_line(args: list[str]) -> None:
    out = run(*args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].split(": ")[1] == "error"


def test_info_reports_the_installation() -> None:
    out = run("-m", "tensorwire.cli", "info")
    assert out.returncode == 0
    assert "transports: shm, tcp" in out.stdout and "shared memory" in out.stdout
