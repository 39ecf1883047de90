"""``tensorwire bench soak``: a bounded load test that accounts for every message.

Several sender processes (over every chosen transport) write continuously into one receiver for
``--duration`` seconds. Each message carries its sender's counter; the receiver checks that every
sender's messages arrive exactly once and in order (none lost, none duplicated, none torn: every
element of a message carries the same counter), and that its own resident memory, open file
descriptors and shared-memory segments stay flat after a warm-up. Exit status 1 on any violation.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from typing import Any

import numpy as np

import tensorwire as tw
from tensorwire.job.config import at_least, positive_seconds
from tensorwire.job.files import output_file

from .common import machine_facts, parse_size
from .report import SCHEMA


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
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the results as JSON")


def _sender(
    address: str, transport: str, name: str, duration: float, every: int, conn: Any
) -> None:
    """Write numbered messages for ``duration`` s, in sessions of ``every`` messages each (0:
    one session); send back (messages, sessions)."""
    sent = sessions = 0
    end = time.monotonic() + duration
    while time.monotonic() < end:
        with tw.Sender.connect(address, transport=transport, timeout=60) as tx:
            sessions += 1
            arr = np.empty(tx.spec(name).static_shape, dtype=np.int64)
            stop = sent + every if every else None
            while time.monotonic() < end and sent != stop:
                arr.fill(sent)
                tx.write(name, arr)
                sent += 1
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


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    bad = [t for t in transports if t not in tw.TRANSPORT_NAMES or t == "auto"]
    if bad or not transports:
        parser.error(f"--transports: unknown {', '.join(bad) or '(none given)'}")
    ctx = mp.get_context("spawn")
    elements = max(2, args.size // 8)
    seg0 = _segments()
    expect: dict[str, int] = {}
    sessions: dict[str, int] = {}
    result: dict[str, Any] = {"schema": SCHEMA, "kind": "soak", "machine": machine_facts()}
    with tw.Receiver() as rx:
        names = [f"s{k}" for k in range(args.senders)]
        for name in names:
            rx.register(name, (elements,), "int64")
        procs = []
        for k, name in enumerate(names):
            here, there = ctx.Pipe()
            t = transports[k % len(transports)]
            p = ctx.Process(
                target=_sender,
                args=(rx.address, t, name, args.duration, args.reconnect_every, there),
            )
            p.start()
            procs.append((name, t, p, here))
        nxt = dict.fromkeys(names, 0)
        problems: list[str] = []
        received = 0
        start = time.monotonic()
        warm_rss: int | None = None
        warm_fds = 0
        deadline = start + args.duration + 60
        alive = set(names)
        while alive and time.monotonic() < deadline:
            try:
                name, view = rx.wait_any(timeout=0.5)
            except tw.WireTimeoutError:
                view = None
            if view is not None:
                k = int(view[0])
                if k != nxt[name]:
                    problems.append(f"{name}: expected message {nxt[name]}, got {k}")
                elif view.min() != k or view.max() != k:
                    problems.append(f"{name}: message {k} is torn")
                nxt[name] = k + 1
                received += 1
                rx.release(name)
            if warm_rss is None and time.monotonic() - start > min(5.0, args.duration / 5):
                warm_rss, warm_fds = _rss(), _fds()  # every sender connected by now
            for name, _, _, conn in procs:
                if name in alive and name not in expect and conn.poll():
                    expect[name], sessions[name] = conn.recv()
                if name in expect and nxt[name] >= expect[name]:
                    alive.discard(name)
        for name, _, p, conn in procs:
            p.join(30)
            conn.close()
            if name not in expect:
                problems.append(f"{name}: the sender did not finish (exit code {p.exitcode})")
            elif nxt[name] != expect[name]:
                problems.append(f"{name}: sent {expect[name]}, received {nxt[name]}")
        end_rss = _rss()
        time.sleep(0.5)  # the senders' connections wind down
        end_fds = _fds()
        result.update(
            {
                "duration_s": time.monotonic() - start,
                "senders": [
                    {
                        "name": n,
                        "transport": t,
                        "sent": expect.get(n),
                        "received": nxt[n],
                        "sessions": sessions.get(n),
                    }
                    for n, t, _, _ in procs
                ],
                "reconnect_every": args.reconnect_every,
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


def render(result: dict[str, Any]) -> str:
    lines = [f"{'sender':>8} {'transport':>11} {'sent':>10} {'received':>10} {'sessions':>9}"]
    for s in result["senders"]:
        lines.append(
            f"{s['name']:>8} {s['transport']:>11} {s['sent']!s:>10} {s['received']:>10} "
            f"{s.get('sessions')!s:>9}"
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
