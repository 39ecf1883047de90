"""The command-line entry points run end to end: demo, transfer benchmark, info, bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import NIXL_INSTALLED, free_port


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


def _check_result(result: dict[str, Any], sizes: list[int], transports: list[str]) -> None:
    assert result["schema"] == "tensorwire.bench/1"
    machine = result["machine"]
    assert machine["cpu_count"] >= 1 and machine["python"] and machine["versions"]["tensorwire"]
    rows = {(r["method"], r["size"]): r for r in result["throughput"]}
    methods = {"memcpy", "zmq", "raw-tcp", *transports}
    for size in sizes:
        assert {m for m, s in rows if s == size} == methods
        for method in methods:
            row = rows[(method, size)]
            assert row["gbps"] > 0 and len(row["samples"]) == result["config"]["repeat"]
            for ref in ("grpc", "grpc-stream", "memcpy"):
                key = "x_" + ref.replace("-", "_")
                if (ref, size) not in rows:  # not measured in this run
                    assert row[key] is None
                    continue
                assert row[key] == pytest.approx(row["gbps"] / rows[(ref, size)]["gbps"])
    lat = {r["method"]: r for r in result["latency"]}
    assert set(lat) == {*transports, "zmq"}
    for r in lat.values():
        assert 0 < r["median_us"] <= r["p99_us"]
        assert r["lower_than_grpc"] == pytest.approx(lat["grpc"]["median_us"] / r["median_us"])
        if "grpc-stream" in lat:
            stream = lat["grpc-stream"]["median_us"] / r["median_us"]
            assert r["lower_than_grpc_stream"] == pytest.approx(stream)


def test_bench_runs_end_to_end_with_json_and_plot(tmp_path: Path) -> None:
    path, png, md = tmp_path / "bench.json", tmp_path / "bench.png", tmp_path / "bench.md"
    small = ["--sizes", "4K,64K", "--repeat", "1", "--round-trips", "20", "--no-progress"]
    out = run(
        "-m",
        "tensorwire.bench",
        *small,
        "--json",
        str(path),
        "--plot",
        str(png),
        "--markdown",
        str(md),
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(path.read_text())
    measured = ["shm", "tcp", "nixl", "grpc", "grpc-stream"]
    if not NIXL_INSTALLED:  # the default run measures what is installed
        measured.remove("nixl")
    _check_result(result, [4096, 65536], measured)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "vs grpc" in out.stdout and "median us" in out.stdout
    table = md.read_text()
    assert table.startswith("| size | method | GB/s | vs grpc | vs grpc-stream |")
    assert "| 64 KiB | grpc-stream |" in table and "| grpc-stream / this |" in table


def test_bench_serve_and_run_as_two_hosts_would(tmp_path: Path) -> None:
    """`bench serve` on one end, `bench run --connect` on the other (here both on loopback)."""
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorwire.bench",
            "serve",
            "--bind",
            f"tcp://127.0.0.1:{port}",
            "--once",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert "serving on" in server.stdout.readline()
        path = tmp_path / "run.json"
        out = run(
            "-m",
            "tensorwire.bench",
            "run",
            "--connect",
            f"tcp://127.0.0.1:{port}",
            "--sizes",
            "64K",
            "--repeat",
            "1",
            "--round-trips",
            "10",
            "--transports",
            "tcp,grpc",
            "--json",
            str(path),
            "--no-progress",
        )
        assert out.returncode == 0, out.stderr
        _check_result(json.loads(path.read_text()), [65536], ["tcp", "grpc"])
        assert server.wait(30) == 0  # --once: it leaves after the runner's goodbye
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        for stream in (server.stdout, server.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "tensorwire.bench", "--sizes", "12Q"],
        ["-m", "tensorwire.bench", "--transports", "carrier-pigeon"],
        ["-m", "tensorwire.bench", "--repeat", "0"],
        ["-m", "tensorwire.bench", "run"],
        ["-m", "tensorwire.bench", "--bogus"],
        ["-m", "tensorwire.bench", "serve", "--bind", "tcp://0.0.0.0:5999"],
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
    assert "transports: shm, tcp, nixl, grpc, grpc-stream" in out.stdout
    assert "shared memory" in out.stdout
    # make test installs NIXL: info names its version and the UCX transports it can open
    assert "nixl: nixl_cu12 1.5.1" in out.stdout
    ucx = next(line for line in out.stdout.splitlines() if line.startswith("ucx: "))
    assert "tcp/lo" in ucx and "cma/memory" in ucx


def test_polling_probe_reports_its_figures() -> None:
    out = run("-m", "tensorwire.bench.polling", "--count", "10", "--idle", "0.1", "--gap", "0.002")
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("nixl (tensorwire polling), 4 KiB every 2 ms: one way median ")
    assert "write() median" in line and line.endswith("% of a core")
