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
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import tensorwire as tw
from tensorwire.job.config import at_least, positive_seconds
from tensorwire.job.files import output_file

from .common import machine_facts, parse_size
from .report import SCHEMA

#: Transports whose write returns only once the message is the receiver's (completed in its
#: ring, or acknowledged by it): every message a killed sender wrote must still arrive. Over
#: the others a write returns once the bytes are handed on (a socket's buffer, a queued RDMA
#: write), and what a sender killed just after handed on may be lost with it.
WRITE_IS_DELIVERY = frozenset({"shm", "grpc"})

#: A message's counter: the sender's incarnation in the high 32 bits, its sequence below.
SEQ_BITS = 32

#: Seconds at the end of the run in which no sender is killed, so that the last ones finish.
KILL_QUIET = 3.0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("soak", help="bounded load test: every message accounted for, no leaks")
    p.add_argument(
        "--duration", type=positive_seconds, default=30.0, help="seconds of load (default 30)"
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
        "--seed", type=int, default=0, help="seed of the kills' moments and choices (default 0)"
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="the receiver's heartbeat timeout: how long a killed sender's tensor may stay "
        "claimed where its death is seen only by its silence (default 30)",
    )
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the results as JSON")


def _sender(
    address: str,
    transport: str,
    name: str,
    duration: float,
    every: int,
    conn: Any,
    incarnation: int,
    acked: Any,
    slot: int,
) -> None:
    """Write numbered messages for ``duration`` s, in sessions of ``every`` messages each (0:
    one session), each counter ``incarnation << SEQ_BITS | seq``; store how many writes have
    returned in ``acked[slot]`` after each (shared memory: the count survives a SIGKILL); send
    back (messages, sessions), or the error that ended it."""
    sent = sessions = 0
    base = incarnation << SEQ_BITS
    end = time.monotonic() + duration
    try:
        while time.monotonic() < end:
            with tw.Sender.connect(address, transport=transport, timeout=60) as tx:
                sessions += 1
                arr = np.empty(tx.spec(name).static_shape, dtype=np.int64)
                stop = sent + every if every else None
                while time.monotonic() < end and sent != stop:
                    arr.fill(base | sent)
                    tx.write(name, arr)
                    sent += 1
                    acked[slot] = sent
    except tw.TensorWireError as exc:
        conn.send(f"{type(exc).__name__} after {sent} messages: {exc}")
        raise SystemExit(1) from None
    conn.send((sent, sessions))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _segments() -> int:
    """Shared-memory segments this process owns (their names carry our uid and pid)."""
    mine = f"tensorwire.{os.getuid()}.{os.getpid()}."
    return sum(1 for n in os.listdir("/dev/shm") if n.startswith(mine))


