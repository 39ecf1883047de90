"""``python -m tensorwire.bench.cycle``: the library's own cost per message, in one process.

One thread writes a small tensor over ``shm`` to a receiver in the same process, waits for it and
releases it, ``--count`` times per repetition: no second process, no scheduler hand-off, so what
is measured is the Python work of a write, a wait and a release (the per-message overhead that
``tensorwire bench`` latency figures also contain, beside the wake-up between processes). Use it
to compare two versions of the library on one machine, alternating runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tensorwire as tw


def measure(count: int, repeat: int, elements: int) -> list[float]:
    """Microseconds per write + wait + release, one figure per repetition."""
    with tw.Receiver(heartbeat_timeout=None) as rx:
        rx.register("t", (elements,), "float32")
        payload = np.ones(elements, np.float32)
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            figures = []
            for _ in range(repeat):
                start = time.perf_counter()
                for _ in range(count):
                    tx.write("t", payload)
                    rx.wait("t")
                    rx.release("t")
                figures.append((time.perf_counter() - start) / count * 1e6)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tensorwire.bench.cycle", description=__doc__)
    parser.add_argument("--count", type=int, default=20000, help="messages per repetition")
    parser.add_argument("--repeat", type=int, default=7, help="repetitions (median reported)")
    parser.add_argument("--elements", type=int, default=1024, help="float32 elements per message")
    args = parser.parse_args(argv)
    if args.count < 1 or args.repeat < 1 or args.elements < 1:
        parser.error("--count, --repeat and --elements must be positive")
    figures = measure(args.count, args.repeat, args.elements)
    runs = ", ".join(f"{f:.3f}" for f in figures)
    print(f"{statistics.median(figures):.3f} us per write + wait + release (runs: {runs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
