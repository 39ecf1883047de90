"""Launching a whole parameter-server job on this machine: S server daemons and N worker daemons,
started exactly as an operator would start them, and their metrics collected. Used by the demo and
by ``tensorwire bench ps``."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import tensorwire as tw
from tensorwire.process import for_my_children

#: The lowest port :func:`free_port` hands out (beneath the kernel's ephemeral range)
FREE_PORTS_FROM = 10000
#: free_port's own draw (the random module's is seeded by whoever seeds it: a test, a benchmark)
_PORT_DRAW = random.Random()
#: Ports free_port has handed out in this process: a port that is free now is free until its
#: daemon binds it, so two draws a moment apart (a job's servers, a server's control plane and
#: its metrics) could otherwise hand out the same one, and the second daemon to bind it fails
#: (or, where one binds it on every interface, a client reaches the wrong service)
_HANDED_OUT: set[int] = set()


def ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections and binds to port 0."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


#: The variable that confines :func:`free_port` to ``LOW-HIGH`` (inclusive): the ports a firewall
#: leaves open, or a range of a test worker's own that the daemons it starts inherit
PORT_RANGE_VARIABLE = "TENSORWIRE_FREE_PORTS"


def port_range() -> tuple[int, int, bool]:
    """The ports :func:`free_port` draws from, ``[low, high)``, and whether an operator chose
    them (``TENSORWIRE_FREE_PORTS=LOW-HIGH``); by default those beneath the ephemeral range.
    A value that is no such range raises TensorWireError naming the variable."""
    value = os.environ.get(PORT_RANGE_VARIABLE, "").strip()
    if not value:
        return FREE_PORTS_FROM, ephemeral_low(), False
    low_text, dash, high_text = value.partition("-")
    try:
        low, high = int(low_text), int(high_text)
    except ValueError:
        low, high = 0, -1
    if not dash or not 1 <= low <= high <= 65535:
        raise tw.TensorWireError(
            f"{PORT_RANGE_VARIABLE}={value!r} is not a range of ports LOW-HIGH (1-65535)"
        )
    return low, high + 1, True


def free_port(part: int = 0, parts: int = 1) -> int:
    """A loopback port that nothing listens on now, for a daemon to bind a moment later.

    Drawn from beneath the kernel's ephemeral range: a port the kernel hands out (a bind to
    port 0) lies in that range, where any process's outgoing connection may take it before the
    daemon binds it (the test suite met "cannot bind the control plane to ...: Address already
    in use" so); no connection's own end is given a port below it. ``TENSORWIRE_FREE_PORTS``
    chooses another range (:func:`port_range`); the processes a caller starts inherit it, so
    that a job's launcher draws from its caller's range. Callers that hand out ports side by
    side (pytest-xdist's workers) each draw from ``part`` of ``parts`` ranges, so that they
    never hand out the same one; nor does one process hand out a port twice, until it has
    no other left (then it starts afresh). An operator's range with no free port left raises
    TensorWireError."""
    low, high, chosen = port_range()
    parts = max(parts, 1)
    span = (high - low) // parts
    if span >= 100 or (chosen and span >= 1):
        base = low + (part % parts) * span
        for _ in range(2):  # bounded: once more after forgetting what was handed out
            port = _draw_free(range(base, base + span), everyone=chosen)
            if port is not None:
                _HANDED_OUT.add(port)
                return port
            _HANDED_OUT.clear()
        if chosen:
            raise tw.TensorWireError(
                f"no free port left in {PORT_RANGE_VARIABLE} ({low}-{high - 1})"
            )
    with socket.socket() as s:  # a kernel range reaching that low: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _draw_free(ports: range, everyone: bool) -> int | None:
    """A port of ``ports`` not handed out yet that nothing listens on: a hundred random draws,
    then (``everyone``) each port in turn; None if none is."""

    def draws() -> Iterator[int]:  # lazily: the first draw is nearly always free
        for _ in range(100):
            yield _PORT_DRAW.randrange(ports.start, ports.stop)
        if everyone:  # (a shuffle of the whole range: milliseconds, so only when needed)
            yield from _PORT_DRAW.sample(ports, len(ports))

    for port in draws():  # bounded: ports handed out or taken are skipped
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    return None


def ps_command(
    bind: str, *flags: str, shard: int = 0, shards: int = 1, workers: int = 1
) -> list[str]:
    """The command line of one server daemon of a job (``flags`` appended as given)."""
    return [
        sys.executable,
        "-m",
        "tensorwire.server.daemon",
        "--bind",
        bind,
        "--shard",
        str(shard),
        "--shards",
        str(shards),
        "--workers",
        str(workers),
        *flags,
    ]


def worker_command(servers: list[str], *flags: str, rank: int = 0, workers: int = 1) -> list[str]:
    """The command line of one worker daemon of a job (``flags`` appended as given)."""
    return [
        sys.executable,
        "-m",
        "tensorwire.client.worker",
        "--servers",
        ",".join(servers),
        "--rank",
        str(rank),
        "--workers",
        str(workers),
        *flags,
    ]


#: How much of the end of a daemon's log a failed job's report shows
LOG_TAIL_CHARS = 600


def failure_report(
    transport: str, codes: dict[str, int | None], logs: dict[str, str], timeout: float
) -> str:
    """What a failed job's error says: which daemons exited with which code, which were still
    running (stopped by the launcher, or by its ``timeout``), and the end of the logs of the
    ones to blame, each message once. A mistake every worker makes (a ``--batch`` larger than
    each worker's shard) fails them all with one message that differs only in their numbers:
    it is shown once, with the names of the daemons that said it, not once a worker."""
    exited = {n: c for n, c in codes.items() if c not in (0, None)}
    running = [n for n, c in codes.items() if c is None]
    by_code: dict[int, list[str]] = {}
    for n, c in exited.items():
        by_code.setdefault(c, []).append(n)
    parts = [f"{names_of(ns)} {ended_how(c)}" for c, ns in by_code.items()]
    if exited:
        head = f"{transport} job failed: {'; '.join(parts)}"
        if running:
            head += f"; stopped as it failed: {names_of(running)}"
        blamed = list(exited)
    else:
        head = f"{transport} job did not end within {timeout:g} s: stopped {names_of(running)}"
        blamed = running
    tails = {n: logs.get(n, "")[-LOG_TAIL_CHARS:].strip() for n in blamed}
    # one entry a message, its numbers aside (ranks, shard sizes), in the daemons' order
    said: dict[str, list[str]] = {}
    for n, tail in tails.items():
        said.setdefault(re.sub(r"\d+", "#", tail), []).append(n)
    lines = [head + ":"]
    for ns in said.values():
        who = ns[0] if len(ns) == 1 else f"{ns[0]} (and {names_of(ns[1:])} alike)"
        lines.append(f"{who}: {tails[ns[0]] or '(nothing in its log)'}")
    return "\n".join(lines)


def ended_how(code: int) -> str:
    """A daemon's return code in words: ``exited 1``, ``killed by SIGKILL``."""
    if code >= 0:
        return f"exited {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def names_of(names: list[str]) -> str:
    """Daemons' names, with a run of three or more consecutive ranks given as its ends:
    ``w0-w63``, ``ps0, ps1``."""
    out: list[str] = []
    run: list[tuple[str, int]] = []

    def flush() -> None:
        if len(run) >= 3:
            out.append(f"{run[0][0]}{run[0][1]}-{run[-1][0]}{run[-1][1]}")
        else:
            out.extend(f"{p}{k}" for p, k in run)
        run.clear()

    for name in names:
        m = re.fullmatch(r"(\D*)(\d+)", name)
        if m is None:
            flush()
            out.append(name)
            continue
        prefix, k = m.group(1), int(m.group(2))
        if run and not (run[-1][0] == prefix and run[-1][1] + 1 == k):
            flush()
        run.append((prefix, k))
    flush()
    return ", ".join(out)


@dataclass
class JobResult:
    transport: str
    servers: list[dict[str, Any]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def steps_per_s(self) -> float:
        return min(s["steps_per_s"] for s in self.servers)

    @property
    def accuracy(self) -> float:
        return float(self.workers[0]["test_accuracy"])


def job_environment() -> dict[str, str]:
    """The environment of a job's daemons on one machine: this process's, with the settings
    below unless it sets them."""
    # Every process of the job shares this machine's cores: one BLAS thread each, or N + S
    # processes would each start a thread per core and fight over them.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}
    # They die with this process however it dies (a launcher SIGKILLed left them running to
    # the job's end, or for ever where one was frozen)
    env = for_my_children(env)
    # glibc serves a large allocation with mmap (faulting in and zeroing every page) or from
    # its heap depending on a threshold that moves with the process's allocation history, so
    # a baseline that allocates per message (gRPC's protobuf bytes) ran 1.7x slower or not
    # depending on what the job did at start. A fixed threshold makes the baselines fast and
    # reproducible; tensorwire's transports allocate nothing per message and do not care.
    for knob, value in (
        ("MALLOC_MMAP_THRESHOLD_", 64 << 20),
        ("MALLOC_TRIM_THRESHOLD_", 256 << 20),
    ):
        env.setdefault(knob, str(value))
    return env


def run_job(
    *,
    transport: str,
    steps: int,
    workers: int = 2,
    servers: int = 1,
    model: str = "digits",
    ps_args: list[str] | None = None,
    worker_args: list[str] | None = None,
    progress: bool = False,
    timeout: float = 1800.0,
) -> JobResult:
    """Run one job to completion; raise RuntimeError (with the logs' tails) if any process fails."""
    addresses = [f"tcp://127.0.0.1:{free_port()}" for _ in range(servers)]
    common = ["--transport", transport, "--log-level", "WARNING"]
    with tempfile.TemporaryDirectory(prefix="tensorwire-job-") as tmp:
        cmds = []
        for s, addr in enumerate(addresses):
            cmd = ps_command(
                addr,
                "--steps",
                str(steps),
                "--metrics",
                f"{tmp}/ps{s}.json",
                *common,
                *(ps_args or []),
                shard=s,
                shards=servers,
                workers=workers,
            )
            if not (progress and s == 0):
                cmd.append("--no-progress")
            cmds.append((f"ps{s}", cmd))
        for r in range(workers):
            cmd = worker_command(
                addresses,
                "--no-progress",
                "--metrics",
                f"{tmp}/w{r}.json",
                "--model",  # the servers learn it from the workers
                model,
                *common,
                *(worker_args or []),
                rank=r,
                workers=workers,
            )
            cmds.append((f"w{r}", cmd))
        env = job_environment()
        procs = []
        for name, cmd in cmds:
            err = open(os.path.join(tmp, f"{name}.log"), "w")  # noqa: SIM115
            show = progress and name == "ps0"
            procs.append((name, subprocess.Popen(cmd, stderr=None if show else err, env=env)))
            err.close()
        deadline = time.monotonic() + timeout
        try:
            # Poll them all: when one fails the others are stopped at once, not left waiting
            # out their own timeouts.
            while any(p.poll() is None for _, p in procs):
                if any(p.poll() for _, p in procs) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            codes = {name: p.poll() for name, p in procs}
        finally:
            for _, p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(c != 0 for c in codes.values()):  # None: still running at the timeout
            logs = {}
            for n in codes:
                path = os.path.join(tmp, f"{n}.log")
                if progress and n == "ps0":  # (shown, not logged: "nothing in its log" misled)
                    logs[n] = "(its output is above)"
                elif os.path.exists(path):
                    with open(path) as f:
                        logs[n] = f.read()
            raise RuntimeError(failure_report(transport, codes, logs, timeout))
        result = JobResult(transport)
        for s in range(servers):
            with open(f"{tmp}/ps{s}.json") as f:
                result.servers.append(json.load(f))
        for r in range(workers):
            with open(f"{tmp}/w{r}.json") as f:
                result.workers.append(json.load(f))
        return result


#: the servers' flags :func:`run_job` sets itself (from its caller's own options)
JOB_PS_FLAGS = ("--steps", "--workers", "--transport", "--shards", "--shard", "--bind", "--metrics")
#: the workers' flags :func:`run_job` sets itself
JOB_WORKER_FLAGS = ("--servers", "--rank", "--workers", "--transport", "--metrics", "--model")


def daemon_flags(
    text: str,
    daemon: str,
    fail: Callable[[str], NoReturn],
    owned: tuple[str, ...] = (),
    owner: str = "",
) -> tuple[list[str], argparse.Namespace]:
    """The flags of ``text`` (``--ps-args``, ``--worker-args``: for ``daemon``, ``ps`` or
    ``worker``), split as a shell would, checked against the daemon's own parser now, and what
    that parser made of them; ``fail`` is called with a one-line message where they are not
    flags the daemon takes, or name one of ``owned``, which ``owner`` (a command) sets itself.
    Otherwise each daemon the job starts fails with them, after its whole usage; and a flag the
    job sets, given again, would have changed the servers alone (a --transport the workers do
    not use, say)."""
    try:
        flags = shlex.split(text)
    except ValueError as exc:
        fail(f"--{daemon}-args {text!r}: {exc}")
    for flag in flags:
        if flag.split("=")[0] in owned:
            fail(
                f"--{daemon}-args: {flag.split('=')[0]} is one {owner} sets for each job it "
                f"starts (its own options: {owner} --help)"
            )
    if daemon == "ps":
        from tensorwire.server.daemon import build_parser
    else:
        from tensorwire.client.worker import build_parser
    own = build_parser(f"tensorwire-{daemon}")
    own.error = lambda message: fail(f"--{daemon}-args: {message}")
    known, unknown = own.parse_known_args(flags)
    if unknown:
        fail(f"--{daemon}-args: tensorwire-{daemon} has no {' '.join(unknown)}")
    return flags, known
