"""What metrics cost (issue 12): the per-message counting, and a scrape.

``python bench/metrics_cost.py loop`` times write + wait + release of a 4 KiB tensor over shm in
one process (no other work: the per-message path alone, where the counting's integer additions
weigh most). Run it under the commit before the counting (``PYTHONPATH=<that checkout>``) and
under this one, alternately, to compare (BENCHMARKS.md, "Metrics"). ``python bench/metrics_cost.py
scrape`` times one scrape of ``/metrics`` in a process with 200 tensors. Uses only the public API.
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request

import numpy as np

import tensorwire as tw


def loop(messages: int, repeat: int) -> list[float]:
    """Microseconds per write + wait + release, one figure per repetition."""
    out = []
    with tw.Receiver() as rx:
        rx.register("t", (1024,), "float32", ring=8)
        with tw.Sender.connect(rx.address, transport="shm") as tx:
            a = np.ones(1024, np.float32)
            for _ in range(repeat):
                t0 = time.perf_counter()
                for _ in range(messages):
                    tx.write("t", a)
                    rx.wait("t", timeout=5)
                    rx.release("t")
                out.append((time.perf_counter() - t0) / messages * 1e6)
    return out


def scrape(tensors: int, repeat: int) -> tuple[int, list[float]]:
    """The page's size and the milliseconds of each scrape."""
    from tensorwire import metrics

    with tw.Receiver() as rx:
        for k in range(tensors):
            rx.register(f"grad/{k}", (16,), "float32")
        with tw.Sender.connect(rx.address, transport="shm") as tx:
            for k in range(tensors):
                tx.write(f"grad/{k}", np.ones(16, np.float32))
                rx.wait(f"grad/{k}", timeout=5)
                rx.release(f"grad/{k}")
            server = metrics.serve(0, "127.0.0.1")
            try:
                times, size = [], 0
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    with urllib.request.urlopen(server.url, timeout=10) as reply:
                        size = len(reply.read())
                    times.append((time.perf_counter() - t0) * 1e3)
            finally:
                server.close()
    return size, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["loop", "scrape"])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    if args.what == "loop":
        us = loop(50_000, args.repeat)
        print(f"{statistics.median(us):.3f} us per write + wait + release (median of {len(us)})")
    else:
        size, ms = scrape(200, 50)
        print(f"scrape of {size} bytes: median {statistics.median(ms):.2f} ms")


if __name__ == "__main__":
    main()
