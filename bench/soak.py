"""``tensorwire bench soak``: a bounded load test that accounts for every message.

Several sender processes (over every chosen transport) write continuously into one receiver for
``--duration`` seconds. Each message carries its sender's counter; the receiver checks that every
sender's messages arrive exactly once and in order (none lost, none duplicated, none torn: every
element of a message carries the same counter), and that its own resident memory, open file
descriptors and shared-memory segments stay flat after a warm-up. Exit status 1 on any violation.

With ``--kill-every``, senders are SIGKILLed at random moments mid-stream and a new process takes
each one's tensor over: its messages never come before a killed one's, the killed one's never
after its successor's, none is torn, and where a write returns only once the message is the
receiver's (:data:`WRITE_IS_DELIVERY`) every message a killed sender's writes returned for
arrives. The receiver's resources stay flat through the kills.

With ``--freeze-every``, senders are SIGSTOPped instead, and their successors take over once the
receiver has dropped them (its heartbeat timeout); each frozen one then runs again and must find
itself fenced: its write in flight at the freeze may complete, its next raises
:class:`~tensorwire.PeerLostError`, and none of its messages lands after its successor's.

With ``--hosts separate`` (root and util-linux's ``unshare``), each sender process runs in a pid
and mount namespace of its own, so that the receiver sees it as on another machine: its death
and its freeze are told by its connection and its heartbeats only. A dropped ``nixl`` writer,
on either, is fenced by moving its tensors' rings (what lands of a frozen one is reported: its
stale WRITE lands in the old ring, and the receiver completes none of it).

With ``--dynamic``, each tensor's first dimension is dynamic and every message has a length of
its own (told from its counter): the shape travels with each message and must arrive with it.
With ``--api buffer``, each message is produced in place (:meth:`tensorwire.Sender.buffer`: over
``shm`` the receiver's slot itself), so a fault lands mid-fill as often as mid-write.

With ``--tensors N``, each sender writes N tensors a step, all with the step's counter (and the
tensor's index, so that a message landing in another tensor's ring is told); with ``--api
write_many`` (N is 4 unless given) as one :meth:`~tensorwire.Sender.write_many` a step, whose
first claims the sender's tensors in one request, so that a fault lands mid-batch: each tensor
is accounted for on its own, and a successor claims them all back at once. With ``--consume
each`` or ``all``, the receiver takes each sender's tensors with
:meth:`~tensorwire.Receiver.wait_each` or :meth:`~tensorwire.Receiver.wait_all` and hands them
back with :meth:`~tensorwire.Receiver.release_many`, sender after sender, where it otherwise
takes whatever landed with :meth:`~tensorwire.Receiver.wait_any`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import multiprocessing as mp
import os
import random
import shlex
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing import spawn as mp_spawn
from typing import Any

import numpy as np

import tensorwire as tw
from tensorwire.job.config import at_least, positive_seconds
from tensorwire.job.files import output_file
from tensorwire.process import die_with_parent, first_child

from .common import (
    UNSHARE,
    hosts_problem,
    machine_facts,
    parse_size,
    parse_transports,
    signal_target,
)
from .report import SCHEMA

#: Transports whose write returns only once the message is the receiver's (completed in its
#: ring, or completed and then answered by the receiver: both gRPC baselines): every message a
#: killed or frozen sender's writes returned for must still arrive. Over the others a write
#: returns once the message is handed on (to the socket's buffer; over nixl, the payload stored
#: and the notification that completes it queued), and what a sender killed just after handed
#: on may be lost with it (a frozen nixl sender's notification too: only its own threads send
#: it, and its successor's claim moves the ring before it runs again).
WRITE_IS_DELIVERY = frozenset({"shm", "grpc", "grpc-stream"})

#: Transports whose sender writes the receiver's memory itself, so that the receiver holds a
#: new claim of a tensor off while a dropped writer could still store into it (docs/design.md,
#: section 4, the claims' epochs): over shm while one frozen inside a write has not finished
#: it. Such a hold, ended once the frozen sender ran again, is counted, not a problem. (A nixl
#: writer's tensors are not held: the next claim moves their rings away from it.)
HELD_IN_A_WRITE = frozenset({"shm"})

#: A message's counter: the sender's incarnation above SEQ_BITS, its sequence below, and the
#: index of the tensor among its sender's above TENSOR_SHIFT (the int64 stays positive).
SEQ_BITS = 32
TENSOR_SHIFT = 56
INCARNATION_MASK = (1 << (TENSOR_SHIFT - SEQ_BITS)) - 1
#: Most tensors a sender writes (``--tensors``): their index fits below the sign bit
MAX_TENSORS = 64
#: ``--tensors`` where not given: a write_many of one tensor would not be a batch
BATCH_TENSORS = 4

#: Seconds at the end of the run in which no sender is killed or frozen, so that the last ones
#: finish (a frozen one is resumed before this begins).
KILL_QUIET = 3.0
#: Seconds every sender has to write its first message, from the run's start; the run's
#: --duration counts from when each has (a slow start, as of `nixl` senders under load, took
#: the run's time before: a short run made too few faults to test anything)
STARTUP_LIMIT = 60.0
#: Seconds a successor writes for at least, from its first message: it writes until the run's
#: end and, however long its start, its connection and its takeover took, this long past its
#: first message. A least run counted from its start (4 s, until 2026-12-02) was not always
#: enough: over `nixl` between pid namespaces on a loaded 2-core host a takeover took 3.9 s from
#: the kill to the first message (a clean clone's CI run, `test_faults.py -k
#: hosts_of_their_own_killed`), and a `nixl` successor on one host, under the suite's four
#: processes on two cores, was still connecting when its 4 s ended and wrote nothing
#: (`test_faults.py -k made_in_place`).
SUCCESSOR_WRITES = 1.0
#: A frozen sender stays stopped until its successor's first message arrived (the receiver
#: dropped it at its heartbeat timeout, and the successor took the tensor over), and this many
#: seconds more; or, if that does not come, for the heartbeat timeout and FREEZE_LIMIT more,
#: from the later of the freeze and the successor's first connection (_Soak._thaw_at).
FREEZE_PAST_TAKEOVER = 0.2
FREEZE_LIMIT = 5.0
#: Seconds past the heartbeat timeout a takeover takes, as planned for (0.1-1.1 s measured)
FREEZE_TAKES = 2.0
#: Seconds between a successor's claims of a tensor its frozen predecessor still holds
CLAIM_RETRY = 0.05
#: Violations listed in the report; those beyond are counted
MAX_PROBLEMS = 200
#: Seconds the receiver waits for a message before it looks at its senders again (--consume any)
CONSUME_WAIT = 0.2
#: --consume each or all: seconds it waits for the rest of a sender's tensors once one of them
#: has landed (usually the rest of the step is on its way). Short, as a writer that died mid-step
#: leaves the rest missing until its successor writes: a run of 240 s with 0.2 s here took a
#: ninth of the messages wait_any did, every stalled sender holding the others back each round.
BATCH_WAIT = 0.02
#: Seconds between looks at every sender's tensors where none had a message (--consume each, all)
IDLE_LOOK = 0.001


def add_parser(sub: Any) -> None:
    p = sub.add_parser("soak", help="bounded load test: every message accounted for, no leaks")
    p.add_argument(
        "--duration",
        type=positive_seconds,
        default=30.0,
        help="seconds of load, from when every sender has written its first message (default 30)",
    )
    p.add_argument("--senders", type=at_least(1), default=3, help="sender processes (default 3)")
    p.add_argument(
        "--transports",
        default="shm,tcp,grpc",
        help="cycled over the senders (default shm,tcp,grpc)",
    )
    p.add_argument(
        "--size", type=parse_size, default=parse_size("64K"), help="message size (default 64K)"
    )
    p.add_argument(
        "--dynamic",
        action="store_true",
        help="dynamic shapes: each message 1 to --size/8 int64 long, its length drawn from its "
        "counter, which the receiver checks against the shape it gets (default: static)",
    )
    p.add_argument(
        "--api",
        choices=("write", "buffer", "write_many"),
        default="write",
        help="how each message is written: write (a copy of the sender's array), buffer "
        "(filled in place: over shm, in the receiver's slot) or write_many (the sender's "
        "--tensors in one call a step) (default write)",
    )
    p.add_argument(
        "--tensors",
        type=at_least(1),
        default=None,
        metavar="N",
        help=f"tensors each sender writes a step, every one accounted for on its own (at most "
        f"{MAX_TENSORS}; default {BATCH_TENSORS} with --api write_many, else 1)",
    )
    p.add_argument(
        "--consume",
        choices=("any", "each", "all"),
        default="any",
        help="how the receiver takes messages: any (wait_any: whatever landed), each (wait_each "
        "over a sender's tensors, then release_many) or all (wait_all over them, once they all "
        "landed, then release_many; after a writer that died mid-step, the tensors it left "
        "behind are read alone until they reach the others) (default any)",
    )
    p.add_argument(
        "--reconnect-every",
        type=at_least(0),
        default=0,
        metavar="N",
        help="each sender closes its session and connects again after every N messages, as "
        "restarted workers and clients that connect per request do (default 0: never); the "
        "report's memory line shows whether the receiver grew with the sessions that came and "
        "went",
    )
    p.add_argument(
        "--kill-every",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="SIGKILL a sender chosen at random every SECONDS on average (exponential gaps; "
        f"none in the last {KILL_QUIET:g} s) and start a new process that takes its tensor "
        "over; the report says what each killed one wrote and what arrived (default: none)",
    )
    p.add_argument(
        "--freeze-every",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="SIGSTOP a sender chosen at random every SECONDS on average and start a new "
        "process that takes its tensor over once the receiver drops the frozen one (its "
        "--heartbeat-timeout); the frozen one runs again once its successor's first message "
        "arrived, and must find itself fenced: no write of it lands after its successor's "
        "(default: none)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the kills' and freezes' moments and choices (default 0)",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="the receiver's heartbeat timeout: how long a killed sender's tensor may stay "
        "claimed where its death is seen only by its silence, and a frozen one's (default 30)",
    )
    p.add_argument(
        "--hosts",
        choices=("one", "separate"),
        default="one",
        help="separate: every sender in a pid and mount namespace of its own (needs root and "
        "unshare; not shm), as if on a machine of its own (default one)",
    )
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the results as JSON")


def counter(tensor: int, incarnation: int, seq: int) -> int:
    """What every element of message ``seq`` of a sender's ``tensor``-th tensor holds, written
    by its ``incarnation``-th process."""
    return tensor << TENSOR_SHIFT | incarnation << SEQ_BITS | seq


def message_length(counter: int, elements: int) -> int:
    """A ``--dynamic`` message's length, 1 to ``elements``, told from its counter (a
    multiplicative hash, so that neighbouring messages differ in length)."""
    return 1 + (counter * 2654435761 >> 7) % elements


def _sender(
    address: str,
    transport: str,
    names: list[str],
    run_end: Any,
    least: float,
    every: int,
    conn: Any,
    incarnation: int,
    counts: Any,
    ready: Any,
    thawed: Any,
    slot: int,
    dynamic: int,
    api: str,
    parent: int,
) -> None:
    """Write numbered messages until the run's end (``run_end``: a shared double, in
    :func:`time.monotonic`'s clock, which every process of this host shares; infinite until the
    receiver has heard from every sender) and, with ``least``, until the first message however
    long that takes and for at least ``least`` s from it, in sessions of ``every`` steps each
    (0: one session), a message to each of ``names`` a step, each counter :func:`counter`
    (``dynamic``: of at most that many elements, :func:`message_length`; 0: the static shape;
    ``api``: ``write`` from our arrays, one tensor after the other, ``buffer`` filled in
    :meth:`~tensorwire.Sender.buffer`'s array, ``write_many`` all in one call); store how many
    steps have returned in ``counts[slot]`` after each (shared memory: the count survives a
    SIGKILL), and when its first connection was made in ``ready[slot]``; once ``thawed[slot]``
    says it was frozen and runs again, it makes one step more however late (the step that finds
    it fenced); send back (steps, sessions), or the error that ended it. A tensor still written
    by the sender this one succeeds (frozen: the receiver has not dropped it yet) is claimed
    again until it is free, as a replacement of a hung process would (a write_many's claims are
    granted or refused before any of its bytes move: tried again whole). It dies with
    ``parent``, the run's pid (a sender frozen when its run was SIGKILLed stayed stopped; on a
    host of its own, unshare does, and takes it along)."""
    die_with_parent(parent)
    sent = sessions = 0
    least_end = math.inf  # with ``least``: until the first message, then ``least`` s past it

    def writing() -> bool:
        now = time.monotonic()
        if now < run_end.value or (least > 0 and now < least_end):
            return True
        if thawed[slot] == 1:  # resumed from a freeze past the end: one step more
            thawed[slot] = 2
            return True
        return False

    try:
        while writing():
            with tw.Sender.connect(address, transport=transport, timeout=60) as tx:
                sessions += 1
                if not ready[slot]:
                    ready[slot] = time.monotonic()
                arrays = [np.empty(dynamic or tx.spec(n).static_shape, np.int64) for n in names]
                stop = sent + every if every else None
                claimed = False
                written = 0  # of this step's tensors (write and buffer: one after the other)
                while writing() and sent != stop:
                    batch = []
                    for k, (name, arr) in enumerate(zip(names, arrays, strict=True)):
                        value = counter(k, incarnation, sent)
                        shape = (message_length(value, dynamic),) if dynamic else None
                        batch.append((name, value, arr[: shape[0]] if shape else arr, shape))
                    try:
                        if api == "write_many":
                            for _, value, view, _ in batch:
                                view.fill(value)
                            tx.write_many([(name, view) for name, _, view, _ in batch])
                        else:
                            for name, value, view, shape in batch[written:]:
                                if api == "buffer":
                                    with tx.buffer(name, shape=shape) as out:
                                        out.fill(value)
                                else:
                                    view.fill(value)
                                    tx.write(name, view)
                                written += 1
                    except tw.RemoteProtocolError as exc:
                        if not exc.held_by_another or claimed:
                            raise
                        # the session's first step: a tensor not ours yet (those written
                        # before it in this step are not written again)
                        time.sleep(CLAIM_RETRY)
                        continue
                    claimed = True
                    written = 0
                    sent += 1
                    counts[slot] = sent
                    if sent == 1:
                        least_end = time.monotonic() + least
    except tw.TensorWireError as exc:
        conn.send(f"{type(exc).__name__} after {sent} messages: {exc}")
        raise SystemExit(1) from None
    conn.send((sent, sessions))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _trimmed_rss() -> int | None:
    """Resident memory once the C allocator has handed its free memory back (glibc's
    ``malloc_trim``), which tells memory still in use from memory freed but kept for reuse (a
    leak grows both; an allocator keeping freed blocks grows the first only). None where the C
    library has no ``malloc_trim``."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except AttributeError:
        return None
    trim(0)
    return _rss()


