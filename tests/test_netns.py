"""Across hosts: three network namespaces joined by veth links, one server and two workers over
tcp (one worker's link goes down and comes back), over nixl restricted to UCX's TCP transport,
and with one worker behind a slow link that drops packets (tcp, grpc-stream, nixl).
Needs root and iproute2 (skipped, with the reason, where they are missing); the namespaces are
removed afterwards, even when the test fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .jobs import log_has
from .netns import ip, namespaces

NET = "10.231"  # addresses inside this test's own namespaces only


@pytest.fixture
def hosts() -> Iterator[dict[str, str]]:
    tag = f"tw{os.getpid() % 100000}"
    links = [("ps", f"{NET}.{k}.1/24", f"w{k}", f"{NET}.{k}.2/24") for k in (0, 1)]
    with namespaces(tag, ["ps", "w0", "w1"], links) as made:
        yield {**made, "tag": tag}


def _start(
    procs: list[subprocess.Popen[bytes]], tmp: Path, ns: str, log: str, *args: str
) -> subprocess.Popen[bytes]:
    """Run ``python -m ARGS`` inside network namespace ``ns``, output to ``tmp/log``."""
    out = open(tmp / log, "w")  # noqa: SIM115 - handed to the process
    p = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    out.close()
    procs.append(p)
    return p


def _server(steps: int, *extra: str) -> list[str]:
    """The server of a two-worker job, listening on every interface of its namespace."""
    return [
        "tensorwire.server.daemon",
        "--bind",
        "tcp://0.0.0.0:5700",
        "--workers",
        "2",
        "--steps",
        str(steps),
        "--no-progress",
        *extra,
    ]


def _worker(k: int, *extra: str) -> list[str]:
    """A worker of a two-worker job, in namespace w{k}, reaching the server over its veth."""
    return [
        "tensorwire.client.worker",
        "--servers",
        f"tcp://{NET}.{k}.1:5700",
        "--rank",
        str(k),
        "--workers",
        "2",
        "--bind",
        "tcp://0.0.0.0:0",
        "--advertise",
        f"{NET}.{k}.2",
        "--no-progress",
        *extra,
    ]


def _secret_flags(tmp_path: Path) -> list[str]:
    """The daemons' flags for a shared secret in a file of the test's own (needed beyond
    loopback)."""
    secret = tmp_path / "secret"
    secret.write_text("netns-secret\n")
    return ["--secret-file", str(secret)]


def _job_to_its_end(
    hosts: dict[str, str],
    tmp_path: Path,
    server: list[str],
    worker: list[str],
    wait: float = 120.0,
) -> tuple[list[int], dict[str, str]]:
    """Run ``server`` (its command, `_server`) in namespace ps and workers 0 and 1 (flags
    ``worker``) in theirs until each exits (within ``wait`` s); their exit codes (server
    first) and their logs by name (ps, w0, w1). Kills what still runs."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        _start(procs, tmp_path, hosts["ps"], "ps.log", *server)
        for k in (0, 1):
            _start(procs, tmp_path, hosts[f"w{k}"], f"w{k}.log", *_worker(k, *worker))
        codes = [p.wait(wait) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    return codes, {name: (tmp_path / f"{name}.log").read_text() for name in ("ps", "w0", "w1")}


@pytest.mark.parametrize("cut", ["w1", "ps"])
def test_link_down_is_detected_and_the_workers_rejoin(
    hosts: dict[str, str], tmp_path: Path, cut: str
) -> None:
    """``w1``: worker 1's link goes down (its process runs on); ``ps``: the server's links to
    both workers (a server cut off while every process runs: each side judges the other
    silent at once). The server loses the workers cut off within the heartbeat timeout and
    goes on (or waits for one to come back); the workers lose the server, reconnect once the
    links are up again and join again, and the job trains on and ends cleanly."""
    common = [
        "--transport",
        "tcp",
        *_secret_flags(tmp_path),
        "--heartbeat",
        "0.3",
        "--heartbeat-timeout",
        "2",
        "--log-level",
        "INFO",
    ]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ps = _start(
            procs,
            tmp_path,
            hosts["ps"],
            "ps.log",
            *_server(1000000, *common),
        )
        for k in (0, 1):
            _start(
                procs,
                tmp_path,
                hosts[f"w{k}"],
                f"w{k}.log",
                *_worker(k, "--reconnect-timeout", "60", *common),
            )
        log = tmp_path / "ps.log"
        log_has(log, "worker 1 joined", 60)
        time.sleep(1.0)
        tag = hosts["tag"]
        links = [("w1", f"{tag}v1b")] if cut == "w1" else [("ps", f"{tag}v0a"), ("ps", f"{tag}v1a")]
        cut_off = [1] if cut == "w1" else [0, 1]
        for ns, link in links:
            ip("-n", hosts[ns], "link", "set", link, "down")
        for k in cut_off:
            detected = log_has(log, f"worker {k} lost", 30)
            assert detected < 2 + 3  # the heartbeat timeout, plus a step and a tick
        for k in cut_off:  # each worker judges the server silent too, while the links are down
            log_has(tmp_path / f"w{k}.log", "lost a parameter server", 30)
        for ns, link in links:
            ip("-n", hosts[ns], "link", "set", link, "up")
        for k in cut_off:
            log_has(log, f"worker {k} rejoined", 60)
        time.sleep(1.0)
        ps.send_signal(signal.SIGTERM)
        codes = [p.wait(60) for p in procs]
        assert codes == [0, 0, 0], log.read_text()
        for k in cut_off:
            assert "rejoined the parameter servers" in (tmp_path / f"w{k}.log").read_text()
        steps = int(log.read_text().rsplit("done at step ", 1)[1].split(":")[0])
        lost_at = int(log.read_text().split(f"worker {cut_off[-1]} lost at step ")[1].split()[0])
        assert steps > lost_at, (steps, lost_at)  # it trained on after the links came back
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


@pytest.mark.nixl
def test_nixl_job_across_namespaces_over_ucx_tcp(hosts: dict[str, str], tmp_path: Path) -> None:
    """nixl between "hosts": UCX restricted to TCP over the veth links (what it would use
    between machines without an RDMA NIC); a short job trains and every daemon exits cleanly."""
    common = ["--transport", "nixl", "--ucx-tls", "tcp", *_secret_flags(tmp_path)]
    codes, logs = _job_to_its_end(hosts, tmp_path, _server(40, *common), common)
    assert codes == [0, 0, 0], logs["ps"] + logs["w0"]
    assert "joined from" in logs["ps"] and "over nixl" in logs["ps"]
    assert "done at step 40" in logs["ps"]


#: worker 1's link, both ways: 4 Mbit/s with a 12 KB queue, every packet beyond it dropped (tbf;
#: this kernel has no netem): a slow link that drops what a burst overflows, as a congested
#: uplink with shallow buffers does. A 2 MB stream through it had 606 of its 1,998 packets
#: dropped (docs/lossy-link-2026-12-02/stream.sh).
SLOW_LOSSY = ("tbf", "rate", "4mbit", "burst", "8kb", "limit", "12kb")
#: the job's steps (TW_SLOW_LINK_STEPS for longer runs by hand, as RELIABILITY.md quotes)
SLOW_STEPS = int(os.environ.get("TW_SLOW_LINK_STEPS", "40"))
#: TCP's congestion control in the three namespaces: BBR, this VM's default, sends on through
#: loss at the rate it measured, so the link drops a third of a stream; a loss-based one (reno,
#: cubic) backs off, and 150 steps over reno had 21 drops over `tcp` (TW_SLOW_LINK_CC=reno;
#: docs/lossy-link-2026-12-02), too few for a test of loss.
SLOW_CC = os.environ.get("TW_SLOW_LINK_CC", "bbr")


def _tc(ns: str, *args: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "tc", *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout


def _slow_link_to_worker_1(hosts: dict[str, str]) -> list[tuple[str, str]]:
    """SLOW_LOSSY on both ends of worker 1's link; those ends, (namespace, device)."""
    tag = hosts["tag"]
    shaped = [(hosts["ps"], f"{tag}v1a"), (hosts["w1"], f"{tag}v1b")]
    for ns, dev in shaped:
        _tc(ns, "qdisc", "add", "dev", dev, "root", *SLOW_LOSSY)
    return shaped


@pytest.mark.parametrize(
    "transport", ["tcp", "grpc-stream", pytest.param("nixl", marks=pytest.mark.nixl)]
)
def test_a_worker_behind_a_slow_link_that_drops_packets_trains_to_the_end(
    hosts: dict[str, str], tmp_path: Path, transport: str
) -> None:
    """Worker 1 reaches the server through a slow link that drops packets (SLOW_LOSSY, both
    ways; nixl with UCX on TCP); the bsp job trains every step at that link's pace and ends
    cleanly, no peer judged lost, the link having dropped packets on the way."""
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().split()
    if SLOW_CC not in allowed:
        pytest.skip(f"TCP congestion control {SLOW_CC} is not allowed here (only {allowed})")
    for name in ("ps", "w0", "w1"):
        ip(
            "netns",
            "exec",
            hosts[name],
            "sysctl",
            "-qw",
            f"net.ipv4.tcp_congestion_control={SLOW_CC}",
        )
    shaped = _slow_link_to_worker_1(hosts)
    common = ["--transport", transport, *_secret_flags(tmp_path), "--log-level", "INFO"]
    if transport == "nixl":
        common += ["--ucx-tls", "tcp"]
    codes, logs = _job_to_its_end(
        hosts, tmp_path, _server(SLOW_STEPS, *common), common, wait=60 + SLOW_STEPS
    )
    log = logs["ps"]
    assert codes == [0, 0, 0], log + logs["w1"]
    assert f"done at step {SLOW_STEPS}" in log, log
    assert not any(" lost" in text for text in logs.values()), logs
    stats = [_tc(ns, "-s", "qdisc", "show", "dev", dev) for ns, dev in shaped]
    dropped = [int(s.split("dropped ", 1)[1].split(",", 1)[0]) for s in stats]
    print(transport, log.rsplit("done at step ", 1)[1].splitlines()[0], "dropped", dropped)
    assert sum(dropped) > 0, dropped


def test_a_worker_whose_link_is_too_slow_for_the_step_timeout_is_gone_on_without_and_told_why(
    hosts: dict[str, str], tmp_path: Path
) -> None:
    """Worker 1's steps take longer over its slow link (SLOW_LOSSY: 38 KB of parameters alone
    take 77 ms) than the server's --step-timeout (50 ms): the server goes on without it, and the
    worker is told so with the causes that fit, its link among them (before: "heard nothing
    from us in time ... stopped, or its machine overloaded?", where the server had dropped it
    for taking no parameters in time), joins again, and every daemon exits 0 at the job's end.
    Lost again within a step of each join, it takes part a step a join: the server's log says
    once that its steps take longer than the timeout (before, only each loss)."""
    _slow_link_to_worker_1(hosts)
    common = ["--transport", "tcp", *_secret_flags(tmp_path), "--log-level", "INFO"]
    server = _server(2000, *common, "--step-timeout", "0.05")
    # (--reconnect-timeout: a worker the ending server did not tell ends within the wait)
    codes, logs = _job_to_its_end(hosts, tmp_path, server, [*common, "--reconnect-timeout", "20"])
    log, w1 = logs["ps"], logs["w1"]
    assert codes == [0, 0, 0], log + w1
    assert "done at step 2000" in log, log
    assert "worker 1 lost at step" in log, log
    told = [ln for ln in w1.splitlines() if "went on without this worker" in ln]
    assert told and "link too slow" in told[0], w1
    # lost again and again within a step of joining: the server says why, once a streak
    losses = log.count("worker 1 lost at step")
    hints = log.count("was lost 3 times in a row past --step-timeout (0.05 s)")
    assert 1 <= hints <= losses // 3, log
