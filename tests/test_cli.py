"""The command-line entry points run end to end: demo, transfer benchmark, info, bad arguments."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorwire.cli import COMMANDS

from .conftest import (
    NIXL_INSTALLED,
    as_nobody,
    free_port,
    freeze,
    needs_ipv6,
    needs_pid_namespaces,
)
from .jobs import Processes, log_has

PY = sys.executable
#: torch, which --gloo measures and a torch factory needs (`make test-pythons`' venvs lack it)
TORCH_INSTALLED = importlib.util.find_spec("torch") is not None


def run(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_demo_moves_tensors_byte_exact() -> None:
    out = run("-m", "tensorwire.demo", "--steps", "3")
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(("shm", "tcp"))]
    assert len(lines) == 2 and all(ln.endswith("byte-exact") for ln in lines)
    assert all(int(ln.split()[1]) == 12 for ln in lines)  # 3 steps x 4 tensors


def _check_result(
    result: dict[str, Any],
    sizes: list[int],
    transports: list[str],
    batch: int = 0,
    copy_threads: int = 1,
    gloo: bool = False,
) -> None:
    assert result["schema"] == "tensorwire.bench/1"
    assert result["config"]["batch"] == batch
    assert result["config"]["copy_threads"] == copy_threads
    # what the environment changes in a GPU run (GPU-made completion stores, MPS): not in this one
    assert result["config"]["gpu_stream_stores"] is None and result["config"]["mps"] is None
    machine = result["machine"]
    assert machine["cpu_count"] >= 1 and machine["python"] and machine["versions"]["tensorwire"]
    rows = {(r["method"], r["size"]): r for r in result["throughput"]}
    # NIXL driven by hand is measured beside the nixl transport: its limit
    raw_nixl = ["raw-nixl"] if "nixl" in transports else []
    # --batch N: each transport also writing N tensors per write_many, against its own limit
    batched = {f"{t} x{batch}": t for t in transports} if batch else {}
    for method, transport in batched.items():
        assert rows[(method, sizes[0])]["limit"] == rows[(transport, sizes[0])]["limit"]
    # --copy-threads N: the reference copy in N parts at once
    split = [f"memcpy {copy_threads} threads"] if copy_threads > 1 else []
    # --gloo: torch.distributed's send and recv, each waited for and pipelined
    torch_ways = ["gloo", "gloo-isend"] if gloo else []
    methods = {"memcpy", "zmq", "raw-tcp", *transports, *raw_nixl, *batched, *split, *torch_ways}
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
        fastest_gloo = max((rows[(g, size)]["gbps"] for g in torch_ways), default=None)
        for method in methods:  # 'vs gloo': against the faster of its two ways
            want = rows[(method, size)]["gbps"] / fastest_gloo if fastest_gloo else None
            assert rows[(method, size)]["x_gloo"] == (want and pytest.approx(want))
        if raw_nixl:
            nixl, raw = rows[("nixl", size)], rows[("raw-nixl", size)]
            assert nixl["limit"] == "raw-nixl"
            assert nixl["x_limit"] == pytest.approx(nixl["gbps"] / raw["gbps"])
    lat = {r["method"]: r for r in result["latency"]}
    assert set(lat) == {*transports, "zmq", "raw-tcp", *raw_nixl, *torch_ways[:1]}
    limits = {"tcp": "raw-tcp", "nixl": "raw-nixl"}  # each transport's raw round trip
    for method, r in lat.items():
        limit = limits.get(method) if limits.get(method) in lat else None
        assert r["limit"] == limit
        if limit is not None:
            assert r["x_limit"] == pytest.approx(r["median_us"] / lat[limit]["median_us"])
        assert 0 < r["median_us"] <= r["p99_us"]
        assert r["lower_than_grpc"] == pytest.approx(lat["grpc"]["median_us"] / r["median_us"])
        if "grpc-stream" in lat:
            stream = lat["grpc-stream"]["median_us"] / r["median_us"]
            assert r["lower_than_grpc_stream"] == pytest.approx(stream)
        if gloo:
            assert r["lower_than_gloo"] == pytest.approx(lat["gloo"]["median_us"] / r["median_us"])
        else:
            assert r["lower_than_gloo"] is None


def test_bench_runs_end_to_end_with_json_and_plot(tmp_path: Path) -> None:
    path, png, md = tmp_path / "bench.json", tmp_path / "bench.png", tmp_path / "bench.md"
    small = ["--sizes", "4K,64K", "--repeat", "1", "--round-trips", "20", "--no-progress"]
    small += ["--batch", "3", "--messages", "200"]
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
    _check_result(result, [4096, 65536], measured, batch=3)
    assert result["config"]["messages"] == 200
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "vs grpc" in out.stdout and "median us" in out.stdout
    table = md.read_text()
    assert table.startswith("| size | method | GB/s | vs grpc | vs grpc-stream |")
    assert "| 64 KiB | grpc-stream |" in table and "| grpc-stream / this |" in table
    assert "| 4 KiB | tcp x3 |" in table


@pytest.mark.parametrize("host", ["127.0.0.1", pytest.param("[::1]", marks=needs_ipv6)])
def test_bench_serve_and_run_as_two_hosts_would(tmp_path: Path, host: str) -> None:
    """`bench serve` on one end, `bench run --connect` on the other (here both on loopback,
    over IPv4 and over IPv6), with torch.distributed's gloo measured between them (--gloo: a
    process group of the two, its store at the runner's end) and its columns in the tables."""
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorwire.bench",
            "serve",
            "--bind",
            f"tcp://{host}:{port}",
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
            f"tcp://{host}:{port}",
            "--sizes",
            "64K",
            "--repeat",
            "1",
            "--round-trips",
            "10",
            "--transports",
            "tcp,grpc",
            "--copy-threads",
            "2",
            "--gloo",
            "--json",
            str(path),
            "--markdown",
            str(tmp_path / "run.md"),
            "--no-progress",
        )
        assert out.returncode == 0, out.stderr
        result = json.loads(path.read_text())
        _check_result(result, [65536], ["tcp", "grpc"], copy_threads=2, gloo=TORCH_INSTALLED)
        table = (tmp_path / "run.md").read_text()
        if TORCH_INSTALLED:
            assert result["notes"] == []
            assert "gloo" in result["config"]["references"]
            assert "| vs memcpy | vs gloo | vs raw limit |" in table
            assert "| grpc-stream / this | gloo / this | vs raw limit |" in table
            assert "| 64 KiB | gloo-isend |" in table
        else:  # the run goes on without it, saying why
            assert result["notes"] == [
                "gloo skipped: torch is not installed (pip install 'tensorwire[torch]')"
            ]
            assert "gloo" not in table
        assert server.wait(30) == 0  # --once: it leaves after the runner's goodbye
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        for stream in (server.stdout, server.stderr):
            if stream is not None:
                stream.close()