def _fds() -> dict[int, str]:
    """Our open file descriptors, with what each is (a socket's, a pipe's inode, a path)."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # (the listing's own, closed since)
            continue
    return out


def _segments() -> int:
    """Shared-memory segments this process owns (their names carry our uid and pid)."""
    mine = f"tensorwire.{os.getuid()}.{os.getpid()}."
    return sum(1 for n in os.listdir("/dev/shm") if n.startswith(mine))


@dataclass
class _Process:
    """One sender process of a stream: its incarnation, the count of its writes that
    returned, and what it said at its end."""

    incarnation: int
    proc: Any
    conn: Any
    counts: Any  # shared int64s: ours, at ``slot``, counts the writes that returned
    slot: int
    separate: bool = False  # run by unshare, on a host of its own: signals go to its child
    sent: int | None = None  # its report at its end: messages written
    sessions: int | None = None
    failed: str | None = None  # the error that ended it, or how it died without a word
    exitcode: int | None = None  # once closed

    @property
    def ended(self) -> bool:
        return self.sent is not None or self.failed is not None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the sender (under ``--hosts separate``: to the process unshare runs
        it in, but a SIGKILL to unshare, which kills it: :func:`signal_target`)."""
        proc = self.proc
        pid = proc.pid
        if self.separate:
            pid = signal_target(sig, pid, lambda: first_child(proc.pid, 10.0, proc.is_alive))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    @property
    def acked(self) -> int:
        """How many of its writes have returned."""
        return int(self.counts[self.slot])

    def hear(self) -> None:
        """Take its report, if it sent one (or the news that it ended without one)."""
        if self.ended or not self.conn.poll():
            return
        try:
            said = self.conn.recv()
        except EOFError:
            self.proc.join(10)
            said = f"it exited (code {self.proc.exitcode}) without a word"
        if isinstance(said, str):
            self.failed = said
        else:
            self.sent, self.sessions = said

    def close(self) -> None:
        self.proc.join(30)
        if self.proc.is_alive():  # (a problem the report names: it did not end in time)
            self.proc.kill()
            self.proc.join(10)
        self.conn.close()
        self.exitcode = self.proc.exitcode
        with contextlib.suppress(ValueError):  # (one that would not die keeps its sentinel)
            self.proc.close()  # its sentinel's descriptor, which the count would take for ours


