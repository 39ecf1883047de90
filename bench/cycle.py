"""``python -m tensorwire.bench.cycle``: the library's own cost per message, in one process.

One thread writes a small tensor over ``shm`` to a receiver in the same process, waits for it and
releases it, ``--count`` times per repetition: no second process, no scheduler hand-off, so what
is measured is the Python work of a write, a wait and a release (the per-message overhead that
``tensorwire bench`` latency figures also contain, beside the wake-up between processes). Use it
to compare two versions of the library on one machine, alternating runs.

``--each`` times every call on its own instead (the median of each of ``write``, ``wait`` and
``release`` over all messages, and of an empty timing, which each figure includes): where a
message's time goes, and, against a stream's time per message, which end bounds it.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

import tensorwire as tw


@contextlib.contextmanager
def _loop(elements: int) -> Iterator[tuple[tw.Receiver, tw.Sender, np.ndarray[Any, Any]]]:
    """A receiver of tensor "t" (``elements`` float32), a ``shm`` sender to it in this same
    process, and the payload to write."""
    with tw.Receiver(heartbeat_timeout=None) as rx:
        rx.register("t", (elements,), "float32")
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            yield rx, tx, np.ones(elements, np.float32)


def measure(count: int, repeat: int, elements: int) -> list[float]:
    """Microseconds per write + wait + release, one figure per repetition."""
    with _loop(elements) as (rx, tx, payload):
        figures = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(count):
                tx.write("t", payload)
                rx.wait("t")
                rx.release("t")
            figures.append((time.perf_counter() - start) / count * 1e6)
    return figures


def measure_each(count: int, elements: int) -> dict[str, float]:
    """Median microseconds of each call (``write``, ``wait``, ``release``) over ``count``
    messages, and of an empty pair of timer reads (``timer``), which each figure includes."""
    clock = time.perf_counter
    with _loop(elements) as (rx, tx, payload):
        for _ in range(min(count, 1000)):  # past the first messages' one-off costs
            tx.write("t", payload)
            rx.wait("t")
            rx.release("t")
        times: dict[str, list[float]] = {"write": [], "wait": [], "release": [], "timer": []}
        write, wait, release, timer = times.values()
        for _ in range(count):
            t0 = clock()
            tx.write("t", payload)
            t1 = clock()
            rx.wait("t")
            t2 = clock()
            rx.release("t")
            t3 = clock()
            t4 = clock()
            write.append(t1 - t0)
            wait.append(t2 - t1)
            release.append(t3 - t2)
            timer.append(t4 - t3)
    return {call: statistics.median(ts) * 1e6 for call, ts in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tensorwire.bench.cycle", description=__doc__)
    parser.add_argument("--count", type=int, default=20000, help="messages per repetition")
    parser.add_argument("--repeat", type=int, default=7, help="repetitions (median reported)")
    parser.add_argument("--elements", type=int, default=1024, help="float32 elements per message")
    parser.add_argument(
        "--each",
        action="store_true",
        help="time write, wait and release each on its own (medians over all messages)",
    )
    args = parser.parse_args(argv)
    if args.count < 1 or args.repeat < 1 or args.elements < 1:
        parser.error("--count, --repeat and --elements must be positive")
    if args.each:
        each = measure_each(args.count, args.elements)
        print(
            ", ".join(f"{call} {us:.3f}" for call, us in each.items())
            + f" us (medians of {args.count} messages of {args.elements * 4} bytes)"
        )
        return 0
    figures = measure(args.count, args.repeat, args.elements)
    runs = ", ".join(f"{f:.3f}" for f in figures)
    print(f"{statistics.median(figures):.3f} us per write + wait + release (runs: {runs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
