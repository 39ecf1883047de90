"""``tensorwire bench chaos``: a parameter-server job that must keep training while its daemons
are killed, frozen, stopped and restarted at random, one disruption at a time.

The job is what an operator runs (``tensorwire-ps`` and ``tensorwire-worker`` processes on
loopback, started from the same command lines as ``tensorwire bench ps``), with short timeouts so
that each fault is noticed within seconds. After each disruption the daemon is brought back as an
orchestrator would (the same command; a server with ``--resume-if-present``) and every server must
write two more checkpoints within ``--stall`` seconds: the job went on training. At the end the
servers get SIGTERM and every daemon alive must exit 0; rank 0's test accuracy must reach
``--min-accuracy``. Exit status 1 on any violation, with the daemons' logs kept and named.

What the faults are (``--events``):

- ``kill-worker``: SIGKILL a worker, start it again after a short pause;
- ``freeze-worker``: SIGSTOP a worker for up to twice the servers' ``--step-timeout`` (so that it
  is sometimes dropped and must join again by itself), then SIGCONT;
- ``stop-worker``: SIGTERM a worker (it leaves the job and exits 0), start it again. Where
  the workers run as ``deploy/k8s`` runs them (``--worker-args="--on-sigterm restart"``), the
  SIGTERM is an eviction: the worker leaves saying it will be back, and exits 143;
- ``drain-worker``: SIGTERM a worker as ``stop-worker`` does, and leave it out (its node
  drained) while other faults come, until the next ``drain-worker`` starts it again (at most one
  is out at a time); at the end it is started again (with ``--steps``, after the job's end: it
  must hear so). Not among the default events. Under ``asp`` and ``ssp`` a ``stop-worker`` that
  would take the last worker still in the job starts the drained one again instead: such a job
  ends once every worker has left on its own;
- ``kill-server``: SIGKILL a server, start it again with ``--resume-if-present``;
- ``move-server``: SIGTERM a server run with ``--on-sigterm restart`` (as an orchestrator moves
  one: it checkpoints where the job is and exits 0, the workers not told), start it again with
  ``--resume-if-present``. Not among the default events; with it, every server runs so, and
  the run ends the job (without ``--steps``) with a SIGINT, which always stops it;
- ``freeze-server``: SIGSTOP a server for up to ``--step-timeout``, then SIGCONT;
- ``cut-connections``: reset every TCP connection of a daemon, server or worker (``ss -K``, as a
  firewall, a dying NAT entry or a peer's restarted network would): its control connections,
  which ZeroMQ makes again by itself, its heartbeats, its data connections (``tcp``, gRPC's,
  UCX's); the daemon runs on. Needs root and a kernel that destroys sockets
  (``CONFIG_INET_DIAG_DESTROY``). Not among the default events.

With ``--hosts separate`` every daemon runs in a pid and mount namespace of its own (root and
util-linux's ``unshare``), so that each sees the others as on other machines: a death or a freeze
is told by connections and heartbeats only, never by a process of the host, as across machines
(``shm`` cannot cross it). Each daemon is then pid 1 of its namespace, as in a container without
an init; the faults' signals go to it.

With ``--steps N`` the job ends by itself at step N, as a job does, rather than at a SIGTERM
after ``--duration``: the servers linger once done (``--linger forever``, as ``deploy/k8s`` and
``ray-job`` run them), and the faults go on until they are, so that some meet the job's end (a
worker killed in its last steps is started again after it, a server restarted from the
checkpoint of the last step). Every worker must then exit 0, a worker started again after the
end must hear so and exit 0, and the servers exit 0 at their SIGTERM.

The random choices come from ``--seed`` (printed in the report), so a failing sequence of faults
can be asked for again; the timings of the processes will differ.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorwire as tw
from tensorwire import curve as tw_curve
from tensorwire.client import tasks
from tensorwire.client.launch import (
    daemon_flags,
    free_port,
    job_environment,
    ps_command,
    worker_command,
)
from tensorwire.client.worker import EXIT_RESTART
from tensorwire.job.config import at_least, fraction, path, positive_seconds, zero_or_more_seconds
from tensorwire.job.files import output_file
from tensorwire.process import first_child

from .common import UNSHARE, hosts_problem, machine_facts, signal_target
from .report import SCHEMA

#: what a server logs once its SIGTERM handler is set (server/daemon.py)
SERVING_MARK = " serving at "
EVENTS = (
    "kill-worker",
    "freeze-worker",
    "stop-worker",
    "drain-worker",
    "kill-server",
    "move-server",
    "freeze-server",
    "cut-connections",
)
#: (drain-worker, move-server and cut-connections left out: the seeds of the runs recorded
#: before them make the same faults)
DEFAULT_EVENTS = "kill-worker,freeze-worker,stop-worker,kill-server,freeze-server"
#: the daemons' flags a run may set: each flag, the daemon it goes to, its choices (None: any
#: value) with the default first, and what it is. They vary what the faults meet: the 16-bit
#: wires, optimizer state that a restarted server takes back from its checkpoint, workers
#: training a PyTorch module, models of 200 tensors or 25.6 MB.
PASSED_ON: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("--wire-dtype", "ps", ("float32", "bfloat16", "float16"), "the servers' --wire-dtype"),
    ("--optimizer", "ps", ("sgd", "momentum", "adam", "adamw"), "the servers' --optimizer"),
    (
        "--framework",
        "worker",
        ("auto", "numpy", "torch"),
        "the workers' --framework (auto: what --model builds; torch: a built-in model as a "
        "PyTorch module)",
    ),
    (
        "--model",
        "worker",
        ("digits",),  # or any other --model: large and many train on synthetic data
        "the workers' --model",
    ),
)
#: steps no run reaches: the run ends the job with SIGTERM
ENDLESS = "100000000"
#: checkpoint lines that mean "trained on" after a disruption (the first may be a step that was
#: already under way when the fault came)
PROGRESS_CHECKPOINTS = 2
#: seconds a daemon has to exit at SIGTERM, or at the end of the job
EXIT_TIMEOUT = 120.0
#: what a server's log says once its job is done (--steps): it lingers, or it came back from
#: the checkpoint of the job's last step
DONE_MARKS = ("the job is done: answering at", "nothing left to train")
#: the line a worker ends with once told to stop after its last step
FINISHED = re.compile(r"^worker\d+: \d+ steps, ", re.M)
#: a server's log lines with the step it is at: each checkpoint it wrote, and its resumption
SERVER_STEP = re.compile(
    r"checkpoint at step (\d+) written|resumed shard \d+ from .* at step (\d+)"
)
#: what a worker that reached its servers after the job's end says, as it exits 0
ENDED_MARK = "had ended the job at step"


_DESCRIPTION = (
    "A parameter-server job that must keep training while its daemons are killed, frozen, "
    "stopped and restarted at random, one fault at a time; every server must checkpoint twice "
    "more within --stall seconds of each fault, and every daemon must exit 0 at the end."
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "chaos",
        help="a training job that must go on while its daemons are killed, frozen and restarted",
        description=_DESCRIPTION,
    )
    p.add_argument("--transport", default="shm", help="the job's data plane (default shm)")
    p.add_argument("--servers", type=at_least(1), default=2, help="server daemons (default 2)")
    p.add_argument("--workers", type=at_least(2), default=3, help="worker daemons (default 3)")
    p.add_argument("--sync", default="bsp", choices=("bsp", "asp", "ssp"), help="default bsp")
    p.add_argument(
        "--duration",
        type=positive_seconds,
        default=120.0,
        help="seconds of disruptions (default 120)",
    )
    p.add_argument(
        "--steps",
        type=at_least(1),
        default=None,
        help="end the job by itself at this step (the servers' --steps; they linger once done, "
        "--linger forever), not by SIGTERM after --duration: the faults go on until the servers "
        "are done, and --duration is the most the job may take (default: no end of its own)",
    )
    p.add_argument(
        "--min-faults",
        type=at_least(0),
        default=0,
        help="go on past --duration until this many faults were made: their number then does "
        "not hang on the job's pace, which a loaded machine slows (default 0)",
    )
    p.add_argument(
        "--events",
        default=DEFAULT_EVENTS,
        help=f"comma-separated, from {','.join(EVENTS)} (default: {DEFAULT_EVENTS})",
    )
    p.add_argument(
        "--gap",
        type=zero_or_more_seconds,
        default=2.0,
        help="most seconds of quiet between the recovery from one fault and the next (default 2)",
    )
    p.add_argument(
        "--step-timeout",
        type=positive_seconds,
        default=2.0,
        help="the servers' --step-timeout: a worker silent this long within a step is dropped "
        "(default 2)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=at_least(1),
        default=100,
        help="the servers' (default 100 steps)",
    )
    p.add_argument(
        "--stall",
        type=positive_seconds,
        default=90.0,
        help="seconds each server has, after a fault, to checkpoint twice more (default 90)",
    )
    p.add_argument(
        "--min-accuracy",
        type=fraction,
        default=0.9,
        help="rank 0's test accuracy at the end (default 0.9)",
    )
    p.add_argument(
        "--hosts",
        default="one",
        choices=("one", "separate"),
        help="separate: every daemon in a pid and mount namespace of its own (needs root and "
        "unshare), as if each ran on a machine of its own (default one)",
    )
    p.add_argument(
        "--curve",
        action="store_true",
        help="encrypt the job's control plane with a CURVE key pair made for the run "
        "(--curve-keys on every daemon)",
    )
    for daemon in ("ps", "worker"):
        p.add_argument(
            f"--{daemon}-args",
            default="",
            metavar="FLAGS",
            help=f"more flags for every tensorwire-{daemon}, after the run's own (they win), "
            f'e.g. --{daemon}-args="--no-shm" (default none)',
        )
    for flag, _, choices, why in PASSED_ON:
        p.add_argument(
            flag,
            default=choices[0],
            choices=choices if len(choices) > 1 else None,
            help=f"{why} (default {choices[0]})",
        )
    p.add_argument("--seed", type=int, default=None, help="the faults' random seed")
    p.add_argument(
        "--keep",
        type=path,
        metavar="DIR",
        help="keep the daemons' logs here (kept anyway on failure)",
    )
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the results as JSON")
    p.add_argument("--no-progress", action="store_true", help="no line per fault as it happens")


@dataclass
class _Daemon:
    """One daemon of the job: its command, its current process and how often it was started."""

    name: str  # ps0, w1
    cmd: list[str]
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def log(self) -> str:
        return f"{self.name}-{self.starts}.log" if self.starts > 1 else f"{self.name}.log"


class _Job:
    """The job's daemons in ``tmp``, each logging to its own file per start; :meth:`close` reaps
    every process whatever happened."""

    def __init__(self, tmp: Path, args: argparse.Namespace) -> None:
        self.tmp = tmp
        self.separate = args.hosts == "separate"
        self.ends = bool(args.steps)  # the job ends by itself (--steps)
        #: the worker a drain-worker left out (exited 0 at its SIGTERM), until the next one
        self.drained: _Daemon | None = None
        self.env = job_environment()  # as `bench ps` runs its jobs
        addresses = [f"tcp://127.0.0.1:{free_port()}" for _ in range(args.servers)]
        common = ["--transport", args.transport, "--heartbeat-timeout", "3", "--no-progress"]
        if args.curve:
            tw_curve.generate(str(tmp / "keys"))
            common += ["--curve-keys", str(tmp / "keys")]
        self.servers = [
            _Daemon(
                f"ps{s}",
                ps_command(
                    addr,
                    *common,
                    *("--steps", str(args.steps or ENDLESS), "--sync", args.sync),
                    *("--log-level", "INFO"),
                    *(["--linger", "forever"] if args.steps else []),
                    *("--step-timeout", f"{args.step_timeout:g}"),
                    *("--checkpoint-dir", str(tmp / f"ckpt{s}")),
                    *("--checkpoint-every", str(args.checkpoint_every)),
                    *("--metrics", str(_summary_of(tmp, f"ps{s}"))),
                    *(["--on-sigterm", "restart"] if args.moves else []),
                    *args.extra["ps"],
                    shard=s,
                    shards=args.servers,
                    workers=args.workers,
                ),
            )
            for s, addr in enumerate(addresses)
        ]
        self.workers = [
            _Daemon(
                f"w{r}",
                worker_command(
                    addresses,
                    *common,
                    *("--log-level", "INFO", "--metrics", str(_summary_of(tmp, f"w{r}"))),
                    *args.extra["worker"],
                    rank=r,
                    workers=args.workers,
                ),
            )
            for r in range(args.workers)
        ]

    @property
    def daemons(self) -> list[_Daemon]:
        return [*self.servers, *self.workers]

    def start(self, d: _Daemon, *extra: str) -> None:
        d.starts += 1
        if d in self.servers:  # (its summary is of its last process: see server_step)
            self.summary(d).unlink(missing_ok=True)
        cmd = [*d.cmd, *extra]
        if self.separate:
            cmd = [*UNSHARE, *cmd]
        with open(self.tmp / d.log, "wb") as out:
            # (self.env, job_environment's, has them die with the run: a SIGKILLed run left
            # its daemons running, a frozen one stopped for ever)
            d.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env)

    def signal(self, d: _Daemon, sig: int) -> None:
        """Send ``sig`` to the daemon ``d`` (with ``--hosts separate``: to the process unshare
        started, but a SIGKILL to unshare, which kills it: :func:`signal_target`)."""
        proc = d.proc
        assert proc is not None
        pid = proc.pid
        if self.separate:
            pid = signal_target(sig, pid, lambda: _started_by(proc))
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile: its code tells
            os.kill(pid, sig)

    def killed(self, code: int) -> bool:
        """Whether ``code`` is the exit code of a daemon this run SIGKILLed (with ``--hosts
        separate``, unshare was)."""
        return code == -signal.SIGKILL

    def server_step(self, d: _Daemon) -> int | None:
        """Where the server ``d`` ended: its summary's step, or, where its last process wrote
        none (killed as the run ended on a failure), the step of that process's last
        checkpoint, or of its resumption. Before, a failed run reported an earlier process's
        summary: a server moved at step 218 and killed at the end near step 3600 was "at
        218"."""
        step = _metric(self.summary(d), "steps")
        if step is not None:
            return int(step)
        try:
            text = (self.tmp / d.log).read_text(errors="replace")
        except FileNotFoundError:
            return None
        found = SERVER_STEP.findall(text)  # (one group of each match is empty: the other's)
        return int("".join(found[-1])) if found else None

    def checkpoints(self, d: _Daemon) -> int:
        """Checkpoint lines in the log of ``d``'s current process."""
        try:
            return (self.tmp / d.log).read_text(errors="replace").count("checkpoint at step ")
        except FileNotFoundError:
            return 0

    def done(self, d: _Daemon) -> bool:
        """Whether the server ``d``'s current process says its job is done (``--steps``)."""
        try:
            text = (self.tmp / d.log).read_text(errors="replace")
        except FileNotFoundError:
            return False
        return any(mark in text for mark in DONE_MARKS)

    @property
    def ending(self) -> bool:
        """A server's job is done (``--steps``): the workers end with it, exit 0."""
        return any(self.done(d) for d in self.servers)

    def unexpected_exit(self) -> str | None:
        """A daemon whose current process ended without the run asking it to, named (not,
        with --steps, a worker that finished)."""
        for d in self.daemons:
            if d is self.drained:
                continue  # (it exited 0 at its SIGTERM, and stays out)
            if d.proc is not None and d.proc.poll() is not None and not self.finished(d):
                return f"{d.name} exited with {d.proc.returncode} unasked ({self.tail(d)})"
        return None

    def finished(self, d: _Daemon) -> bool:
        """(--steps) Whether the worker ``d`` exited 0 as its part of the job ended: told to
        stop after its last step (under asp and ssp each worker ends on its own, before the
        servers while others still train), or come after the job's end."""
        if not self.ends or d not in self.workers or d.proc is None or d.proc.poll() != 0:
            return False
        text = (self.tmp / d.log).read_text(errors="replace")
        return FINISHED.search(text) is not None or ENDED_MARK in text

    def summary(self, d: _Daemon) -> Path:
        """Where the daemon ``d`` writes its end-of-job summary (--metrics)."""
        return _summary_of(self.tmp, d.name)

    def tail(self, d: _Daemon, lines: int = 12) -> str:
        try:
            text = (self.tmp / d.log).read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "no log"
        return f"{d.log}, last lines:\n    " + "\n    ".join(text[-lines:])

    def close(self) -> None:
        for d in self.daemons:
            if d.proc is not None and d.proc.poll() is None:
                with contextlib.suppress(_Failure):  # unshare without its daemon yet
                    self.signal(d, signal.SIGCONT)  # a frozen one cannot die otherwise
                d.proc.kill()  # (unshare's child is killed with it: --kill-child)
            if d.proc is not None:
                d.proc.wait(30)