@dataclass
class _Tensor:
    """One tensor of a stream: what arrived of each of its writers."""

    name: str
    index: int  # among its stream's: what its messages' counters carry above TENSOR_SHIFT
    received: dict[int, int] = field(default_factory=dict)  # incarnation -> messages arrived
    expect: dict[int, int] = field(default_factory=dict)  # incarnation -> its next message
    last: tuple[int, int] = (-1, -1)  # (incarnation, message) of the newest that arrived


@dataclass
class _Stream:
    """One sender's tensors, their transport, and the sender processes that wrote them in
    turn: the one writing now, and those killed or frozen before it."""

    name: str
    transport: str
    tensors: list[_Tensor]
    now: _Process | None = None
    killed: list[dict[str, Any]] = field(default_factory=list)
    frozen: list[tuple[_Process, dict[str, Any]]] = field(default_factory=list)
    losses: int = 0  # the receiver's notices of a lost writer
    started: set[int] = field(default_factory=set)  # incarnations a message of which arrived
    resumed: dict[int, dict[str, Any]] = field(default_factory=dict)  # frozen, run again: records

    def received(self, incarnation: int) -> list[int]:
        """How many messages of that writer arrived, tensor by tensor."""
        return [t.received.get(incarnation, 0) for t in self.tensors]

    @property
    def done(self) -> bool:
        p = self.now
        assert p is not None
        if p.failed is not None:
            return True
        return p.sent is not None and min(self.received(p.incarnation)) >= p.sent

    def writing(self) -> bool:
        """Is its sender writing (started, claimed, not ended)?"""
        p = self.now
        return p is not None and not p.ended and p.acked > 0 and p.proc.is_alive()