@dataclass
class _Stream:
    """One tensor, its transport, and the sender processes that wrote it in turn."""

    name: str
    transport: str
    slot: int  # its index in the shared counts of returned writes
    proc: Any = None
    conn: Any = None
    incarnation: int = 0  # of the process writing now
    seen: int = 0  # the latest incarnation a message of which arrived
    received: dict[int, int] = field(default_factory=dict)  # incarnation -> messages arrived
    killed: list[dict[str, Any]] = field(default_factory=list)
    sent: int | None = None  # the last process's report: messages written
    sessions: int | None = None
    failed: str | None = None  # why the last process ended before its time, if it did
    losses: int = 0  # the receiver's notices of a lost writer

    @property
    def done(self) -> bool:
        if self.failed is not None:
            return True
        return self.sent is not None and self.received.get(self.incarnation, 0) >= self.sent

    def hear(self) -> None:
        """Take the last process's report, if it sent one (or the news that it ended
        without: an error, or its death)."""
        if self.sent is not None or self.failed is not None or not self.conn.poll():
            return
        try:
            said = self.conn.recv()
        except EOFError:
            self.proc.join(10)
            said = f"it exited (code {self.proc.exitcode}) without a word"
        if isinstance(said, str):
            self.failed = f"{self.name}: sender {self.incarnation} ({self.transport}): {said}"
        else:
            self.sent, self.sessions = said


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    bad = [t for t in transports if t not in tw.TRANSPORT_NAMES or t == "auto"]
    if bad or not transports:
        parser.error(f"--transports: unknown {', '.join(bad) or '(none given)'}")
    ctx = mp.get_context("spawn")
    elements = max(2, args.size // 8)
    seg0 = _segments()
    rng = random.Random(args.seed)
    kill_every: float | None = args.kill_every
    acked = ctx.RawArray("q", args.senders)
    result: dict[str, Any] = {"schema": SCHEMA, "kind": "soak", "machine": machine_facts()}
    with tw.Receiver(heartbeat_timeout=args.heartbeat_timeout) as rx:
        streams = [
            _Stream(f"s{k}", transports[k % len(transports)], k) for k in range(args.senders)
        ]
        by_name = {s.name: s for s in streams}
        start = time.monotonic()
        end = start + args.duration

        def launch(s: _Stream) -> None:
            acked[s.slot] = 0
            here, there = ctx.Pipe()
            s.proc = ctx.Process(
                target=_sender,
                args=(
                    rx.address,
                    s.transport,
                    s.name,
                    max(end - time.monotonic(), 0.1),
                    args.reconnect_every,
                    there,
                    s.incarnation,
                    acked,
                    s.slot,
                ),
            )
            s.proc.start()
            there.close()
            s.conn = here

        for s in streams:
            rx.register(s.name, (elements,), "int64")
            launch(s)
        problems: list[str] = []
        received = 0
        warm_rss: int | None = None
        warm_fds = 0
        deadline = end + 60
        next_kill = start + rng.expovariate(1 / kill_every) if kill_every else None
        while not all(s.done for s in streams) and time.monotonic() < deadline:
            try:
                name, view = rx.wait_any(timeout=0.2)
            except tw.WireTimeoutError:
                view = None
            except tw.PeerLostError as exc:  # said once per lost writer; its successor goes on
                lost = by_name.get(exc.tensor or "")
                if lost is not None:
                    lost.losses += 1
                view = None
            if view is not None:
                s = by_name[name]
                value = int(view[0])
                inc, seq = value >> SEQ_BITS, value & ((1 << SEQ_BITS) - 1)
                got = s.received.get(inc, 0)
                if inc < s.seen:
                    problems.append(
                        f"{name}: a message of sender {inc} after one of its successor {s.seen}"
                    )
                elif seq != got:
                    problems.append(f"{name}: sender {inc}: expected message {got}, got {seq}")
                elif view.min() != value or view.max() != value:
                    problems.append(f"{name}: sender {inc}: message {seq} is torn")
                if got == 0 and inc > 0 and s.killed and s.killed[-1]["incarnation"] == inc - 1:
                    s.killed[-1]["takeover_s"] = time.monotonic() - s.killed[-1]["at"]
                s.seen = max(s.seen, inc)
                s.received[inc] = got + 1
                received += 1
                rx.release(name)
            now = time.monotonic()
            if warm_rss is None and now - start > min(5.0, args.duration / 5):
                warm_rss, warm_fds = _rss(), _fds()  # every sender connected by now
            for s in streams:
                s.hear()
            if next_kill is not None and kill_every and now >= next_kill:
                next_kill = now + rng.expovariate(1 / kill_every)
                if now < end - KILL_QUIET:
                    _kill_one(rng, streams, acked, launch)
        for s in streams:
            for old in s.killed:
                del old["at"]
                old["received"] = s.received.get(old["incarnation"], 0)
                wrote, got = old["acked"], old["received"]
                # the write in flight at the kill may have landed: one more than returned
                if got > wrote + 1:
                    problems.append(
                        f"{s.name}: killed sender {old['incarnation']} wrote {wrote}, "
                        f"{got} arrived"
                    )
                elif s.transport in WRITE_IS_DELIVERY and got < wrote:
                    problems.append(
                        f"{s.name}: killed sender {old['incarnation']}'s writes returned for "
                        f"{wrote} messages over {s.transport}, {got} arrived"
                    )
            s.proc.join(30)
            s.conn.close()
            last = s.received.get(s.incarnation, 0)
            if s.failed is not None:
                problems.append(s.failed)
            elif s.sent is None:
                problems.append(
                    f"{s.name}: sender {s.incarnation} did not finish (exit code "
                    f"{s.proc.exitcode})"
                )
            elif last != s.sent:
                problems.append(f"{s.name}: sent {s.sent}, received {last}")
        end_rss = _rss()
        time.sleep(0.5)  # the senders' connections wind down
        end_fds = _fds()
        result.update(
            {
                "duration_s": time.monotonic() - start,
                "senders": [
                    {
                        "name": s.name,
                        "transport": s.transport,
                        "sent": s.sent,
                        "received": s.received.get(s.incarnation, 0),
                        "sessions": s.sessions,
                        "killed": s.killed,
                        "losses_told": s.losses,
                    }
                    for s in streams
                ],
                "reconnect_every": args.reconnect_every,
                "kill_every": kill_every,
                "seed": args.seed,
                "messages": received,
                "rss_after_warmup": warm_rss,
                "rss_end": end_rss,
                "rss_growth_bytes": end_rss - (warm_rss or end_rss),
            }
        )
        # Compared with the warm-up, when every sender was connected: the senders have gone since,
        # so anything above that count would be a descriptor that outlived its use.
        result["fd_growth"] = end_fds - (warm_fds if warm_rss is not None else end_fds)
    result["segment_growth"] = _segments() - seg0
    if result["fd_growth"] > 0:
        problems.append(f"{result['fd_growth']} file descriptors leaked")
    if result["segment_growth"]:
        problems.append(f"{result['segment_growth']} shared-memory segments leaked")
    result["problems"] = problems
    return result


def _kill_one(rng: random.Random, streams: list[_Stream], acked: Any, launch: Any) -> None:
    """SIGKILL the sender of a stream chosen at random, mid-stream (one that has written), and
    start its successor."""
    writing = [
        s
        for s in streams
        if s.sent is None and s.failed is None and acked[s.slot] > 0 and s.proc.is_alive()
    ]
    if not writing:
        return
    s = rng.choice(writing)
    os.kill(s.proc.pid, signal.SIGKILL)
    s.proc.join(10)
    s.conn.close()
    # takeover_s: from the kill to its successor's first message, set when that arrives
    s.killed.append(
        {"incarnation": s.incarnation, "acked": int(acked[s.slot]), "at": time.monotonic()}
    )
    s.incarnation += 1
    launch(s)


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{'sender':>8} {'transport':>11} {'sent':>10} {'received':>10} {'sessions':>9} "
        f"{'killed':>7}"
    ]
    for s in result["senders"]:
        lines.append(
            f"{s['name']:>8} {s['transport']:>11} {s['sent']!s:>10} {s['received']:>10} "
            f"{s.get('sessions')!s:>9} {len(s.get('killed', [])):>7}"
        )
    kills = [k for s in result["senders"] for k in s.get("killed", [])]
    if kills:
        lines.append(
            f"{len(kills)} senders killed mid-stream: {sum(k['acked'] for k in kills)} of their "
            f"writes returned, {sum(k['received'] for k in kills)} of their messages arrived"
        )
        takeovers = sorted(k["takeover_s"] for k in kills if "takeover_s" in k)
        if takeovers:
            lines.append(
                f"a successor's first message {takeovers[len(takeovers) // 2]:.2f} s after the "
                f"kill (median), {takeovers[-1]:.2f} s at most"
            )
    lines.append(
        f"{result['messages']} messages in {result['duration_s']:.1f} s; resident memory "
        f"{result['rss_growth_bytes'] / 2**20:+.2f} MiB after warm-up; descriptors "
        f"{result['fd_growth']:+d}; segments {result['segment_growth']:+d}"
    )
    lines.append(
        "OK: nothing lost, duplicated or torn"
        if not result["problems"]
        else "PROBLEMS:\n  " + "\n  ".join(result["problems"])
    )
    return "\n".join(lines)