def _started_by(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """The pid of the process ``proc`` (unshare) started, once it has (bounded); ``proc``'s
    own once it has exited."""
    kid = first_child(proc.pid, timeout, lambda: proc.poll() is None)
    if kid is not None:
        return kid
    if proc.poll() is None:
        raise _Failure(f"unshare (pid {proc.pid}) started no daemon within {timeout:g} s")
    return proc.pid


class _Failure(Exception):
    """What went wrong, for the report; the run stops there."""


def _await_progress(job: _Job, marks: dict[str, tuple[str, int]], stall: float) -> float:
    """Until every server wrote PROGRESS_CHECKPOINTS more checkpoints than at ``marks`` (its log
    then, and its count there; a server started again since counts from 0 in its new log);
    seconds it took. _Failure at ``stall`` seconds, or when a daemon exits unasked."""
    start = time.monotonic()
    while True:
        behind = []
        for d in job.servers:
            log, seen = marks[d.name]
            have = job.checkpoints(d) - (seen if d.log == log else 0)
            if have < PROGRESS_CHECKPOINTS and not job.done(d):
                behind.append(d)
        if not behind:
            return time.monotonic() - start
        problem = job.unexpected_exit()
        if problem:
            raise _Failure(problem)
        if time.monotonic() - start > stall:
            raise _Failure(
                f"{', '.join(d.name for d in behind)} did not train on within {stall:g} s: "
                + "; ".join(job.tail(d) for d in behind)
            )
        time.sleep(0.1)


def _marks(job: _Job) -> dict[str, tuple[str, int]]:
    return {d.name: (d.log, job.checkpoints(d)) for d in job.servers}


def _last_to_leave(job: _Job, args: argparse.Namespace) -> bool:
    """Whether a worker stopped now would be the last of an asp or ssp job to leave it (the
    others drained): its workers leave at SIGTERM (not evicted, to return), and such a job
    ends once every worker has left on its own."""
    if args.sync == "bsp" or args.worker_exit:
        return False
    return sum(w is not job.drained for w in job.workers) <= 1


def _disrupt(
    job: _Job, event: str, rng: random.Random, args: argparse.Namespace, record: dict[str, Any]
) -> str:
    """Make the fault ``event`` and bring the daemon back; what was done, in words. A worker
    stopped: how long it took to exit at its SIGTERM, in ``record["exited_after_s"]``."""
    if job.drained is not None and (
        event == "drain-worker" or (event == "stop-worker" and _last_to_leave(job, args))
    ):
        # The one out comes back (one at a time); also where a stop would take the last worker
        # still in an asp or ssp job whose workers leave at SIGTERM: such a job ends once all
        # its workers left on their own (its design), and ended there (seed 7101 over grpc,
        # ssp: "ps0 exited with 0 unasked")
        d = job.drained
        job.drained = None
        job.start(d)
        return f"{d.name} started again after its drain"
    if event == "cut-connections":
        pool = job.daemons
    else:
        pool = job.workers if event.endswith("worker") else job.servers
    d = rng.choice([p for p in pool if p is not job.drained])
    proc = d.proc
    assert proc is not None
    if job.finished(d):  # it ended with the job, just now
        return f"{d.name} had ended with the job"
    if event == "cut-connections":
        pid = _started_by(proc) if job.separate else proc.pid
        cut = cut_connections(pid)
        return f"{d.name}: {cut} TCP connection{'s' if cut != 1 else ''} of it reset"
    if event.startswith("freeze"):
        # workers: past the servers' step timeout half the time (dropped, then joining again)
        most = args.step_timeout * (2 if event.endswith("worker") else 1)
        pause = rng.uniform(0.2, most)
        job.signal(d, signal.SIGSTOP)
        time.sleep(pause)
        job.signal(d, signal.SIGCONT)
        return f"{d.name} frozen for {pause:.1f} s"
    pause = rng.uniform(0.1, 2.0)
    if event == "move-server":
        # it checkpoints where the job is and exits 0, the workers not told (--on-sigterm
        # restart); one done lingers, and ends at it too. One started again just now is moved
        # once its SIGTERM handler is set (it logs that it serves just after): before, the
        # signal would end it (-15), or be ignored (pid 1 of its namespace)
        _await_joined(job, d, args.stall, SERVING_MARK)
        code = _terminate(job, d, proc)
        if code != 0:
            raise _Failure(f"{d.name} exited with {code} at SIGTERM ({job.tail(d)})")
    elif event.startswith("kill"):
        job.signal(d, signal.SIGKILL)
        code = proc.wait(30)
        if job.finished(d):
            return f"{d.name} had ended with the job"
        if not job.killed(code):
            raise _Failure(f"{d.name} exited with {code} before its SIGKILL ({job.tail(d)})")
    else:  # stop-worker, drain-worker: it leaves the job and exits 0 (143: evicted, to return)
        if args.sync != "bsp" and not args.worker_exit:
            # Under asp and ssp a job whose workers all left ends (its design): the others,
            # one started again just now among them, are in the job first. Before, w0 started
            # again after its drain was still importing as w1 was drained, and the job ended
            # ("ps0 exited with 0 unasked", seed 1 of `test_ps.py -k
            # never_stops_the_last_worker` on a loaded machine).
            for other in job.workers:
                if other is not d and other is not job.drained:
                    _await_joined(job, other, args.stall)
        # one started again just now may not have its handler yet (Python still importing):
        # SIGTERM ends it as it ends any process then
        starting = "joined " not in (job.tmp / d.log).read_text(errors="replace")
        if starting and job.separate:
            # pid 1 of its namespace, Python ignores SIGTERM until the daemon handles it
            # (a container without an init does the same): stop it once it has joined
            _await_joined(job, d, args.stall)
            starting = False
        asked = time.monotonic()
        code = _terminate(job, d, proc)
        record["exited_after_s"] = round(time.monotonic() - asked, 2)
        if code == 0 and job.finished(d) and _metric(job.summary(d), "stopped_by_signal") == 0:
            # its last step done as the SIGTERM came (under asp and ssp each worker ends on its
            # own): its exit 0 is its end, not a stop's (one evicted says 143). Before, a run
            # whose workers run with --on-sigterm restart failed so ("w3 exited with 0 at
            # SIGTERM", seed 5705 of docs/chaos-every-fault-2026-11-30)
            return f"{d.name} had ended with the job"
        if code != args.worker_exit and not (starting and code == -signal.SIGTERM):
            raise _Failure(f"{d.name} exited with {code} at SIGTERM ({job.tail(d)})")
        if event == "drain-worker":
            job.drained = d
            return (
                f"{d.name} drained (exited {record['exited_after_s']:.1f} s after its SIGTERM), "
                "out until the next drain"
            )
    time.sleep(pause)
    job.start(d, *(["--resume-if-present"] if d in job.servers else []))
    if event.startswith("kill"):
        verb = "killed"
    elif event == "move-server":
        verb = "moved (SIGTERM: it left the job, exit 0)"
    else:
        evicted = f", {EXIT_RESTART}: evicted, to return" if args.worker_exit else ""
        verb = f"stopped (exited {record['exited_after_s']:.1f} s after its SIGTERM{evicted})"
    return f"{d.name} {verb}, started again {pause:.1f} s later"


def cut_connections(pid: int) -> int:
    """Reset every established TCP connection of process ``pid`` (``ss -K``, matched by the
    local ports of its sockets, which only it holds: the ports it listens on, and its own ends
    of the connections it made; the reset reaches the other end too); how many were. A
    _Failure where ``ss`` cannot destroy sockets here."""
    listed = subprocess.run(
        ["ss", "-tnpH", "state", "established"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    mine = f"pid={pid},"
    ports = sorted(
        {line.split()[2].rsplit(":", 1)[1] for line in listed.stdout.splitlines() if mine in line}
    )
    if not ports:
        return 0
    match = " or ".join(f"sport = :{port}" for port in ports)
    out = subprocess.run(
        ["ss", "-K", "-tnH", "state", "established", f"( {match} )"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if out.returncode != 0:
        raise _Failure(f"ss -K cannot reset connections here: {out.stderr.strip()}")
    return len(out.stdout.splitlines())


def _terminate(job: _Job, d: _Daemon, proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM the daemon ``d`` (its process ``proc``): its exit code, within EXIT_TIMEOUT
    (_Failure past it)."""
    job.signal(d, signal.SIGTERM)
    try:
        return proc.wait(EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise _Failure(
            f"{d.name} did not exit within {EXIT_TIMEOUT:g} s of SIGTERM ({job.tail(d)})"
        ) from None


def _await_joined(job: _Job, d: _Daemon, stall: float, mark: str = "joined ") -> None:
    """Until the worker ``d`` has joined its job (a server: logged ``mark``, SERVING_MARK);
    _Failure after ``stall`` seconds, or when a daemon exits unasked."""
    deadline = time.monotonic() + stall
    while mark not in (job.tmp / d.log).read_text(errors="replace"):
        assert d.proc is not None
        if job.finished(d):
            return  # it reached its servers after the job's end (--steps), and exited
        if time.monotonic() > deadline:
            what = "join" if mark == "joined " else "start serving"
            raise _Failure(f"{d.name} did not {what} within {stall:g} s ({job.tail(d)})")
        problem = job.unexpected_exit()
        if problem:
            raise _Failure(problem)
        time.sleep(0.1)


def _finish(job: _Job, stall: float, moves: bool) -> list[str]:
    """Once every worker has joined (one started again just now may not have yet), stop the
    servers; every daemon must exit 0 (the workers follow their servers). One drained is
    started again first: it joins again, and ends with the others. The stop is a SIGTERM, or,
    where the servers run with ``--on-sigterm restart`` (``moves``), a SIGINT, which always
    stops: a SIGTERM there is a departure, and the workers waited for the servers to come back
    until their --reconnect-timeout, then exited 1."""
    if job.drained is not None:
        job.start(job.drained)
        job.drained = None
    deadline = time.monotonic() + stall
    for d in job.workers:
        try:
            _await_joined(job, d, max(deadline - time.monotonic(), 0.1))
        except _Failure as exc:
            return [str(exc)]
    for d in job.servers:
        job.signal(d, signal.SIGINT if moves else signal.SIGTERM)
    return _exits(job, job.daemons, "at the end")


def _exits(job: _Job, daemons: list[_Daemon], when: str) -> list[str]:
    """What is wrong with how ``daemons`` exit, ``when``: each must exit 0, all within
    EXIT_TIMEOUT."""
    problems: list[str] = []
    deadline = time.monotonic() + EXIT_TIMEOUT
    for d in daemons:
        assert d.proc is not None
        try:
            code = d.proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            problems.append(f"{d.name} did not exit within {EXIT_TIMEOUT:g} s {when}")
            continue
        if code != 0:
            problems.append(f"{d.name} exited with {code} {when} ({job.tail(d)})")
    return problems


def _finish_done(
    job: _Job, rng: random.Random, args: argparse.Namespace, result: dict[str, Any]
) -> list[str]:
    """(``--steps``) Once every server is done, every worker must exit 0; one started again
    then (an orchestrator's retry) must hear that the job ended and exit 0; the servers, which
    linger, exit 0 at their SIGTERM. What it measured goes into ``result["after_the_end"]``."""
    deadline = time.monotonic() + args.stall
    while not all(job.done(d) for d in job.servers):
        problem = job.unexpected_exit()
        if problem:
            return [problem]
        if time.monotonic() > deadline:
            behind = [d.name for d in job.servers if not job.done(d)]
            return [f"{', '.join(behind)} not done within {args.stall:g} s of the first server"]
        time.sleep(0.1)
    # (one drained exited at its SIGTERM, checked then: -15 where it was still starting)
    ending = [d for d in job.workers if d is not job.drained]
    problems = _exits(job, ending, "at the job's end")
    if problems:
        return problems
    # A worker started again after the end, as a Kubernetes Job retries a failed pod (or the
    # one drained, back): its own summary, so that the one of its run that trained stays.
    late = job.drained or rng.choice(job.workers)
    job.drained = None
    asked = time.monotonic()
    job.start(late, "--metrics", str(job.tmp / f"{late.name}-after-the-end.json"))
    assert late.proc is not None
    code: int | None
    try:
        code = late.proc.wait(60)
    except subprocess.TimeoutExpired:
        code = None
    told = ENDED_MARK in (job.tmp / late.log).read_text(errors="replace")
    result["after_the_end"] = {
        "worker": late.name,
        "exit": code,
        "exited_after_s": round(time.monotonic() - asked, 2),
        "told": told,
    }
    if code != 0 or not told:
        problems.append(
            f"{late.name}, started again after the job's end, exited with {code} "
            f"{'' if told else 'without hearing that the job had ended '}({job.tail(late)})"
        )
    for d in job.servers:
        job.signal(d, signal.SIGTERM)
    return problems + _exits(job, job.servers, "at SIGTERM")


def _summary_of(tmp: Path, name: str) -> Path:
    """Where the daemon named ``name`` (ps0, w1) writes its end-of-job summary (--metrics)."""
    return tmp / f"{name}.json"


def _metric(path: Path, key: str) -> float | None:
    """``key`` of the metrics a daemon wrote at its end (None: it wrote none)."""
    try:
        return float(json.loads(path.read_text())[key])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _key(flag: str) -> str:
    """The name argparse gives ``flag``'s value: ``--wire-dtype`` -> ``wire_dtype``."""
    return flag[2:].replace("-", "_")


def _value(args: argparse.Namespace, flag: str) -> str:
    return str(getattr(args, _key(flag)))


def _passed_on(args: argparse.Namespace, daemon: str) -> list[str]:
    """The flags of PASSED_ON that go to ``daemon``, with this run's values."""
    flags: list[str] = []
    for flag, to, _, _ in PASSED_ON:
        if to == daemon:
            flags += [flag, _value(args, flag)]
    return flags


def _daemon_flags(
    parser: argparse.ArgumentParser, args: argparse.Namespace, daemon: str
) -> list[str]:
    """The flags of ``--ps-args`` or ``--worker-args``, checked against the daemon's own parser
    now: a flag it does not have would otherwise fail each daemon as the run starts it."""
    flags, known = daemon_flags(getattr(args, f"{daemon}_args"), daemon, parser.error)
    if daemon == "worker":  # what a worker's exit at SIGTERM must be (stop-worker, drain-worker)
        args.worker_exit = EXIT_RESTART if known.on_sigterm == "restart" else 0
    return flags


def _more_faults(job: _Job, args: argparse.Namespace, end: float, made: int) -> bool:
    """Whether to make another fault: until ``end`` (--duration) and --min-faults; with
    --steps, until a server is done (a failure past ``end``: the job did not get there)."""
    if not args.steps:
        return time.monotonic() < end or made < args.min_faults
    if job.ending:
        return False
    if time.monotonic() > end:
        raise _Failure(f"the job did not reach step {args.steps} within {args.duration:g} s")
    return True


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    events = [e.strip() for e in args.events.split(",") if e.strip()]
    args.moves = "move-server" in events  # (the servers then run with --on-sigterm restart)
    bad = [e for e in events if e not in EVENTS]
    if bad or not events:
        parser.error(
            f"--events: unknown {', '.join(bad) or '(none given)'}; from {', '.join(EVENTS)}"
        )
    if "cut-connections" in events and (os.geteuid() != 0 or shutil.which("ss") is None):
        parser.error("--events cut-connections: needs root and iproute2's ss (ss -K)")
    if args.transport not in tw.TRANSPORT_NAMES or args.transport == "auto":
        parser.error(f"--transport {args.transport}: from {', '.join(tw.TRANSPORT_NAMES[1:])}")
    # each daemon's flags: what PASSED_ON sets, then --ps-args or --worker-args (they win)
    given = {daemon: _daemon_flags(parser, args, daemon) for daemon in ("ps", "worker")}
    args.extra = {daemon: [*_passed_on(args, daemon), *given[daemon]] for daemon in given}
    problem = hosts_problem(args.hosts, [args.transport])
    if problem:
        parser.error(problem)
    if args.curve and not tw_curve.available():
        parser.error("--curve: this libzmq has no CURVE support")
    if args.framework == "torch" and importlib.util.find_spec("torch") is None:
        parser.error("--framework torch: PyTorch is not installed: pip install 'tensorwire[torch]'")
    try:  # (before, a --model no worker could load failed the run, its reason in their logs)
        factory = tasks.load_factory(args.model, args.framework)
        if args.framework != "auto":  # a factory of the other framework: its workers exit 1
            built = tasks.build(factory, args.model, tasks.JobInfo(0, args.workers, 32, 0))
            tasks.check_framework(tasks.as_task(built), args.framework)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tensorwire-chaos-"))
    tmp.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": "chaos",
        "machine": machine_facts(),
        "config": {
            **{k: getattr(args, k) for k in ("transport", "servers", "workers", "sync")},
            **{k: getattr(args, k) for k in ("duration", "min_faults", "step_timeout")},
            "checkpoint_every": args.checkpoint_every,
            "steps": args.steps,
            **{_key(flag): _value(args, flag) for flag, _, _, _ in PASSED_ON},
            "curve": args.curve,
            "hosts": args.hosts,
            **{f"{daemon}_args": flags for daemon, flags in given.items()},
            "events": events,
            "seed": seed,
        },
    }
    done: list[dict[str, Any]] = []
    problems: list[str] = []
    job = _Job(tmp, args)
    started = time.monotonic()
    try:
        for d in job.daemons:
            job.start(d)
        # the job forms: every server checkpoints twice
        _await_progress(job, _marks(job), max(args.stall, 120.0))
        end = time.monotonic() + args.duration
        while _more_faults(job, args, end, len(done)):
            time.sleep(rng.uniform(0, args.gap))
            if args.steps and job.ending:
                break
            event = rng.choice(events)
            at = time.monotonic() - started
            marks = _marks(job)
            record: dict[str, Any] = {"at_s": round(at, 2), "event": event}
            done.append(record)  # before the wait: a failure names the fault it followed
            record["what"] = _disrupt(job, event, rng, args, record)
            recovered = _await_progress(job, marks, args.stall)
            record["trained_on_after_s"] = round(recovered, 2)
            what = record["what"]
            if not args.no_progress:
                print(f"{at:7.1f} s  {what}; trained on {recovered:.1f} s later", flush=True)
        if args.steps:
            problems += _finish_done(job, rng, args, result)
        else:
            # Quiet before the end: a worker dropped by the last fault joins again meanwhile.
            # One started again and still in its first join when the servers stop is told
            # nothing: it waits --connect-timeout for them and exits 1 (RELIABILITY.md).
            time.sleep(2 * args.step_timeout + 1)
            _await_progress(job, _marks(job), args.stall)
            problems += _finish(job, args.stall, args.moves)
    except _Failure as exc:
        problems.append(str(exc))
    finally:
        job.close()
    accuracy = _metric(job.summary(job.workers[0]), "test_accuracy")
    if accuracy is None and args.steps:
        # rank 0's last run came after the end (nothing trained, no accuracy): the accuracy
        # it last reported to the servers, at its last evaluation
        accuracy = _metric(job.summary(job.servers[0]), "accuracy")
        result["accuracy_from"] = "ps0"
    if not problems and (accuracy is None or accuracy < args.min_accuracy):
        problems.append(f"rank 0's test accuracy {accuracy} is below {args.min_accuracy:g}")
    result.update(
        events=done,
        duration_s=round(time.monotonic() - started, 1),
        steps=[job.server_step(d) for d in job.servers],
        accuracy=accuracy,
        problems=problems,
        logs=str(tmp) if problems or args.keep else None,
    )
    # A recovery ends at the second checkpoint after the fault, so it is never shorter than
    # what two checkpoints take at the job's pace (the gRPC baselines': seconds).
    first = result["steps"][0]
    result["steps_per_s"] = None if first is None else round(first / result["duration_s"], 1)
    if not problems and not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def render(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [
        f"chaos over {c['transport']}: {c['servers']} servers, {c['workers']} workers, "
        f"{c['sync']}, seed {c['seed']}"
        + "".join(
            f", {flag} {c[_key(flag)]}"
            for flag, _, choices, _ in PASSED_ON
            if c.get(_key(flag), choices[0]) != choices[0]
        )
        + (", CURVE" if c.get("curve") else "")
        + (", each daemon on a host of its own" if c.get("hosts") == "separate" else ""),
        f"{'at s':>8} {'trained on after s':>19}  fault",
    ]
    for e in result["events"]:
        after = e.get("trained_on_after_s")
        shown = "never" if after is None else f"{after:.1f}"
        lines.append(f"{e['at_s']:>8.1f} {shown:>19}  {e.get('what', e['event'])}")
    worst = max(
        (e["trained_on_after_s"] for e in result["events"] if "trained_on_after_s" in e),
        default=0.0,
    )
    accuracy = result["accuracy"]  # (a torch model's: a float32's digits, 0.980555534362793)
    lines.append(
        f"{len(result['events'])} faults in {result['duration_s']:.0f} s; slowest recovery "
        f"{worst:.1f} s; servers' steps {result['steps']}; rank 0's test accuracy "
        f"{accuracy if accuracy is None else format(accuracy, '.4g')}"
    )
    after = result.get("after_the_end")
    if after:
        lines.append(
            f"the job ended by itself (--steps {c['steps']}; the servers' steps "
            f"{result['steps']}); {after['worker']}, started again "
            f"after the end, exited {after['exit']} {after['exited_after_s']:.1f} s later"
            + (", told that the job had ended" if after["told"] else ", not told")
        )
    if result.get("accuracy_from"):
        lines.append(
            f"(rank 0's last run came after the end: its accuracy as {result['accuracy_from']} "
            "last heard it)"
        )
    pace = result.get("steps_per_s")
    if pace:
        every = c["checkpoint_every"]
        lines.append(
            f"a recovery is two checkpoints ({2 * every} steps): at the job's mean pace, "
            f"{pace:g} steps/s, those alone take {2 * every / pace:.1f} s"
        )
    if result["problems"]:
        lines.append("PROBLEMS:\n  " + "\n  ".join(result["problems"]))
        lines.append(f"logs kept in {result['logs']}")
    else:
        lines.append("OK: the job trained on after every fault and ended cleanly")
    return "\n".join(lines)
