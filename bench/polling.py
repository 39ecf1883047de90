"""``python -m tensorwire.bench.polling``: what a polling receiver costs, for transports without a
wake-up descriptor (``nixl``).

A sender in a second process writes a 4 KiB tensor every ``--gap`` seconds (so the receiver goes
idle between messages, as in a training loop); the receiver reports the one-way time from the
sender's clock reading (carried in the payload) to ``wait`` returning, the sender's ``write``
time, and the receiving process's CPU use while idle afterwards. ``--progress-thread`` runs NIXL's
own progress thread in the receiver instead of tensorwire's polling.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import sys
import time
from typing import Any

import numpy as np

import tensorwire as tw


def _send(address: str, transport: str, count: int, gap: float, out: Any) -> None:
    with tw.Sender.connect(address, transport=transport, timeout=30) as tx:
        payload = np.zeros(512, np.float64)
        took = []
        for _ in range(count):
            time.sleep(gap)
            payload[0] = time.perf_counter()  # CLOCK_MONOTONIC: the same clock in both processes
            tx.write("t", payload)
            took.append(time.perf_counter() - payload[0])
        out.send(took)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tensorwire.bench.polling", description=__doc__)
    p.add_argument("--transport", default="nixl", choices=list(tw.TRANSPORT_NAMES))
    p.add_argument("--count", type=int, default=200, help="messages (default 200)")
    p.add_argument("--gap", type=float, default=0.005, help="seconds between writes (0.005)")
    p.add_argument("--idle", type=float, default=2.0, help="seconds of idle CPU measurement")
    p.add_argument("--progress-thread", action="store_true", help="NIXL's own progress thread")
    args = p.parse_args(argv)
    nixl = None
    if args.transport == "nixl":
        nixl = tw.NixlOptions(progress_thread=args.progress_thread)
    ctx = mp.get_context("spawn")
    with tw.Receiver(ring=4, nixl=nixl) as rx:
        rx.register("t", (512,), "float64")
        here, there = ctx.Pipe()
        proc = ctx.Process(
            target=_send, args=(rx.address, args.transport, args.count, args.gap, there)
        )
        proc.start()
        one_way = []
        try:
            for _ in range(args.count):
                got = rx.wait("t", timeout=60)
                one_way.append(time.perf_counter() - float(got[0]))
                rx.release("t")
            writes = here.recv() if here.poll(60) else []
        finally:
            proc.join(60)
        start, cpu = time.monotonic(), _cpu_seconds()
        time.sleep(args.idle)
        idle = (_cpu_seconds() - cpu) / (time.monotonic() - start)
    one_way.sort()
    p90 = one_way[len(one_way) * 9 // 10]
    how = "NIXL progress thread" if args.progress_thread else "tensorwire polling"
    median_us = statistics.median(one_way) * 1e6
    write_us = statistics.median(writes) * 1e6 if writes else float("nan")
    print(
        f"{args.transport} ({how}), 4 KiB every {args.gap * 1e3:g} ms: one way median "
        f"{median_us:.0f} us, p90 {p90 * 1e6:.0f} us; write() median {write_us:.0f} us; "
        f"receiver idle CPU {idle * 100:.1f}% of a core"
    )
    return 0 if proc.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