def test_bench_serve_takes_commands_only_with_the_secret(tmp_path: Path) -> None:
    """`bench serve` with a secret (as beyond loopback it must have): every command but the
    hello proves the secret for its number since that hello, so whoever reaches the port can
    neither set anything up, nor make it allocate, nor stop it, nor replay a runner's command;
    garbage is answered and ignored. Before, its command socket took any command from anyone
    (a `setup` allocated memory of whatever sizes it named, a `pong` connected the server to
    whatever address it named), and one undecodable message ended it with a traceback. A
    runner with another secret, or none, is told so in one line; one with the secret
    measures."""
    import msgpack
    import zmq

    from tensorwire.bench.common import command_mac
    from tensorwire.bench.runner import BenchError, Runner

    secret = str(tmp_path / "secret")
    Path(secret).write_text("s3cret")
    address = f"tcp://127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [PY, "-m", "tensorwire.bench", "serve", *("--bind", address, "--secret-file", secret)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ctx = zmq.Context()
    req = ctx.socket(zmq.REQ)
    req.linger = 0
    try:
        assert server.stdout is not None
        assert "serving on" in server.stdout.readline()
        req.connect(address)

        def ask(raw: bytes) -> dict[str, Any]:
            req.send(raw)
            assert req.poll(10_000), "no answer"
            reply: dict[str, Any] = msgpack.unpackb(req.recv())
            return reply

        sink = msgpack.packb({"op": "raw", "size": 10**13, "count": 1})
        assert "not a command" in ask(b"\xc1garbage")["error"]
        assert "say hello first" in ask(sink)["error"]
        nonce = ask(msgpack.packb({"op": "hello"}))["nonce"]
        assert "needs the shared secret" in ask(sink)["error"]
        forged = msgpack.packb([sink, command_mac("guess", nonce, 0, sink)])
        assert "does not prove the shared secret" in ask(forged)["error"]
        bye = msgpack.packb({"op": "bye"})
        signed = msgpack.packb([bye, command_mac("s3cret", nonce, 0, bye)])
        assert ask(signed)["ok"]
        assert "does not prove the shared secret" in ask(signed)["error"]  # replayed
        for wrong, says in (("other", "does not prove"), (None, "needs the shared secret")):
            with pytest.raises(BenchError, match=says):
                Runner(address, ["tcp"], [4096], 4096, secret=wrong, timeout=30)
        runner = Runner(address, ["tcp"], [4096], 4096, secret="s3cret", timeout=30)
        try:
            assert runner.throughput("tcp", 4096, 20) > 0
            # anyone's hello, unauthenticated as hellos are, leaves the runner's numbering be
            # (it ended it before: the runner's next command was refused)
            assert ask(msgpack.packb({"op": "hello"}))["nonce"]
            assert runner.throughput("tcp", 4096, 20) > 0
        finally:
            runner.close()
        assert server.poll() is None  # served on through all of it
    finally:
        req.close()
        ctx.term()
        server.kill()
        server.wait(30)
        for stream in (server.stdout, server.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "tensorwire.bench", "--sizes", "12Q"],
        ["-m", "tensorwire.bench", "--transports", "carrier-pigeon"],
        ["-m", "tensorwire.bench", "--repeat", "0"],
        ["-m", "tensorwire.bench", "--batch", "1"],
        ["-m", "tensorwire.bench", "--copy-threads", "0"],
        ["-m", "tensorwire.bench", "--messages", "-1"],
        ["-m", "tensorwire.bench", "run"],
        ["-m", "tensorwire.bench", "--bogus"],
        ["-m", "tensorwire.bench", "serve", "--bind", "tcp://0.0.0.0:5999"],
        ["-m", "tensorwire.cli", "nope"],
        ["-m", "tensorwire.cli"],
        ["-m", "tensorwire.cli", "keys"],
        ["-m", "tensorwire.cli", "ping", "localhost:5700"],
        ["-m", "tensorwire.demo", "--steps", "0"],
        ["-m", "tensorwire.client.demo", "--workers", "0"],
        ["-m", "tensorwire.server.daemon", "--bind", "foo"],
        ["-m", "tensorwire.server.daemon", "--log-level", "loud"],
        ["-m", "tensorwire.server.daemon", "--checkpoint-dir", "/dev/null/checkpoints"],
        ["-m", "tensorwire.server.daemon", "--steps", "-"],
        ["-m", "tensorwire.client.worker", "--bind", "tcp://host-without-port"],
        ["-m", "tensorwire.client.worker", "--transport", "pigeon"],
        # a URL or a host with a port went into the join, and the server failed later
        ["-m", "tensorwire.client.worker", "--advertise", "tcp://10.0.0.5:5800"],
        ["-m", "tensorwire.client.worker", "--advertise", "10.0.0.5:5800"],
    ],
)
def test_bad_arguments_are_one_clear_line(args: list[str]) -> None:
    out = run(*args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].split(": ")[1] == "error"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["ping", "--timeout", "nan", "tcp://127.0.0.1:1"], "--timeout"),
        (["top", "--interval", "nan", "127.0.0.1:1"], "--interval"),
        (["top", "--count", "0", "127.0.0.1:1"], "--count"),
        (["bench", "chaos", "--gap", "-1"], "--gap"),
        (["bench", "chaos", "--step-timeout", "nan"], "--step-timeout"),
        (["bench", "chaos", "--min-accuracy", "2"], "--min-accuracy"),
        (["bench", "chaos", "--wire-dtype", "int8"], "--wire-dtype"),
        (["bench", "chaos", "--optimizer", "lbfgs"], "--optimizer"),
        (["bench", "chaos", "--worker-args=--no-such-flag"], "--worker-args"),
        (["bench", "chaos", "--ps-args=--sync maybe"], "--ps-args"),
        (["bench", "soak", "--duration", "nan"], "--duration"),
        # faults that could not begin within the run: refused, not a run without them
        (["bench", "soak", "--kill-every", "1", "--duration", "2"], "--kill-every"),
        (["bench", "soak", "--freeze-every", "1", "--duration", "30"], "--freeze-every"),
        (["bench", "soak", "--freeze-every", "0"], "--freeze-every"),
        (["bench", "soak", "--freeze-every", "1", "--reconnect-every", "9"], "--reconnect-every"),
        (["bench", "soak", "--tensors", "65"], "--tensors: at most 64"),
        (["bench", "soak", "--tensors", "0"], "--tensors"),
        (["bench", "soak", "--api", "write-many"], "--api"),
        (["bench", "ps", "--batch", "0"], "--batch"),
        # past the receiver's bound: its ValueError was a traceback once the sweep set up
        (["bench", "--ring", "99999"], "--ring must be at least 1 and at most 65536"),
        (["top", "127.0.0.1:99999"], "is not HOST:PORT with a port of 1-65535"),
        (["ray-job", "--cpus-per-worker", "nan"], "--cpus-per-worker"),
        (["ray-job", "--timeout", "-1"], "--timeout"),
        # Ray refused the empty bundle only once started
        (["ray-job", "--cpus-per-worker", "0"], "cpus_per_worker and gpus_per_worker are both 0"),
        # a model no worker could load failed the chaos run, the reason in the workers' logs
        (["bench", "chaos", "--model", "nosuch"], "--model 'nosuch': give a built-in model"),
        # a factory of the other framework: every worker exited 1 once the run had started
        pytest.param(
            ["bench", "chaos", "--model", "examples/torch_digits.py:make", "--framework", "numpy"],
            "--framework numpy: the model factory built a torch model",
            marks=pytest.mark.skipif(not TORCH_INSTALLED, reason="needs torch"),
        ),
        (["bench", "chaos", "--keep", ""], "--keep: '' is empty"),
        (["demo", "--transports", "pigeon"], "--transports"),
        (["demo", "--transports", "shm,shm"], "--transports names shm more than once"),
        (["demo", "--ps-args", '"unclosed'], "--ps-args"),
        (["demo", "--model", "nosuch"], "--model"),
        # checked against the servers' own flags: each job's server failed with them, and the
        # demo said "ps0: (nothing in its log)" (its output was on the terminal, above)
        (["demo", "--ps-args=--bogus"], "--ps-args: tensorwire-ps has no --bogus"),
        (["demo", "--ps-args", "--transport tcp"], "--ps-args: --transport is one tensorwire demo"),
        (["demo", "--ps-args", "--lr -1"], "--ps-args: argument --lr: '-1': give a positive"),
        (["demo", "--worker-args=--bogus"], "--worker-args: tensorwire-worker has no --bogus"),
        (["demo", "--worker-args", "--model digits"], "--worker-args: --model is one tensorwire"),
        # the optimizer refused these only once the job had formed
        (["ps", "--lr", "nan"], "argument --lr: 'nan': give a positive number"),
        (["ps", "--momentum", "1"], "argument --momentum: '1': give a number from 0 to below 1"),
        (["ps", "--weight-decay", "-1"], "argument --weight-decay"),
        (["ps", "--warmup-steps", "400"], "--warmup-steps 400 is not within the job's --steps 300"),
        (["ps", "--lr-schedule", "step"], "argument --lr-schedule: invalid choice: 'step'"),
        (["ps", "--clip-grad-norm", "0"], "argument --clip-grad-norm: '0': give a positive"),
        # past what the library's waits take: refused once the daemon ran (a traceback-free
        # line, but after its start)
        (["ps", "--step-timeout", "1e30"], "argument --step-timeout: '1e30': give a positive"),
        # files written at the end: checked at the start, not found out after the whole run
        (["bench", "--json", "/nonexistent-tensorwire/x.json"], "--json"),
        (["bench", "--plot", "/"], "--plot"),
        # a plot matplotlib cannot write was a traceback after the whole sweep (also with the
        # default transports, for which the --plot check was skipped)
        (["bench", "--plot", "/tmp/tensorwire-plot.txt"], ".txt is not an image format"),
        # a transport given twice failed the sweep with "tensor 'shm/pong' is already
        # registered"; soak and ps each parsed the list their own way
        (["bench", "--transports", "shm,shm"], "--transports: the list names shm more than"),
        (["bench", "ps", "--transports", "tcp,tcp"], "the list names tcp more than once"),
        # a size given twice failed the sweep's set-up ("tensor 'shm/4096' is already
        # registered"); sizes past the machine's memory were numpy's MemoryError at the set-up,
        # or, where the kernel overcommits, its OOM killer
        (["bench", "--sizes", "4K,4096"], "--sizes: the list names 4 KiB more than once"),
        # a bind host the resolver does not know: not "a shared secret is required"
        (["ps", "--bind", "tcp://nosuchhost.invalid:5700"], "resolves to no address here"),
        (["worker", "--bind", "tcp://nosuchhost.invalid:0"], "resolves to no address here"),
        (["bench", "--sizes", "1048576G", "--transports", "tcp"], "GiB available"),
        (["bench", "run", "--connect", "tcp://127.0.0.1:1", "--sizes", "1048576G"], "GiB of"),
        (["bench", "soak", "--transports", "grpc,pigeon"], "unknown transport(s) pigeon"),
        (["bench", "chaos", "--json", "/nonexistent-tensorwire/x.json"], "--json"),
        (["ps", "--metrics", "/nonexistent-tensorwire/ps0.json"], "--metrics"),
        (["worker", "--save-params", "/nonexistent-tensorwire/p.npz"], "--save-params"),
        (["ray-job", "--metrics", "/nonexistent-tensorwire/job.json"], "--metrics"),
    ],
)
def test_bad_values_are_refused_before_anything_starts(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In the process, as the parsers are what is tested: before, each of these started
    something first (a chaos job, a Ray cluster, the demo's daemons) and then ended in a
    traceback, a wait of a minute, or daemons that refused their flags; a NaN --timeout or
    --interval was a traceback at its first use, --transports , trained nothing and exited 0;
    an output file in a missing directory was a traceback after the whole run."""
    from tensorwire import cli

    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert ": error: " in last and says in last, last


def test_info_reports_the_installation() -> None:
    out = run("-m", "tensorwire.cli", "info")
    assert out.returncode == 0
    assert "transports: shm, tcp, nixl, grpc, grpc-stream" in out.stdout
    assert "shared memory" in out.stdout
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # (the child's, inherited)
    assert f"open files: soft limit {soft}, hard {hard} (tensorwire-ps" in out.stdout, out.stdout
    # the versions a report of a problem needs, as this process has them
    from importlib import metadata

    import ml_dtypes
    import msgpack
    import zmq

    wanted = (
        f"libraries: numpy {np.__version__}, pyzmq {zmq.__version__} (libzmq "
        f"{zmq.zmq_version()}), msgpack {'.'.join(map(str, msgpack.version))}, ml_dtypes "
        f"{ml_dtypes.__version__}"
    )
    assert wanted in out.stdout, out.stdout
    libraries = next(line for line in out.stdout.splitlines() if line.startswith("libraries: "))
    for dist in ("torch", "ray"):  # where installed, from their metadata
        try:
            assert f"{dist} {metadata.version(dist)}" in libraries, libraries
        except metadata.PackageNotFoundError:
            assert f" {dist} " not in libraries, libraries
    if not NIXL_INSTALLED:  # (a bare pip install): it says how to install it, in the line
        assert "nixl: not installed (pip install --no-deps 'nixl-cu12==" in out.stdout, out.stdout
        assert "ucx: " not in out.stdout, out.stdout
        return
    # make test installs NIXL: info names its version and the UCX transports it can open
    # by behaviour, not by name: nixl_cu12 here, nixl_cu13 on a CUDA 13 host
    assert re.search(r"^nixl: nixl_cu1\d \d+\.\d+", out.stdout, re.M), out.stdout
    ucx = next(line for line in out.stdout.splitlines() if line.startswith("ucx: "))
    assert "tcp/lo" in ucx and "cma/memory" in ucx
    # where NIXL's notifications go between processes of this host, and what that risks
    default = os.environ.get("UCX_MM_ERROR_HANDLING", "n") == "n"
    here = "nixl notifications within this host: " + ("tcp/lo" if default else "UCX's shared")
    assert here in out.stdout, out.stdout
    opted = run("-m", "tensorwire.cli", "info", env={"UCX_MM_ERROR_HANDLING": "y"})
    assert "shared-memory queue (UCX_MM_ERROR_HANDLING=y: faster, but a process" in opted.stdout


@pytest.mark.nixl
def test_polling_probe_reports_its_figures() -> None:
    out = run("-m", "tensorwire.bench.polling", "--count", "10", "--idle", "0.1", "--gap", "0.002")
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("nixl (tensorwire polling), 4 KiB every 2 ms: one way median ")
    assert "write() median" in line and line.endswith("% of a core")


def test_depths_probe_times_each_depth_in_turn() -> None:
    out = run(
        "-m",
        "tensorwire.bench.depths",
        *("--transport", "tcp", "--sizes", "4K", "--depths", "2,4"),
        *("--messages", "50", "--repeat", "2"),
    )
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.strip().splitlines()[2:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [("4", "KiB", "2"), ("4", "KiB", "4")]
    assert float(rows[0][3]) > 0 and rows[0][4] == "1.00x" and float(rows[1][3]) > 0
    bad = run("-m", "tensorwire.bench.depths", "--depths", "8,x")
    assert bad.returncode == 2 and "--depths takes whole numbers" in bad.stderr


def test_cycle_probe_times_each_call(tmp_path: Path) -> None:
    path = tmp_path / "cycle.json"
    out = run("-m", "tensorwire.bench.cycle", "--count", "200", "--each", "--json", str(path))
    assert out.returncode == 0, out.stderr
    written = json.loads(path.read_text())
    assert written["kind"] == "cycle" and written["config"]["transport"] == "shm"
    assert set(written["median_us"]) == {"write", "wait", "release", "timer"}
    figures = dict(re.findall(r"(write|wait|release|timer) (\d+\.\d+)", out.stdout))
    assert set(figures) == {"write", "wait", "release", "timer"}, out.stdout
    assert all(float(us) > 0 for us in figures.values())
    assert "medians of 200 shm messages of 4 KiB on cpu" in out.stdout
    whole = run("-m", "tensorwire.bench.cycle", "--count", "200", "--repeat", "2")
    assert whole.returncode == 0 and "us per write + wait + release" in whole.stdout
    # the profile names the library's own functions, here over tcp and a size given in bytes
    prof = run(
        "-m", "tensorwire.bench.cycle", "--count", "200", "--size", "64K", "--transport", "tcp",
        "--profile", "500",
    )  # fmt: skip
    assert prof.returncode == 0, prof.stderr
    assert "profile of 200 tcp messages of 64 KiB on cpu" in prof.stdout
    assert "tensorwire/sender.py" in prof.stdout and "ncalls" in prof.stdout
    odd = run("-m", "tensorwire.bench.cycle", "--size", "6")
    assert odd.returncode == 2 and "--size must be a multiple of 4 bytes" in odd.stderr
    # the CUDA calls are timed on a GPU only (tests/test_gpu.py times them there)
    host = run("-m", "tensorwire.bench.cycle", "--calls")
    assert host.returncode == 2 and "--calls times CUDA calls: give --device cuda" in host.stderr


# -- the daemons' settings and the small commands ------------------------------------------------


def test_a_bad_value_names_the_variable_it_came_from() -> None:
    out = run("-m", "tensorwire.server.daemon", env={"TENSORWIRE_STEPS": "many"})
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "argument --steps: 'many' is not a whole number (from environment TENSORWIRE_STEPS)"
        )
    )


def test_info_has_help_and_refuses_an_argument() -> None:
    """`tensorwire info --help` printed the report, and an argument given by mistake was
    ignored."""
    out = run("-m", "tensorwire.cli", "info", "--help")
    assert out.returncode == 0 and out.stdout.startswith("usage: tensorwire info"), out.stdout
    out = run("-m", "tensorwire.cli", "info", "--gpu")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "tensorwire info: error: unrecognized arguments: --gpu"
    )


def test_output_into_a_closed_pipe_ends_without_a_traceback() -> None:
    """`tensorwire info | head -1`: a reader that closes early ended the command in a
    BrokenPipeError traceback. Here the reader is gone before the command writes a byte."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run(
            [PY, "-m", "tensorwire.cli", "info"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert out.returncode == 141, out.stderr
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr


def test_daemon_help_names_each_setting_s_variable_and_the_toml_table() -> None:
    for module, table in (
        ("tensorwire.server.daemon", "[ps]"),
        ("tensorwire.client.worker", "[worker]"),
    ):
        out = run("-m", module, "--help")
        assert out.returncode == 0
        text = " ".join(out.stdout.split())  # help wraps lines anywhere
        assert "[env var: TENSORWIRE_STEP_TIMEOUT]" in text and table in text
        assert "--version" in text


def _flags_without_their_default(parser: argparse.ArgumentParser, name: str) -> list[str]:
    """The options of ``parser`` (and of its subcommands) that have a default which their help
    does not give."""
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                missing += _flags_without_their_default(subparser, f"{name} {sub}")
            continue
        default = action.default
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        if default is None or default is False or default == argparse.SUPPRESS:
            continue  # (a flag given or not, or a value only when given)
        if isinstance(default, (str, list, tuple)) and not default:
            continue  # (nothing unless given: --ps-args)
        if "default" not in (action.help or ""):
            missing.append(f"{name} {action.option_strings[-1]} (default {default!r})")
    return missing


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_with_a_default_says_it_in_its_help(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user reading `--help` learns what each flag is when not given. Before, 17 flags of the
    daemons did not say (`tensorwire-ps --step-timeout`: 120 s; `--sync`, `--optimizer`, which
    had no help at all, `--join-timeout`; the worker's `--reconnect-timeout`, `--servers`,
    `--bind`, ...), nor did `bench ps --repeat` and `ray-job --port`."""
    from tensorwire import cli

    shown: list[argparse.ArgumentParser] = []
    monkeypatch.setattr(
        argparse.ArgumentParser, "print_help", lambda self, file=None: shown.append(self)
    )
    with pytest.raises(SystemExit):
        cli._run(command, ["--help"])
    assert len(shown) == 1
    assert _flags_without_their_default(shown[0], f"tensorwire {command}") == []


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_says_its_version(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`tensorwire ray-job --version` handed the daemons' own --version to every daemon, which
    printed it and exited without the summaries the job waits for: a Ray cluster started, and
    a FileNotFoundError traceback ended it. `ping`, `top`, `keys` wanted their arguments first,
    and `bench`, `demo`, `info` had no --version."""
    import tensorwire as tw
    from tensorwire import cli

    with pytest.raises(SystemExit) as done:
        cli.main([command, "--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"tensorwire {command} {tw.__version__}"


def test_daemons_have_a_version_and_log_levels_in_any_case() -> None:
    import tensorwire as tw

    for module, prog in (
        ("tensorwire.server.daemon", "tensorwire-ps"),
        ("tensorwire.client.worker", "tensorwire-worker"),
    ):
        out = run("-m", module, "--version")
        assert out.returncode == 0 and out.stdout.strip() == f"{prog} {tw.__version__}"
    out = run(
        "-m",
        "tensorwire.server.daemon",
        "--log-level",
        "info",
        "--no-progress",
        "--bind",
        f"tcp://127.0.0.1:{free_port()}",
        "--join-timeout",
        "0.2",
    )
    assert out.returncode == 1  # nobody joined: it started and logged, then gave up
    # another test's killed receiver can leave a segment that this daemon reaps, and says so,
    # before it serves: the line looked for is not always the first
    started = [line for line in out.stderr.splitlines() if "shard 0 of 1 serving" in line]
    assert started and " ps0 INFO shard 0 of 1 serving" in started[0], out.stderr  # the level


def test_heartbeats_timeouts_and_counts_out_of_range_are_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each by the daemon's own parser and its reading of the command line, in this process:
    twelve daemons started for it took about 5 s of CPU. A refusal that comes later in a
    daemon's start (--servers naming one twice) is met by a daemon started for it, as is a bad
    value in test_a_bad_value_names_the_variable_it_came_from."""
    import importlib

    from tensorwire.job import config

    out = run("-m", "tensorwire.client.worker", "--servers", "tcp://h:1,tcp://h:1")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "argument --servers: " in out.stderr and "tcp://h:1 more than" in out.stderr
    for module, flag, value, says in (
        ("tensorwire.server.daemon", "--heartbeat", "0", "give a positive number of seconds"),
        ("tensorwire.client.worker", "--heartbeat-timeout", "-1", "give a positive number"),
        ("tensorwire.server.daemon", "--heartbeat-timeout", "soon", "is not a number of seconds"),
        # NaN compares false with everything: a deadline made of it never passes
        ("tensorwire.server.daemon", "--step-timeout", "nan", "give a positive number"),
        ("tensorwire.server.daemon", "--join-timeout", "0", "give a positive number"),
        ("tensorwire.client.worker", "--reconnect-timeout", "-3", "give a positive number"),
        # counts: -1 checkpointed every step, a batch of 0 divided by zero
        ("tensorwire.server.daemon", "--checkpoint-every", "-1", "a whole number of at least 0"),
        ("tensorwire.client.worker", "--batch", "0", "give a whole number of at least 1"),
        ("tensorwire.client.worker", "--threads", "0", "a step needs at least one thread"),
        ("tensorwire.client.worker", "--threads", "many", "not a number of threads or 'auto'"),
        ("tensorwire.server.daemon", "--staleness", "2.5", "'2.5' is not a whole number"),
        # before, a numpy worker was told that numpy models train on the CPU
        ("tensorwire.client.worker", "--device", "cuda:x", "give cpu, cuda or cuda:N"),
        ("tensorwire.server.daemon", "--device", "gpu", "give cpu, cuda or cuda:N"),
    ):
        parser = importlib.import_module(module).build_parser()
        with pytest.raises(SystemExit) as refused:
            config.parse(parser, [flag, value, "--no-progress"])
        stderr = capsys.readouterr().err
        assert refused.value.code == 2, stderr
        assert f"argument {flag}: " in stderr and says in stderr


def test_a_batch_larger_than_the_workers_shard_is_refused_before_it_joins() -> None:
    """Before, the worker joined its servers and failed at its first step with a traceback,
    leaving the job formed and waiting for it. Nothing listens at --servers here: the refusal
    comes before any connect."""
    out = run(
        "-m",
        "tensorwire.client.worker",
        *("--servers", f"tcp://127.0.0.1:{free_port()}", "--batch", "100000", "--no-progress"),
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert "batch 100000 is larger than worker 0's shard of" in last
    assert "give a --batch of at most" in last and "reaching" not in out.stderr


def test_resume_without_a_checkpoint_dir_is_refused_at_start() -> None:
    """Before, it was refused once the server had started, as "no checkpoint at (no
    --checkpoint-dir)"."""
    out = run("-m", "tensorwire.server.daemon", "--resume", "--no-progress")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .endswith("--resume needs --checkpoint-dir (where the checkpoint is)")
    )


def test_an_unusable_checkpoint_dir_is_refused_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    readonly = tmp_path / "readonly"
    readonly.mkdir(mode=0o500)
    cases = [(blocker, "exists and is not a directory")]
    if os.geteuid() != 0:  # root writes anywhere
        cases.append((readonly, "is not writable"))
    for path, says in cases:
        out = run("-m", "tensorwire.server.daemon", "--checkpoint-dir", str(path), "--no-progress")
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert out.stderr.strip().splitlines()[-1].endswith(f"--checkpoint-dir {path}: {says}")
    fresh = tmp_path / "new" / "checkpoints"  # a missing directory is created
    out = run(
        "-m",
        "tensorwire.server.daemon",
        "--checkpoint-dir",
        str(fresh),
        "--no-progress",
        "--bind",
        f"tcp://127.0.0.1:{free_port()}",
        "--join-timeout",
        "0.2",
    )
    assert out.returncode == 1 and fresh.is_dir()


def test_workers_take_rank_and_world_size_from_launchers() -> None:
    for env, says in (
        ({"RANK": "5", "WORLD_SIZE": "2"}, "--rank 5 is not in 0..1"),
        ({"SLURM_PROCID": "4", "SLURM_NTASKS": "3"}, "--rank 4 is not in 0..2"),
        ({"RANK": "five"}, "environment RANK='five' is not an integer"),
    ):
        out = run("-m", "tensorwire.client.worker", "--no-progress", env=env)
        assert out.returncode == 2, out.stderr
        assert out.stderr.strip().splitlines()[-1].endswith(says)
    # A flag still wins over the launcher's variable.
    out = run("-m", "tensorwire.client.worker", "--rank", "7", "--workers", "2", env={"RANK": "0"})
    assert out.stderr.strip().splitlines()[-1].endswith("--rank 7 is not in 0..1")


def _strace_traces() -> bool:
    """Whether strace is installed and may trace here (a container can forbid ptrace)."""
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(
        ["strace", "-o", os.devnull, "true"], capture_output=True, timeout=30, check=False
    )
    return probe.returncode == 0


#: tests that read a process's system calls
needs_strace = pytest.mark.skipif(
    not _strace_traces(), reason="needs strace, allowed to trace (ptrace) here"
)


def test_keys_are_not_overwritten_without_force(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    assert run("-m", "tensorwire.cli", "keys", str(keys)).returncode == 0
    public = (keys / "server.key").read_text()
    out = run("-m", "tensorwire.cli", "keys", str(keys))
    assert out.returncode == 1 and "already holds a key pair" in out.stderr
    assert (keys / "server.key").read_text() == public
    assert run("-m", "tensorwire.cli", "keys", str(keys), "--force").returncode == 0
    assert (keys / "server.key").read_text() != public


@needs_strace
def test_a_secret_key_is_never_readable_by_others_in_a_directory_open_to_them(
    tmp_path: Path,
) -> None:
    """`tensorwire keys DIR` where DIR already exists, open to every user (0755), with the
    usual umask 022: pyzmq wrote the secret key there with mode 0644 and the key was chmodded
    to 0600 only after, so that another user could open it meanwhile. Now it is made in a
    directory of its own (0700) and moved into DIR with its final mode: under strace, no file
    of that name is ever created in DIR, only renamed into it, and nothing else is left."""
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o755)
    keys.chmod(0o755)
    trace = tmp_path / "trace"
    out = subprocess.run(
        [
            *("strace", "-f", "-e", "trace=openat,open,creat,rename,renameat,renameat2"),
            *("-o", str(trace), PY, "-c"),
            "import os, sys; os.umask(0o022); from tensorwire.cli import main; sys.exit(main())",
            *("keys", str(keys)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    secret = keys / "server.key_secret"
    calls = [line for line in trace.read_text().splitlines() if f'"{secret}"' in line]
    assert calls and all(re.search(r"rename(at2?)?\(", line) for line in calls), calls
    assert secret.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in keys.iterdir()) == ["server.key", "server.key_secret"]


def test_keys_in_a_directory_the_user_cannot_write_is_one_line_naming_it() -> None:
    """Run as nobody, `tensorwire keys DIR` where DIR is root's (0755): one line naming DIR
    (the key pair is made in a directory of its own inside DIR, whose name the error said
    before), exit 1, nothing left in DIR."""
    import tempfile

    nobody = as_nobody()
    # (outside pytest's own directory, which only root may enter: nobody may reach DIR here,
    # and not write in it)
    with tempfile.TemporaryDirectory() as top:
        keys = Path(top) / "keys"
        keys.mkdir()
        for where in (Path(top), keys):
            where.chmod(0o755)
        out = subprocess.run(
            [*nobody, PY, "-m", "tensorwire.cli", "keys", str(keys)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 1, out.stderr
        said = f"tensorwire keys: error: cannot write in {keys}: Permission denied"
        assert out.stderr.strip() == said
        assert list(keys.iterdir()) == []


def test_keys_where_no_directory_can_be_is_one_line(tmp_path: Path) -> None:
    """A file given for the directory was "[Errno 17] File exists: '...'"; a path beneath a
    file, the errno and repr of NotADirectoryError."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for where, says in (
        (blocker, f"{blocker} exists and is not a directory"),
        (blocker / "keys", f"cannot write in {blocker / 'keys'}: Not a directory"),
    ):
        out = run("-m", "tensorwire.cli", "keys", str(where))
        assert out.returncode == 1 and out.stderr.strip() == f"tensorwire keys: error: {says}"
    assert blocker.read_text() == ""


def test_ping_says_whether_an_endpoint_accepts_connections() -> None:
    import tensorwire as tw

    with tw.Receiver() as rx:
        assert run("-m", "tensorwire", "ping", rx.address).returncode == 0
    out = run("-m", "tensorwire", "ping", f"tcp://127.0.0.1:{free_port()}")
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1


def test_ping_fails_a_frozen_daemon_and_another_service() -> None:
    """A stopped daemon's kernel still accepts connections: before, ping said it was healthy,
    as it did for any service on the port (here an HTTP server). Now it waits for ZeroMQ's
    greeting, which only a running control plane sends."""
    bind = f"tcp://127.0.0.1:{free_port()}"
    daemon = subprocess.Popen(
        [sys.executable, "-c", _RECEIVER_UNTIL_KILLED, bind], stdout=subprocess.PIPE, text=True
    )
    try:
        assert daemon.stdout is not None and daemon.stdout.readline().strip() == bind
        assert run("-m", "tensorwire", "ping", bind).returncode == 0
        freeze(daemon.pid)
        out = run("-m", "tensorwire", "ping", bind, "--timeout", "1")
        assert out.returncode == 1, out.stderr
        assert "accepted the connection but sent no greeting within 1 s" in out.stderr
        os.kill(daemon.pid, signal.SIGCONT)
        assert run("-m", "tensorwire", "ping", bind).returncode == 0
    finally:
        daemon.kill()
        daemon.wait(30)
        if daemon.stdout is not None:
            daemon.stdout.close()
    port = free_port()
    http = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        out = None
        for _ in range(100):  # bounded: until it listens (refused before)
            out = run("-m", "tensorwire", "ping", f"tcp://127.0.0.1:{port}", "--timeout", "1")
            if "refused" not in out.stderr:
                break
            time.sleep(0.1)
        assert out is not None and out.returncode == 1
        assert "sent no greeting within 1 s" in out.stderr, out.stderr
    finally:
        http.kill()
        http.wait(30)


_RECEIVER_UNTIL_KILLED = """
import sys, time, tensorwire as tw
rx = tw.Receiver(sys.argv[1])
print(rx.address, flush=True)
time.sleep(600)
"""


def test_the_library_logs_nowhere_unless_the_application_says(tmp_path: Path) -> None:
    code = (
        "import logging, tensorwire as tw\n"
        "assert any(isinstance(h, logging.NullHandler) "
        "for h in logging.getLogger('tensorwire').handlers)\n"
        "logging.getLogger('tensorwire.receiver').warning('not shown')\n"
    )
    out = run("-c", code)
    assert out.returncode == 0 and out.stderr == ""


def test_a_receiver_beyond_loopback_needs_a_secret_or_says_insecure() -> None:
    import tensorwire as tw

    with pytest.raises(tw.AuthenticationError, match="so a secret is required"):
        tw.Receiver("tcp://0.0.0.0:0")
    with tw.Receiver("tcp://0.0.0.0:0", secret="s3cret") as rx:
        assert rx.address.startswith("tcp://")
    with tw.Receiver("tcp://0.0.0.0:0", insecure=True) as rx:
        assert rx.address.startswith("tcp://")


def test_a_bind_host_that_names_nothing_is_said_so_not_blamed_on_the_secret() -> None:
    """A bind host the resolver does not know was refused as one beyond loopback that needs a
    secret (AuthenticationError); with the secret it failed later, at the data server's bind.
    It is now refused first, saying the name resolves to nothing."""
    import tensorwire as tw

    for secret in (None, "s3cret"):
        with pytest.raises(tw.TensorWireError, match="resolves to no address here") as refused:
            tw.Receiver("tcp://nosuchhost.invalid:0", secret=secret)
        assert not isinstance(refused.value, tw.AuthenticationError)


def _worker_outlives_its_server(
    tmp_path: Path, ps_args: list[str], worker_args: list[str], started: str
) -> tuple[str, int, str]:
    """Start a server and one worker, wait for ``started`` in the worker's log, kill the
    server; the server's address, the worker's exit code (it must exit within 60 s) and log."""
    address = f"tcp://127.0.0.1:{free_port()}"
    procs = Processes(tmp_path)
    try:
        ps = procs.start(
            [sys.executable, "-m", "tensorwire.server.daemon", "--bind", address, *ps_args],
            log="ps",
        )
        worker = procs.start(
            [sys.executable, "-m", "tensorwire.client.worker", "--servers", address, *worker_args],
            log="worker",
        )
        log_has(tmp_path / "worker.log", started, timeout=90)
        assert ps.poll() is None and worker.poll() is None
        ps.kill()
        ps.wait(30)
        code = worker.wait(60)
    finally:
        procs.kill()
    return address, code, procs.log("worker")


def test_a_worker_whose_server_died_exits_in_one_line(tmp_path: Path) -> None:
    address, code, err = _worker_outlives_its_server(
        tmp_path,
        ["--steps", "1000000", "--no-progress"],
        ["--reconnect-timeout", "2", "--no-progress"],
        "joined 1 server(s)",  # then it trains (a step takes milliseconds)
    )
    assert code == 1 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"tensorwire-worker: error: parameter server {address} did not answer")
    assert "nothing accepted a connection there" in last  # why, from its last try
    assert "reconnecting, waiting up to 2 s for it to come back (--reconnect-timeout)" in err


def test_a_server_that_dies_before_its_first_write_is_found_lost(tmp_path: Path) -> None:
    """The server waits for a second worker that never comes, so it has written nothing to the
    first one, and nothing tells that worker's receiver of the loss: the worker pings its
    servers while it waits (a ping ends at once where the server is known dead), and gives up
    after --reconnect-timeout, not --step-timeout."""
    address, code, err = _worker_outlives_its_server(
        tmp_path,
        ["--workers", "2", "--no-progress"],
        [
            *("--workers", "2", "--rank", "0", "--no-progress"),
            *("--reconnect-timeout", "2", "--step-timeout", "300"),
        ],
        "joined 1 server(s)",
    )
    assert code == 1 and "Traceback" not in err
    assert f"parameter server {address} failed a ping while we waited" in err
    assert err.strip().splitlines()[-1].startswith("tensorwire-worker: error: parameter server")


def test_a_server_that_gives_up_on_forming_the_job_tells_the_worker_that_joined(
    tmp_path: Path,
) -> None:
    """A server of two workers of which one never came gave up at its --join-timeout and
    exited 1; the worker that had joined took that for a lost server and waited out its
    --reconnect-timeout (120 s by default) for it to come back. The server now tells it, and
    it exits 1 at once, saying why."""
    address = f"tcp://127.0.0.1:{free_port()}"
    procs = Processes(tmp_path)
    try:
        ps = procs.start(
            [
                *(sys.executable, "-m", "tensorwire.server.daemon", "--bind", address),
                *("--workers", "2", "--join-timeout", "4", "--no-progress"),
            ],
            log="ps",
        )
        worker = procs.start(
            [
                *(sys.executable, "-m", "tensorwire.client.worker", "--servers", address),
                *("--workers", "2", "--rank", "0", "--reconnect-timeout", "120", "--no-progress"),
            ],
            log="worker",
        )
        assert ps.wait(60) == 1
        gave_up = time.monotonic()
        code = worker.wait(30)  # bounded well below the reconnect timeout it waited out before
        assert time.monotonic() - gave_up < 10
    finally:
        procs.kill()
    err = procs.log("worker")
    assert code == 1 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        f"tensorwire-worker: error: parameter server {address} gave up on the job"
    )
    assert "did not join within its --join-timeout" in last and "reconnecting" not in err
    assert "worker 0 told that the job did not form" in procs.log("ps")


def test_a_worker_started_after_the_job_ended_hears_so_from_a_lingering_server(
    tmp_path: Path,
) -> None:
    """A worker started again once its server had ended the job (an orchestrator restarting a
    failed pod) found nobody there, waited its --connect-timeout (60 s) and exited 1; where
    it is restarted on failure (a Kubernetes Job), again and again. A server given --linger
    keeps answering, with no tensors, that the job is done: such a worker exits 0 at once
    saying so, `tensorwire ping` answers meanwhile, and SIGTERM ends the linger at once; a
    finite linger ends by itself."""
    pytest.importorskip("prometheus_client")  # (the `metrics` extra: `make test` has it)
    from tensorwire.top import scrape

    address = f"tcp://127.0.0.1:{free_port()}"
    procs = Processes(tmp_path)
    server = [sys.executable, "-m", "tensorwire.server.daemon", "--bind", address, "--no-progress"]
    worker = [sys.executable, "-m", "tensorwire.client.worker", "--servers", address]
    metrics = free_port()
    try:
        ckpt = tmp_path / "ckpt"
        lingering = [*server, "--steps", "5", "--linger", "forever", "--checkpoint-dir", str(ckpt)]
        ps = procs.start([*lingering, "--metrics-port", str(metrics)], log="ps")
        first = [*worker, "--no-progress", "--save-params", str(tmp_path / "w0.npz")]
        first += ["--metrics", str(tmp_path / "w0.json")]
        assert procs.start(first, log="w0").wait(120) == 0
        trained = (tmp_path / "w0.json").read_bytes()
        log_has(tmp_path / "ps.log", "the job is done: answering at", timeout=30)
        # still scraped, and saying it is done (`tensorwire top`: "(done)")
        page = scrape(f"http://127.0.0.1:{metrics}/metrics", timeout=10)
        assert page["tensorwire_ps_done"] == {(("shard", "0"),): 1.0}
        begun = time.monotonic()
        late_run = [*worker, "--connect-timeout", "60", "--metrics", str(tmp_path / "late.json")]
        late_run += ["--save-params", str(tmp_path / "late.npz")]
        late = procs.start([*late_run, "--no-progress"], log="late")
        assert late.wait(30) == 0
        assert time.monotonic() - begun < 20  # not its --connect-timeout
        assert run("-m", "tensorwire", "ping", "--timeout", "5", address).returncode == 0
        # started again with the summary path of the run that trained (the job applied again
        # once done): that summary is kept, not written over with one of nothing trained
        again = procs.start(
            [*worker, "--no-progress", "--metrics", str(tmp_path / "w0.json")], log="again"
        )
        assert again.wait(30) == 0
        assert (tmp_path / "w0.json").read_bytes() == trained
        assert (
            procs.log("again")
            .strip()
            .endswith(
                f"worker0: --metrics {tmp_path}/w0.json keeps the summary of the run that trained "
                "(5 steps)"
            )
        ), procs.log("again")
        assert ps.poll() is None
        ps.send_signal(signal.SIGTERM)
        assert ps.wait(10) == 0
        # a finite linger ends by itself, exit 0
        ps = procs.start([*server, "--steps", "3", "--linger", "1"], log="ps2")
        assert procs.start([*worker, "--no-progress"], log="w1").wait(120) == 0
        assert ps.wait(30) == 0
    finally:
        procs.kill()
    said = procs.log("late").strip().splitlines()[-2:]
    assert said[0] == (
        f"worker0: parameter server {address} had ended the job at step 5 when this worker "
        "reached it: nothing is left to train"
    ), procs.log("late")
    # No parameters came to write as --save-params: it says where they are, and they are
    # those the worker that trained saved.
    assert said[1] == (
        f"worker0: --save-params {tmp_path}/late.npz not written: no parameters came (the job "
        f"had ended); the servers' checkpoints of its last step hold them ({ckpt}/ps-shard0.npz "
        f"on the host of {address}): `tensorwire export CHECKPOINT... --out FILE` writes them "
        "as --save-params would"
    ), said[1]
    assert not (tmp_path / "late.npz").exists()
    out = tmp_path / "exported.npz"
    exported = run("-m", "tensorwire", "export", f"{ckpt}/ps-shard0.npz", "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    with np.load(tmp_path / "w0.npz") as trained, np.load(out) as late:
        assert list(late.files) == list(trained.files)
        assert all(np.array_equal(late[k], trained[k]) for k in trained.files)
    assert "Traceback" not in procs.log("ps") + procs.log("late")
    # its summary (a launcher reads one): nothing trained, and the step the job ended at
    summary = json.loads((tmp_path / "late.json").read_text())
    assert summary["steps"] == 0 and summary["job_done_at"] == 5, summary
    assert summary["test_accuracy"] is None
    assert "until stopped" in procs.log("ps") and "for 1 s (--linger)" in procs.log("ps2")


@pytest.mark.parametrize("leaving", [1, 2])
def test_an_asp_job_that_ends_as_its_workers_finish_or_leave_lingers_too(
    tmp_path: Path, leaving: int
) -> None:
    """Under asp and ssp the job ends once every worker taking part has stopped: those that
    did their steps, and those that left before (stopped, SIGTERM). Where every worker left,
    its step is short of --steps, and such a server did not linger, so a worker started again
    then found nobody (`bench chaos --steps`, tcp asp, seed 4524: "w0 exited 1"). It now
    lingers, saying the job ended at that step. Where one worker left and the other did all
    its steps, the job's step is no longer held at the step of the one that left: the job
    ends done, at --steps."""
    address = f"tcp://127.0.0.1:{free_port()}"
    procs = Processes(tmp_path)
    server = [PY, "-m", "tensorwire.server.daemon", "--bind", address, "--no-progress"]
    server += ["--sync", "asp", "--workers", "2", "--steps", "3000", "--linger", "forever"]
    worker = [PY, "-m", "tensorwire.client.worker", "--servers", address, "--workers", "2"]
    worker += ["--no-progress", "--log-level", "INFO"]
    try:
        ps = procs.start(server, log="ps")
        w0 = procs.start([*worker, "--rank", "0"], log="w0")
        w1 = procs.start([*worker, "--rank", "1"], log="w1")
        log_has(tmp_path / "w1.log", "joined 1 server(s)", timeout=60)
        w1.send_signal(signal.SIGTERM)  # it leaves, its steps not done
        assert w1.wait(60) == 0
        if leaving == 2:
            log_has(tmp_path / "ps.log", "worker 1 left at its step ", timeout=60)
            w0.send_signal(signal.SIGTERM)  # before its 3000 steps (about 3 s alone)
        assert w0.wait(120) == 0
        log_has(tmp_path / "ps.log", "the job is done: answering at", timeout=60)
        again = procs.start([*worker, "--rank", "1", "--connect-timeout", "60"], log="again")
        assert again.wait(30) == 0
        ps.send_signal(signal.SIGTERM)
        assert ps.wait(30) == 0
    finally:
        procs.kill()
    ended = 3000
    if leaving == 2:
        ended = int(procs.log("ps").split("worker 0 left at its step ")[1].split()[0])
        assert ended < 3000
    said = procs.log("again").strip().splitlines()[-1]
    assert said.endswith(
        f"had ended the job at step {ended} when this worker reached it: nothing is left to train"
    ), said


def test_a_stop_that_comes_as_the_daemons_exit_changes_nothing(tmp_path: Path) -> None:
    """SIGTERM sent again and again to a server and its worker once the job is done (an
    orchestrator stopping what it still sees running: `ray-job` stops its lingering servers
    once the workers end): each exits 0. Python puts a signal's default action back as the
    interpreter exits, and such a stop killed the daemon there: 5 of 5 servers exited -15
    (measured by hand), and Ray started the server again (a fresh clone's suite, two
    `test_ray.py` failures). The daemons now ignore stops once their work is done."""
    address = f"tcp://127.0.0.1:{free_port()}"
    procs = Processes(tmp_path)
    try:
        server = [PY, "-m", "tensorwire.server.daemon", "--bind", address, "--steps", "5"]
        ps = procs.start([*server, "--no-progress"], log="ps")
        worker = procs.start(
            [PY, "-m", "tensorwire.client.worker", "--servers", address, "--no-progress"],
            log="w0",
        )
        log_has(tmp_path / "ps.log", "done at step 5", timeout=120)
        deadline = time.monotonic() + 30
        while any(p.poll() is None for p in (ps, worker)):  # bounded by the deadline
            assert time.monotonic() < deadline, procs.log("ps") + procs.log("w0")
            for p in (ps, worker):
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
            time.sleep(0.002)
        codes = [ps.wait(10), worker.wait(10)]
    finally:
        procs.kill()
    assert codes == [0, 0], procs.log("ps") + procs.log("w0")


def test_a_lingering_server_answers_where_the_job_was_served() -> None:
    """At --bind, with the port the system gave where --bind asked for any (port 0): a
    worker reaches the server where it reached it during the job."""
    from tensorwire.server.linger import endpoint_again

    assert endpoint_again("tcp://127.0.0.1:0", "tcp://127.0.0.1:43123") == "tcp://127.0.0.1:43123"
    assert endpoint_again("tcp://0.0.0.0:0", "tcp://node7:5111") == "tcp://0.0.0.0:5111"
    assert endpoint_again("tcp://[::1]:0", "tcp://[::1]:5111") == "tcp://[::1]:5111"
    assert endpoint_again("tcp://0.0.0.0:5700", "tcp://10.0.0.1:5700") == "tcp://0.0.0.0:5700"


def test_a_server_resumed_at_the_jobs_last_step_ends_cleanly(tmp_path: Path) -> None:
    """A server restarted after its job ended (a Kubernetes StatefulSet restarts one that
    exits 0) resumed from the checkpoint of the last step and waited for workers that had
    all finished: at its --join-timeout it exited 1, to be restarted once more. It now says
    there is nothing left to train, tells those that come, and exits 0 at that timeout."""
    address = f"tcp://127.0.0.1:{free_port()}"
    server = [
        *("-m", "tensorwire.server.daemon", "--bind", address, "--steps", "4"),
        *("--checkpoint-dir", str(tmp_path / "ckpt"), "--resume-if-present", "--no-progress"),
    ]
    procs = Processes(tmp_path)
    try:
        ps = procs.start([sys.executable, *server], log="ps")
        worker = [sys.executable, "-m", "tensorwire.client.worker", "--servers", address]
        assert procs.start([*worker, "--no-progress"], log="w0").wait(120) == 0
        assert ps.wait(60) == 0
    finally:
        procs.kill()
    again = run(*server, "--join-timeout", "1")
    assert again.returncode == 0, again.stderr
    assert "the checkpoint is at step 4, the job's last (--steps 4)" in again.stderr
    assert (
        "ps0: the job was done at step 4 (its checkpoint); told the workers that came: worker 0 "
        "of 1 did not join within 1 s" in again.stderr
    )
    # Stopped (SIGTERM) while it waits for them: the job was done, not stopped before it
    # began (`bench chaos --steps`, seed 4421: so said, and no --metrics summary written).
    summary = tmp_path / "ps-again.json"
    stopped = procs.start([sys.executable, *server, "--metrics", str(summary)], log="ps-again")
    try:
        log_has(tmp_path / "ps-again.log", "nothing left to train", timeout=60)
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(30) == 0
    finally:
        procs.kill()
    said = procs.log("ps-again")
    assert (
        "ps0: the job was done at step 4 (its checkpoint); told the workers that came: worker 0 "
        "of 1 did not join before the stop was asked" in said
    ), said
    assert "before the job began" not in said
    assert json.loads(summary.read_text())["steps"] == 4


def test_daemons_checking_one_directory_at_once_do_not_fail_each_other(tmp_path: Path) -> None:
    """Each daemon checks as it starts that it can write where it will write (--metrics,
    --checkpoint-dir, --save-params) by writing a probe file there. The probe was named by its
    pid, which is 1 for every container's daemon, so two that shared a directory (a compose
    volume) removed each other's, and one failed its check ("is not writable: No such file or
    directory": `bench chaos --hosts separate`, seed 2325). Eight threads of one process (so
    of one pid) probing one directory 200 times each all pass, and leave nothing there."""
    import threading

    from tensorwire.job.files import unwritable_directory

    failures: list[str] = []

    def probe() -> None:
        for _ in range(200):
            why = unwritable_directory(str(tmp_path))
            if why is not None:
                failures.append(why)

    threads = [threading.Thread(target=probe) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == []
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("")
    assert unwritable_directory(str(tmp_path / "file")) == "exists and is not a directory"


def test_files_written_whole_by_several_writers_at_once_stay_whole(tmp_path: Path) -> None:
    """A checkpoint, summary or parameter file is written beside its name and renamed over it.
    That file was named by the pid, the same (1) for every container's daemon, so two writing
    one path at once (a server still stopping while its replacement resumed, on one volume)
    wrote into one file. Eight threads of one process (one pid) each writing its own 64 KiB
    of one value into one path 50 times: the file is always one writer's whole, and nothing
    is left beside it."""
    import threading

    from tensorwire.job.files import write_whole

    path = tmp_path / "ckpt.bin"
    failures: list[str] = []

    def writer(value: int) -> None:
        for _ in range(50):
            try:
                write_whole(str(path), lambda f: f.write(bytes([value]) * 65536))
            except OSError as exc:
                failures.append(str(exc))

    threads = [threading.Thread(target=writer, args=(v,)) for v in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failures == []
    data = path.read_bytes()
    assert len(data) == 65536 and data == data[:1] * 65536
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.bin"]


@needs_strace
def test_a_file_written_whole_is_synced_and_then_its_new_name(tmp_path: Path) -> None:
    """A checkpoint reported written must still be there after a crash of the machine. The
    file was synced before its rename, but the rename is an entry of the directory, which that
    sync does not write: a crash could bring back the checkpoint before it. The system calls of
    a real write, under strace: the file's sync, the rename over its name, then the directory's
    sync, in that order, each on the right file."""
    path = tmp_path / "ckpt.npz"
    trace = tmp_path / "trace"
    script = (
        "import sys; from tensorwire.job.files import write_whole; "
        "write_whole(sys.argv[1], lambda f: f.write(b'whole'))"
    )
    calls = "trace=fsync,fdatasync,rename,renameat,renameat2"
    out = subprocess.run(
        ["strace", "-f", "-y", "-e", calls, "-o", str(trace), PY, "-c", script, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert path.read_bytes() == b"whole"
    lines = trace.read_text().splitlines()
    wanted = [
        rf"fsync\(\d+<{re.escape(str(path))}\.tmp-\d+-[0-9a-f]+>\) = 0",
        rf"rename(at2?)?\(.*\.tmp-\d+-[0-9a-f]+\", .*\"{re.escape(str(path))}\".*\) = 0",
        rf"fsync\(\d+<{re.escape(str(tmp_path))}>\) = 0",
    ]
    found = [i for i, line in enumerate(lines) for w in wanted if re.search(w, line)]
    order = [next(k for k, w in enumerate(wanted) if re.search(w, lines[i])) for i in found]
    assert order == [0, 1, 2], "\n".join(lines)


_WRITER_STUCK_MID_WRITE = """
import sys, time
from tensorwire.job.files import write_whole

def write(f):
    f.write(b"partial")
    f.flush()
    print("writing", flush=True)
    time.sleep(120)

write_whole(sys.argv[1], write)
"""


def test_partial_files_of_writers_that_died_are_removed_by_the_next_write(
    tmp_path: Path,
) -> None:
    """A daemon SIGKILLed while it writes a checkpoint leaves its partial file; its name is
    unique, so nothing reused and so removed it, and a job restarted again and again filled
    its volume. The next whole write of that path removes those whose writer died (no lock
    held on them) and that are older than a minute; a live writer's, however old, stays."""
    import signal
    import time

    from tensorwire.job import files

    path = tmp_path / "ckpt.npz"
    writers = []
    for _ in range(2):
        proc = subprocess.Popen(
            [PY, "-c", _WRITER_STUCK_MID_WRITE, str(path)], stdout=subprocess.PIPE, text=True
        )
        writers.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    dead, alive = writers
    try:
        partials = sorted(tmp_path.iterdir())
        assert len(partials) == 2
        dead.send_signal(signal.SIGKILL)
        dead.wait(10)
        dead_partial = next(p for p in partials if f".tmp-{dead.pid}-" in p.name)
        alive_partial = next(p for p in partials if f".tmp-{alive.pid}-" in p.name)
        # A young partial file is kept though its writer died: its age covers a writer's
        # instant between creating its file and locking it.
        young = tmp_path / "ckpt.npz.tmp-7-0badf00d"
        young.write_bytes(b"young")
        files.write_whole(str(path), lambda f: f.write(b"whole"))
        assert sorted(tmp_path.iterdir()) == sorted([path, dead_partial, alive_partial, young])
        hour_ago = time.time() - 3600
        for partial in (dead_partial, alive_partial):
            os.utime(partial, (hour_ago, hour_ago))
        files.write_whole(str(path), lambda f: f.write(b"whole again"))
        assert sorted(tmp_path.iterdir()) == sorted([path, alive_partial, young])
        assert path.read_bytes() == b"whole again"
        assert alive.poll() is None
    finally:
        for proc in writers:
            proc.kill()
            proc.wait(10)
            assert proc.stdout is not None
            proc.stdout.close()


@pytest.mark.parametrize(
    ("servers", "why"),
    [
        ("tcp://nope", "is not an address: use tcp://HOST:PORT$"),
        ("tcp://127.0.0.1:0", "is not an address: use tcp://HOST:PORT$"),  # port 0: not to reach
        ("tcp://127.0.0.1:5,tcp://::1:5", r"an IPv6 address goes in brackets: tcp://\[::1\]:5555"),
    ],
)
def test_a_worker_refuses_a_server_that_is_no_address_at_its_start(servers: str, why: str) -> None:
    """`--servers` is checked as `--bind` is, at the start, naming the flag: before, the first
    connect refused it as a "receiver address"."""
    out = run("-m", "tensorwire", "worker", "--servers", servers, "--no-progress")
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("tensorwire worker: error: --servers "), last
    assert re.search(why, last), last


FACTORIES = """
def fails(job):
    raise RuntimeError("the user's bug")

def takes_nothing():
    return None
"""


@pytest.mark.parametrize(
    ("module", "factory", "says"),
    [
        (FACTORIES, "fails", r"failed: RuntimeError: the user's bug \(at .*factories\.py:3\)"),
        (FACTORIES, "takes_nothing", r"TypeError: .*\(a factory is called as factory\(job\)"),
        ("def x(:\n", "x", r"cannot import .*: SyntaxError: .*line 1"),
        ("1 / 0\n", "x", r"cannot import .*: ZeroDivisionError: .*\(at .*factories\.py:1\)"),
    ],
    ids=["raises", "signature", "syntax", "at-import"],
)
def test_a_user_factory_that_fails_is_one_line_saying_where(
    tmp_path: Path, module: str, factory: str, says: str
) -> None:
    """The user's code failing (as the worker imports it, or builds the model) is one line that
    says what and where, before the worker reaches for a server. Before, an import that failed
    was a traceback, and a factory's failure said only its exception's repr."""
    (tmp_path / "factories.py").write_text(module)
    out = run(
        "-m", "tensorwire.client.worker", "--servers", "tcp://127.0.0.1:1",
        "--model", f"{tmp_path / 'factories.py'}:{factory}", "--no-progress",
    )  # fmt: skip
    assert out.returncode in (1, 2) and "Traceback" not in out.stderr, out.stderr
    assert re.search(says, out.stderr.strip().splitlines()[-1]), out.stderr


def test_bench_run_where_nothing_serves_is_one_line_at_once() -> None:
    """`bench run --connect` to a port where nothing listens: ZeroMQ retried for ever and the
    hello waited 120 s, then the set-up's goodbye 120 s more, without a word; now one line (the
    subprocess's 60 s timeout guards the wait)."""
    out = run(
        "-m", "tensorwire.bench", "run", "--connect", f"tcp://127.0.0.1:{free_port()}",
        "--sizes", "4K", "--repeat", "1", "--no-progress",
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert "no benchmark peer at" in last and "Connection refused" in last, out.stderr


def test_the_ping_startup_benchmark_times_pings_against_a_live_receiver(tmp_path: Path) -> None:
    path = tmp_path / "ping.json"
    out = run("-m", "tensorwire.bench.startup", "--runs", "2", "--json", str(path))
    assert out.returncode == 0, out.stderr
    written = json.loads(path.read_text())
    assert written["kind"] == "ping-startup" and len(written["rows"]) == 1
    assert len(written["rows"][0]["seconds"]) == 2 and written["rows"][0]["median"] > 0
    assert "median" in out.stdout


def test_the_registration_benchmark_measures_times_and_the_heap_held(tmp_path: Path) -> None:
    """Every message of each of 50 tensors lands (the benchmark waits for them); with
    ``--memory`` it also says what the receiver's tensors hold of the Python heap, and with
    ``--large-mib`` how long another tensor's traffic paused while large ones were registered."""
    path = tmp_path / "registration.json"
    out = run(
        "-m", "tensorwire.bench.registration", "--tensors", "50", "--repeat", "1", "--memory",
        "--large-mib", "1", "--json", str(path),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    written = json.loads(path.read_text())
    assert written["kind"] == "registration" and len(written["runs"]) == 1
    assert set(written["runs"][0]) == {
        "register_s", "connect_s", "first_writes_s", "steady_batch_s", "first_batch_s"
    }  # fmt: skip
    memory = written["memory"]
    assert 0 < memory["heap_registered_mib"] <= memory["heap_written_mib"], memory
    assert memory["gc_objects"] > 0 and "python heap" in out.stdout
    [stall] = written["stalls"]
    assert stall["stall_idle_ms"] > 0 and stall["stall_registering_ms"] > 0, stall
    assert stall["register_large_s"] > 0 and "longest pause" in out.stdout


@pytest.mark.parametrize("damage", ["truncated", "empty", "random bytes", "a flipped byte"])
def test_a_damaged_checkpoint_is_refused_in_one_line(tmp_path: Path, damage: str) -> None:
    """A checkpoint is renamed into place whole, but a disk, a copy by hand or a full volume
    can still damage it: --resume (and --resume-if-present, as Kubernetes restarts a server)
    was zipfile's BadZipFile or an EOFError in a traceback, and random bytes made numpy advise
    allowing pickles. Each is one line naming the file and what to do, exit 1."""
    from tensorwire.server import checkpoint

    path = tmp_path / "ps-shard0.npz"
    params = {"w": np.arange(4096, dtype=np.float32)}
    checkpoint.save(str(path), 7, params, {}, "any", {"w": ((4096,), "float32")})
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    elif damage == "random bytes":
        data = bytearray(np.random.default_rng(0).integers(0, 256, len(data), np.uint8))
    else:
        at = data.index(np.arange(4096, dtype=np.float32)[1000:1004].tobytes())
        data[at] ^= 0xFF  # a parameter's byte: only the archive's CRC can tell
    path.write_bytes(bytes(data))
    if damage == "a flipped byte":  # read past the fingerprint (the daemon's would not match)
        with pytest.raises(ValueError, match=r"damaged or no checkpoint \(BadZipFile: Bad CRC"):
            checkpoint.load(str(path), "any")
        return
    for resume in ("--resume", "--resume-if-present"):
        out = run(
            *("-m", "tensorwire.server.daemon", resume, "--checkpoint-dir", str(tmp_path)),
            *("--bind", f"tcp://127.0.0.1:{free_port()}", "--join-timeout", "5", "--no-progress"),
        )
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        last = out.stderr.strip().splitlines()[-1]
        assert f"checkpoint {path} is damaged or no checkpoint" in last, last
        assert "allow_pickle" not in last and "move it away to start afresh" in last, last


def _children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(k) for k in f.read().split()]
    except OSError:
        return []


def _descendants_of(pid: int) -> list[int]:
    """Its children, theirs, and so on (bounded by the processes there are)."""
    found, todo = [], _children_of(pid)
    while todo:
        kid = todo.pop()
        found.append(kid)
        todo.extend(_children_of(kid))
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie no one reaped has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _receivers_among(pids: list[int]) -> int:
    """How many of ``pids`` own a shared-memory segment: a receiver made, so well past the
    start where the process asks to die with its parent."""
    names = os.listdir("/dev/shm")
    return sum(any(n.startswith(f"tensorwire.{os.getuid()}.{p}.") for n in names) for p in pids)


@pytest.mark.parametrize(
    ("args", "children", "receivers"),
    [
        # the sweep's receiving peer (multiprocessing), which waited for commands for ever
        (["--sizes", "4K", "--transports", "shm", "--repeat", "100000", "--no-progress"], 1, 1),
        # a job's daemons (subprocess), which ran on to the job's end
        (["ps", "--steps", "1000000", "--transports", "shm", "--workers", "2"], 3, 3),
        # a sender on a host of its own: unshare (asked to die by setpriv before it runs), and
        # the sender it runs (killed with it by its --kill-child from the fork on)
        pytest.param(
            ["soak", "--hosts", "separate", "--transports", "tcp", "--senders", "1"],
            2,
            0,
            marks=needs_pid_namespaces,
        ),
    ],
    ids=["sweep", "ps", "soak-separate-hosts"],
)
def test_a_benchmark_killed_takes_its_children_with_it(
    args: list[str], children: int, receivers: int, tmp_path: Path
) -> None:
    """A benchmark SIGKILLed (the OOM killer, `timeout -s KILL`) left its children running:
    the sweep's peer held its shared memory and waited for ever (two were found 7 minutes
    on, by a run of every flag with odd values), and a child frozen at that moment stayed
    stopped. They now die with it (PR_SET_PDEATHSIG), frozen too, as here."""
    log = tmp_path / "bench.log"
    with open(log, "wb") as out:
        bench = subprocess.Popen(
            [PY, "-m", "tensorwire.bench", *args], stdout=out, stderr=subprocess.STDOUT
        )
    kids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        # Each child past the start of its program, where it asks to die with its parent: one
        # frozen before that stays stopped (a fresh clone's run, under load, froze the daemons
        # of `ps` within the 1 s this waited before, still importing)
        while (
            len(kids) < children or _receivers_among(kids) < receivers
        ) and time.monotonic() < deadline:
            assert bench.poll() is None, log.read_text()
            time.sleep(0.1)
            kids = _descendants_of(bench.pid)
        assert len(kids) >= children, f"it started {kids}: {log.read_text()}"
        assert _receivers_among(kids) >= receivers, f"{kids}: {log.read_text()}"
        time.sleep(0.5)  # (unshare, which setpriv runs: a C program, at once)
        kids = _descendants_of(bench.pid)
        for k in kids:  # frozen, as a fault of soak or chaos leaves one: only a kill ends it
            with contextlib.suppress(OSError):  # (one that ended meanwhile)
                if b"resource_tracker" in Path(f"/proc/{k}/cmdline").read_bytes():
                    continue  # (multiprocessing's: it ends as its pipe closes, unless frozen)
                os.kill(k, signal.SIGSTOP)
    finally:
        bench.kill()
        bench.wait()
    deadline = time.monotonic() + 10
    while any(map(_running, kids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [k for k in kids if _running(k)]
    for k in alive:  # (so that a failure leaves nothing behind either)
        with contextlib.suppress(ProcessLookupError):
            os.kill(k, signal.SIGKILL)
    assert not alive, f"children left running after the benchmark was killed: {alive}"


def test_a_daemon_follows_only_the_launcher_that_is_its_parent() -> None:
    """The variable a launcher sets for its daemons (TENSORWIRE_DIE_WITH_PARENT) reached a
    daemon started through a shell in between, which then killed itself at once: its parent
    was not the launcher, which die_with_parent read as a launcher already dead. Now a running
    launcher that is not the parent is not followed; a direct one, and one that is gone, are."""
    code = (
        "from tensorwire.process import die_with_launcher; die_with_launcher(); "
        "print('alive', flush=True)"
    )
    env = {**os.environ, "TENSORWIRE_DIE_WITH_PARENT": str(os.getpid())}
    via_shell = subprocess.run(
        ["sh", "-c", f'"{PY}" -c "{code}"; true'],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert via_shell.stdout.strip() == "alive", via_shell
    direct = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert direct.stdout.strip() == "alive", direct
    gone = subprocess.Popen([PY, "-c", "pass"])
    gone.wait()
    orphan = subprocess.run(
        [PY, "-c", code],
        env={**env, "TENSORWIRE_DIE_WITH_PARENT": str(gone.pid)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert orphan.returncode == -signal.SIGKILL and not orphan.stdout, orphan