class _Soak:
    """The receiver's side of a run: the streams, their senders' lives, and the checks."""

    def __init__(self, args: argparse.Namespace, rx: tw.Receiver, transports: list[str]):
        self.args = args
        self.rx = rx
        self.ctx = mp.get_context("spawn")
        self.rng = random.Random(args.seed)
        tensors = args.tensors
        self.streams = [
            _Stream(
                f"s{k}",
                transports[k % len(transports)],
                [_Tensor(f"s{k}.{j}" if tensors > 1 else f"s{k}", j) for j in range(tensors)],
            )
            for k in range(args.senders)
        ]
        self.by_name = {t.name: (s, t) for s in self.streams for t in s.tensors}
        self.problems: list[str] = []
        self.more_problems = 0  # beyond MAX_PROBLEMS
        self.cursor = 0  # --consume each/all: the stream taken from next
        self.read_alone = 0  # --consume all: messages read alone to bring a stream in line
        self.received = 0
        self.launched = time.monotonic()
        # The run's start and end, once every sender has written (begin); its senders write
        # until the end they read in run_end
        self.start = self.end = math.inf
        self.run_end = self.ctx.RawValue("d", math.inf)
        self.freeze_for = args.heartbeat_timeout + FREEZE_LIMIT  # at most
        # One count of returned writes per sender process, made at once (one made per process
        # would hold a descriptor of multiprocessing's heap: a leak to the report's count).
        # Room for twice the faults expected; none is made past it.
        rate = sum(1 / every for every in (args.kill_every, args.freeze_every) if every)
        self.counts = self.ctx.RawArray("q", args.senders + 2 * int(rate * args.duration) + 64)
        self.ready = self.ctx.RawArray("d", len(self.counts))  # each one's first connection
        self.thawed = self.ctx.RawArray("b", len(self.counts))  # 1: frozen, running again
        self.slots_used = 0
        elements = max(2, args.size // 8)
        self.dynamic = elements if args.dynamic else 0
        for s in self.streams:
            for t in s.tensors:
                if self.dynamic:
                    rx.register(t.name, (None,), "int64", max_bytes=elements * 8)
                else:
                    rx.register(t.name, (elements,), "int64")
            self.launch(s, 0)

    def launch(self, s: _Stream, incarnation: int) -> None:
        slot = self.slots_used
        self.slots_used += 1
        here, there = self.ctx.Pipe()
        proc = self.ctx.Process(
            target=_sender,
            args=(
                self.rx.address,
                s.transport,
                [t.name for t in s.tensors],
                self.run_end,
                SUCCESSOR_WRITES if incarnation else 0.0,
                self.args.reconnect_every,
                there,
                incarnation,
                self.counts,
                self.ready,
                self.thawed,
                slot,
                self.dynamic,
                self.args.api,
                os.getpid(),  # for it to die with
            ),
        )
        proc.start()
        there.close()
        s.now = _Process(incarnation, proc, here, self.counts, slot, self.args.hosts == "separate")

    def begin(self, now: float) -> bool:
        """Start the run's clock once every stream's sender has written (or ended: a failed
        start is reported at the end); True once it runs."""
        if self.start < math.inf:
            return True
        for s in self.streams:
            p = s.now
            assert p is not None
            if not p.ended and min(s.received(p.incarnation)) == 0:
                return False
        self.start, self.end = now, now + self.args.duration
        self.run_end.value = self.end
        return True

    def take(self, name: str, view: Any) -> None:
        """Check one message against what came before it on its tensor."""
        s, t = self.by_name[name]
        value = int(view[0])
        index, inc = value >> TENSOR_SHIFT, (value >> SEQ_BITS) & INCARNATION_MASK
        seq = value & ((1 << SEQ_BITS) - 1)
        got = t.received.get(inc, 0)
        expected = t.expect.get(inc, 0)
        if index != t.index:
            self.problem(f"{name}: sender {inc}'s message {seq} of {s.name}.{index} landed here")
        elif inc < t.last[0]:
            self.problem(
                f"{name}: a message of sender {inc} after one of its successor {t.last[0]}"
            )
        elif seq != expected:  # a gap or a repeat, said once: the messages after it follow it
            self.problem(f"{name}: sender {inc}: expected message {expected}, got {seq}")
        elif self.dynamic and view.shape != (message_length(value, self.dynamic),):
            self.problem(
                f"{name}: sender {inc}: message {seq} arrived with shape {view.shape}, written "
                f"with ({message_length(value, self.dynamic)},)"
            )
        elif view.min() != value or view.max() != value:
            self.problem(f"{name}: sender {inc}: message {seq} is torn")
        t.expect[inc] = seq + 1
        if inc > 0 and inc not in s.started:  # a successor's first: after its predecessor's end
            for record in (*s.killed, *(r for _, r in s.frozen)):
                if record["incarnation"] == inc - 1:
                    now = time.monotonic()
                    record["takeover_s"] = now - record["at"]
                    if "resume_at" in record:  # frozen: it runs again a moment after
                        record["resume_at"] = min(record["resume_at"], now + FREEZE_PAST_TAKEOVER)
        s.started.add(inc)
        resumed = s.resumed.get(inc)
        if resumed is not None:  # a frozen writer's, since it ran again: its write in flight
            resumed["landed_after_resume"] = resumed.get("landed_after_resume", 0) + 1
        t.last = max(t.last, (inc, seq))
        t.received[inc] = got + 1
        self.received += 1

    def consume(self) -> None:
        """Take what has landed, as ``--consume`` says, check it and hand it back; count a lost
        writer's notice (said once per lost writer and tensor: its successor goes on)."""
        try:
            if self.args.consume == "any":
                name, view = self.rx.wait_any(timeout=CONSUME_WAIT)
                self.take(name, view)
                self.rx.release(name)
                return
            s = self._next_landed()
            if s is None:
                time.sleep(IDLE_LOOK)
                return
            names = [t.name for t in s.tensors]
            if self.args.consume == "each":
                taken: list[str] = []
                try:
                    for name, view in self.rx.wait_each(names, timeout=BATCH_WAIT):
                        self.take(name, view)
                        taken.append(name)
                finally:
                    if taken:
                        self.rx.release_many(taken)
                return
            if not self._bring_in_line(s):
                return
            views = self.rx.wait_all(names, timeout=BATCH_WAIT)
            for name in names:
                self.take(name, views[name])
            self.rx.release_many(names)
        except tw.WireTimeoutError:
            pass
        except tw.PeerLostError as exc:
            lost = self.by_name.get(exc.tensor or "")
            if lost is not None:
                lost[0].losses += 1

    def _next_landed(self) -> _Stream | None:
        """The next stream, round-robin, one of whose tensors has a message (None: none has):
        waiting on a sender's tensors while others' landed would pace the run by the slowest."""
        for _ in range(len(self.streams)):
            s = self.streams[self.cursor]
            self.cursor = (self.cursor + 1) % len(self.streams)
            if any(self.rx.pending(t.name) for t in s.tensors):
                return s
        return None

    def _bring_in_line(self, s: _Stream) -> bool:
        """``--consume all``: before the next wait_all, bring the stream's tensors to the same
        message. A writer that died mid-step left some of them one message more than the rest
        (a batch is one call, not one transaction), which wait_all would take together with its
        successor's first: those behind the newest (writer, message) taken are read alone
        until they reach it, as a consumer pairing a step's tensors by its number would. False
        where one has no message yet (looked at again on a later round: waiting for it here
        would hold every other sender's messages meanwhile)."""
        while True:
            target = max(t.last for t in s.tensors)
            behind = [t for t in s.tensors if t.last < target]
            if not behind:
                return True
            for t in behind:
                while t.last < target:  # (each take moves it on: bounded by what was written)
                    if not self.rx.pending(t.name):
                        return False
                    view = self.rx.wait(t.name, timeout=BATCH_WAIT)
                    self.take(t.name, view)
                    self.rx.release(t.name)
                    self.read_alone += 1

    def problem(self, what: str) -> None:
        """Note a violation; past MAX_PROBLEMS, only count it (one fault can make thousands)."""
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(what)
        else:
            self.more_problems += 1

    def pick(self) -> _Stream | None:
        """A stream whose sender is writing now, at random (None where none is, or no count
        is left for a successor)."""
        if self.slots_used >= len(self.counts):
            return None
        writing = [s for s in self.streams if s.writing()]
        return self.rng.choice(writing) if writing else None

    def kill_one(self) -> bool:
        """SIGKILL a writing sender mid-stream and start its successor (False: none was
        writing)."""
        s = self.pick()
        if s is None or s.now is None:
            return False
        p = s.now
        p.signal(signal.SIGKILL)
        p.close()
        # takeover_s: from the kill to its successor's first message, set when that arrives
        s.killed.append({"incarnation": p.incarnation, "acked": p.acked, "at": time.monotonic()})
        self.launch(s, p.incarnation + 1)
        return True

    def freeze_one(self) -> bool:
        """SIGSTOP a writing sender mid-stream and start its successor, which claims the
        tensor once the receiver has dropped the frozen one (its heartbeat timeout); the
        frozen one runs again once the successor's first message arrived (:meth:`thaw`).
        False: none was writing."""
        s = self.pick()
        if s is None or s.now is None:
            return False
        p = s.now
        p.signal(signal.SIGSTOP)
        at = time.monotonic()
        record = {"incarnation": p.incarnation, "acked_at_freeze": p.acked, "at": at}
        record["resume_at"] = at + self.freeze_for
        s.frozen.append((p, record))
        self.launch(s, p.incarnation + 1)
        assert s.now is not None
        record["successor_slot"] = s.now.slot
        return True

    def _thaw_at(self, record: dict[str, Any]) -> float:
        """When a frozen sender runs again: a moment after its successor's first message
        (``resume_at`` then), or where that does not come, ``freeze_for`` after the later of
        its freeze and its successor's first connection (STARTUP_LIMIT more at most, while the
        successor is still starting). From the freeze alone, a successor that took longer
        than that to start, on a loaded host, had its predecessor run again first, which was
        then taken for a receiver that had not dropped it (7-10 s from a freeze to the
        successor's first message, with the suite's soak tests in four processes and ten busy
        loops on two cores)."""
        if "takeover_s" in record:
            return float(record["resume_at"])
        connected = self.ready[record["successor_slot"]]
        since = max(record["at"], connected) if connected else record["at"] + STARTUP_LIMIT
        return since + self.freeze_for

    def thaw(self, now: float, *, all_of_them: bool = False) -> None:
        """Resume the frozen senders whose time has come, and hear from those resumed."""
        for s in self.streams:
            for p, record in s.frozen:
                if "resumed_after_s" not in record and (
                    all_of_them or now >= self._thaw_at(record)
                ):
                    # Past the run's end it would stop before its next write, which must find
                    # it fenced (a writer held inside its batch's last copy, resumed 7.1 s after
                    # its freeze, ended "its time was up" in a clean clone's CI run)
                    self.thawed[p.slot] = 1
                    p.signal(signal.SIGCONT)
                    record["resumed_after_s"] = now - record["at"]
                    s.resumed[record["incarnation"]] = record
                p.hear()

    def kill_all(self) -> None:
        """SIGKILL every sender process still there, stopped ones too (the run failed)."""
        for s in self.streams:
            for p in (s.now, *(f for f, _ in s.frozen)):
                if p is not None and p.exitcode is None and p.proc.is_alive():
                    p.signal(signal.SIGKILL)

    def account(self) -> None:
        """What each killed and frozen sender wrote against what arrived of it, and each
        last sender's report against what arrived."""
        for s in self.streams:
            for old in s.killed:
                del old["at"]
                got = _note_received(old, s.received(old["incarnation"]))
                where = f"{s.name}: killed sender {old['incarnation']} ({s.transport})"
                self._compare(where, s, old["acked"], got)
            for frozen, old in s.frozen:
                frozen.close()
                self._account_frozen(s, frozen, old)
            p = s.now
            assert p is not None
            p.close()
            last = s.received(p.incarnation)
            if p.failed is not None:
                self.problem(f"{s.name}: sender {p.incarnation} ({s.transport}): {p.failed}")
            elif p.sent is None:
                self.problem(
                    f"{s.name}: sender {p.incarnation} did not finish (exit code {p.exitcode})"
                )
            elif any(got != p.sent for got in last):
                self.problem(f"{s.name}: sent {p.sent}, received {_each(last)}")

    def _compare(self, where: str, s: _Stream, wrote: int, got: list[int]) -> None:
        """What arrived of a killed or frozen sender, tensor by tensor, against how many of
        its steps returned: the step in flight at the fault may have landed (one more), and
        over a transport whose write returns once the message is the receiver's, none that
        returned is lost."""
        for t, arrived in zip(s.tensors, got, strict=True):
            if arrived > wrote + 1 or (s.transport in WRITE_IS_DELIVERY and arrived < wrote):
                of = f" of {t.name}" if len(got) > 1 else ""
                self.problem(
                    f"{where}: its writes returned for {wrote} messages{of}, {arrived} arrived"
                )

    def _account_frozen(self, s: _Stream, p: _Process, old: dict[str, Any]) -> None:
        """A frozen sender, dropped by the receiver while it was stopped and succeeded: once
        it runs again, its write in flight at the freeze may complete, and the next must
        fail (it is fenced); none of its messages may come after its successor's, nor more
        than its writes returned for."""
        inc = old["incarnation"]
        del old["at"], old["resume_at"], old["successor_slot"]
        old["acked"] = wrote = p.acked
        got = _note_received(old, s.received(inc))
        old["ended"] = p.failed if p.failed is not None else "its time was up"
        where = f"{s.name}: frozen sender {inc} ({s.transport})"
        self._compare(where, s, wrote, got)
        if "takeover_s" not in old or old["takeover_s"] > old.get("resumed_after_s", 0.0):
            in_a_write = wrote == old["acked_at_freeze"] + 1 or old.get("landed_after_resume")
            if s.transport in HELD_IN_A_WRITE and in_a_write:
                # Held as designed: until the write it was stopped in ended. Told by that write
                # returning once it ran again, or, for a batch (whose step then fails at its
                # next tensor, fenced, so that no more of its writes return), by its message
                # landing then (a run of 480 s met two such holds, taken for problems).
                old["held"] = True
                return
            self.problem(
                f"{where}: its successor's first message did not arrive within "
                f"{self.freeze_for:g} s of the freeze, nor of the successor's connection: the "
                "receiver did not drop it at its heartbeat timeout"
            )
            return
        if wrote > old["acked_at_freeze"] + 1:
            self.problem(
                f"{where}: {wrote - old['acked_at_freeze']} writes returned after it was "
                "dropped (the first of them may have been in flight at the freeze)"
            )
        if p.failed is not None and not p.failed.startswith("PeerLostError"):
            self.problem(f"{where}: ended by {p.failed} (PeerLostError expected)")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    try:
        transports = parse_transports(args.transports, distinct=False)  # cycled over senders
    except ValueError as exc:
        parser.error(f"--transports: {exc}")
    if args.tensors is None:
        args.tensors = BATCH_TENSORS if args.api == "write_many" else 1
    if args.tensors > MAX_TENSORS:
        parser.error(f"--tensors: at most {MAX_TENSORS} a sender, got {args.tensors}")
    if args.kill_every and args.duration <= KILL_QUIET:
        parser.error(
            f"--kill-every: no sender is killed in the last {KILL_QUIET:g} s of the run; "
            f"give a --duration over {KILL_QUIET:g} s"
        )
    if args.freeze_every and args.reconnect_every:
        parser.error(
            "--freeze-every with --reconnect-every: a frozen sender, once it runs again, would "
            "begin new sessions that claim its tensor back from its successor whenever that one "
            "is between sessions, as any process may; give one or the other"
        )
    room = KILL_QUIET + args.heartbeat_timeout + FREEZE_TAKES
    if args.freeze_every and args.duration <= room:
        parser.error(
            f"--freeze-every: a frozen sender is taken over after the --heartbeat-timeout "
            f"({args.heartbeat_timeout:g} s), and none is frozen in the last {room:g} s of the "
            f"run; give a --duration over {room:g} s, or a shorter --heartbeat-timeout"
        )
    problem = hosts_problem(args.hosts, transports)
    if problem:
        parser.error(problem)
    with _senders_on_hosts_of_their_own(args.hosts == "separate"):
        return _run(args, transports)


@contextlib.contextmanager
def _senders_on_hosts_of_their_own(separate: bool) -> Iterator[None]:
    """Where ``separate``, multiprocessing starts each sender through unshare, in a pid and
    mount namespace of its own (the descriptors it hands the child pass through)."""
    if not separate:
        yield
        return
    spawn = mp.get_context("spawn")
    before = mp_spawn.get_executable()
    with tempfile.TemporaryDirectory(prefix="tensorwire-soak-") as tmp:
        wrapper = os.path.join(tmp, "python-on-a-host-of-its-own")
        python = shlex.quote(os.fsdecode(before))
        with open(wrapper, "w") as f:
            f.write(f'#!/bin/sh\nexec {" ".join(UNSHARE)} {python} "$@"\n')
        os.chmod(wrapper, 0o700)
        spawn.set_executable(wrapper)
        try:
            yield
        finally:
            spawn.set_executable(before)


def _run(args: argparse.Namespace, transports: list[str]) -> dict[str, Any]:
    seg0 = _segments()
    result: dict[str, Any] = {"schema": SCHEMA, "kind": "soak", "machine": machine_facts()}
    result["hosts"] = args.hosts
    with tw.Receiver(heartbeat_timeout=args.heartbeat_timeout) as rx:
        soak = _Soak(args, rx, transports)
        try:
            warm_rss: int | None = None
            warm_trimmed: int | None = None
            warm_fds: dict[int, str] = {}
            acts = ((args.kill_every, soak.kill_one), (args.freeze_every, soak.freeze_one))
            faults = [(every, act) for every, act in acts if every]
            due: list[float] = []
            last: dict[Any, float] = {}
            started = False
            deadline = soak.launched + STARTUP_LIMIT
            while not all(s.done for s in soak.streams) and time.monotonic() < deadline:
                soak.consume()
                now = time.monotonic()
                if not started and soak.begin(now):
                    started = True
                    deadline = soak.end + 60
                    # No fault begins in the last KILL_QUIET s, nor a freeze that would not end
                    # before them (a takeover comes within the heartbeat timeout and a second
                    # or so, FREEZE_TAKES).
                    last[soak.kill_one] = soak.end - KILL_QUIET
                    last[soak.freeze_one] = (
                        soak.end - KILL_QUIET - args.heartbeat_timeout - FREEZE_TAKES
                    )
                    due = [now + soak.rng.expovariate(1 / every) for every, _ in faults]
                if (
                    warm_rss is None
                    and now - soak.start > min(5.0, args.duration / 5)
                    and all(t.received for s in soak.streams for t in s.tensors)
                ):
                    # every sender connected, and every server the receiver starts on demand
                    # (nixl's, with its descriptors) started
                    warm_rss, warm_fds = _rss(), _fds()
                    warm_trimmed = _trimmed_rss()
                for s in soak.streams:
                    assert s.now is not None
                    s.now.hear()
                soak.thaw(now)
                for k, (every, act) in enumerate(faults if started else ()):
                    if now >= due[k]:
                        # A fault due while no sender is writing (each just killed or frozen,
                        # its successor starting: process starts take seconds on a loaded
                        # machine) waits for one, rather than being skipped: a short run under
                        # load made too few to test anything.
                        if now < last[act] and not act():
                            continue
                        due[k] = now + soak.rng.expovariate(1 / every)
        except BaseException:
            soak.kill_all()  # a stopped child would hold this process at its exit
            raise
        if not started:
            soak.problem(
                f"not every sender wrote within {STARTUP_LIMIT:g} s of its start: "
                + ", ".join(f"{s.name} ({s.transport})" for s in soak.streams if not s.started)
            )
        soak.run_end.value = min(soak.run_end.value, time.monotonic())  # (those still writing)
        soak.thaw(time.monotonic(), all_of_them=True)  # (the run ran out of time)
        soak.account()
        end_rss = _rss()
        end_trimmed = _trimmed_rss()
        time.sleep(0.5)  # the senders' connections wind down
        end_fds = _fds()
        result.update(
            {
                "duration_s": time.monotonic() - (soak.start if started else soak.launched),
                # from the run's start to every sender's first message, which starts its clock
                "startup_s": (soak.start - soak.launched) if started else None,
                "senders": [
                    {
                        "name": s.name,
                        "transport": s.transport,
                        "sent": s.now.sent if s.now else None,
                        "received": min(s.received(s.now.incarnation)) if s.now else 0,
                        "sessions": s.now.sessions if s.now else None,
                        "killed": s.killed,
                        "frozen": [record for _, record in s.frozen],
                        "losses_told": s.losses,
                    }
                    for s in soak.streams
                ],
                "size": args.size,
                "dynamic": args.dynamic,
                "api": args.api,
                "tensors": args.tensors,
                "consume": args.consume,
                "read_alone": soak.read_alone,
                "reconnect_every": args.reconnect_every,
                "kill_every": args.kill_every,
                "freeze_every": args.freeze_every,
                "heartbeat_timeout": args.heartbeat_timeout,
                "seed": args.seed,
                "messages": soak.received,
                "rss_after_warmup": warm_rss,
                "rss_end": end_rss,
                "rss_growth_bytes": end_rss - (warm_rss or end_rss),
                # both after malloc_trim: the growth of memory in use (None: no malloc_trim)
                "rss_growth_trimmed_bytes": (
                    None if end_trimmed is None else end_trimmed - (warm_trimmed or end_trimmed)
                ),
            }
        )
        # Compared with the warm-up, when every sender was connected: the senders have gone since,
        # so anything above that count would be a descriptor that outlived its use. Fewer, as
        # senders' sessions went, could hide a leak of each killed one's: a descriptor opened
        # since the warm-up and open still (its number and what it is alike) is one of those.
        # The receiver's own memory added since (its segments' names carry our pid) is rings
        # it moved away from nixl writers it dropped (design.md, "One writer per tensor"),
        # kept until it closes: counted apart; the segment count after its close says whether
        # any outlived it.
        mine = f"/dev/shm/tensorwire.{os.getuid()}.{os.getpid()}."
        base = warm_fds if warm_rss is not None else end_fds
        added = {fd: what for fd, what in end_fds.items() if base.get(fd) != what}
        regions = {fd for fd, what in added.items() if what.startswith(mine)}
        result["fd_growth"] = len(end_fds) - len(regions) - len(base)
        left = sorted(f"{fd}: {what}" for fd, what in added.items() if fd not in regions)
        result["fds_left_open"] = left
        result["region_fds_added"] = len(regions)
        result["rings_moved"] = int(tw.metrics.counter("tensorwire_rings_moved_total"))
    result["segment_growth"] = _segments() - seg0
    if soak.more_problems:
        soak.problems.append(f"... and {soak.more_problems} more violations of these kinds")
    problems = soak.problems
    if result["fd_growth"] > 0:
        problems.append(f"{result['fd_growth']} file descriptors leaked")
    elif left:
        problems.append(
            f"{len(left)} file descriptors opened during the run are open still: "
            f"{', '.join(left[:5])}"
        )
    if result["segment_growth"]:
        problems.append(f"{result['segment_growth']} shared-memory segments leaked")
    result["problems"] = problems
    return result


def _note_received(record: dict[str, Any], got: list[int]) -> list[int]:
    """Put what arrived of a killed or frozen writer in its record: the least of its
    tensors' counts (its steps that arrived whole), and each where it wrote several."""
    record["received"] = min(got)
    if len(got) > 1:
        record["received_each"] = got
    return got


def _each(counts: list[int]) -> str:
    return str(counts[0]) if len(counts) == 1 else f"{counts} (tensor by tensor)"


def _trimmed(result: dict[str, Any]) -> str:
    growth = result.get("rss_growth_trimmed_bytes")
    if growth is None:
        return ""
    return f" ({growth / 2**20:+.2f} MiB in use: after malloc_trim at both ends)"


def render(result: dict[str, Any]) -> str:
    lines = []
    tensors = result.get("tensors", 1)
    if tensors > 1:
        lines.append(
            f"{tensors} tensors a sender, written by {result.get('api')} a step: sent counts "
            "steps, received the messages of its tensor that got the fewest"
        )
    consume = result.get("consume", "any")
    if consume != "any":
        lines.append(
            f"taken with wait_{consume} and release_many, sender after sender"
            + (
                f"; {result.get('read_alone', 0)} messages read alone to bring a sender's "
                "tensors in line after a writer that died mid-step"
                if consume == "all"
                else ""
            )
        )
    lines.append(
        f"{'sender':>8} {'transport':>11} {'sent':>10} {'received':>10} {'sessions':>9} "
        f"{'killed':>7}"
    )
    for s in result["senders"]:
        lines.append(
            f"{s['name']:>8} {s['transport']:>11} {s['sent']!s:>10} {s['received']:>10} "
            f"{s.get('sessions')!s:>9} {len(s.get('killed', [])):>7}"
        )
    for what, key in (("killed", "killed"), ("frozen", "frozen")):
        of_transport = [(s["transport"], k) for s in result["senders"] for k in s.get(key, [])]
        faults = [k for _, k in of_transport]
        if not faults:
            continue
        lines.append(
            f"{len(faults)} senders {what} mid-stream: {sum(k['acked'] for k in faults)} of "
            f"their writes returned, {sum(k['received'] for k in faults)} of their messages "
            "arrived"
        )
        # Which transports the shortfall was on, so that nobody has to find out by hand that
        # it is where a write returns before delivery (a shortfall elsewhere is a problem).
        short = Counter(t for t, k in of_transport if k["received"] < k["acked"])
        if short:
            where = ", ".join(f"{t} {n}" for t, n in sorted(short.items()))
            lines.append(
                f"  {sum(short.values())} of them ({where}) lost messages their writes "
                "returned for: over tcp and nixl a write returns before delivery (README, "
                "'Library example')"
            )
        held = sum(1 for k in faults if k.get("held"))
        if held:
            lines.append(
                f"  {held} held their tensor until they ran again (shm: frozen inside a "
                "write), as designed"
            )
        takeovers = sorted(
            k["takeover_s"] for k in faults if "takeover_s" in k and not k.get("held")
        )
        if takeovers:
            lines.append(
                f"  a successor's first message {takeovers[len(takeovers) // 2]:.2f} s after "
                f"the {'freeze' if key == 'frozen' else 'kill'} (median), "
                f"{takeovers[-1]:.2f} s at most"
            )
    if result.get("rss_after_warmup") is None:
        # No warm-up point: a stream received nothing in the whole run (a sender that never
        # started or connected). Printed as growths, the figures read +0.00 MiB and +0
        # descriptors, as if measured.
        measured = (
            "resident memory and descriptors not measured: no warm-up point (a sender's "
            "stream received no message in the run)"
        )
    else:
        measured = (
            f"resident memory {result['rss_growth_bytes'] / 2**20:+.2f} MiB after "
            f"warm-up{_trimmed(result)}; descriptors {result['fd_growth']:+d} "
            f"({len(result.get('fds_left_open', []))} opened since and open still)"
        )
    startup = result.get("startup_s")
    began = "" if startup is None else f" (every sender writing {startup:.1f} s after the start)"
    lines.append(
        f"{result['messages']} messages in {result['duration_s']:.1f} s{began}; {measured}; "
        f"segments {result['segment_growth']:+d}"
    )
    if result.get("rings_moved"):
        lines.append(
            f"  {result['rings_moved']} rings moved to fresh memory away from dropped nixl "
            f"writers ({result.get('region_fds_added', 0)} descriptors of regions added, kept "
            "until the receiver closed)"
        )
    lines.append(
        "OK: nothing lost, duplicated or torn"
        if not result["problems"]
        else "PROBLEMS:\n  " + "\n  ".join(result["problems"])
    )
    return "\n".join(lines)
