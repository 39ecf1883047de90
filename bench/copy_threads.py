"""``python -m tensorwire.bench.copy_threads``: would splitting a large write across threads help?

A large ``shm`` write is one copy, by the sender's thread, into the receiver's slot. This measures
that copy on this machine against the same bytes split into equal parts, one per thread (the
caller's thread takes the first part; the others go to a pool started beforehand, so no thread
is started per copy). numpy releases the GIL while it copies, so the parts do run at once. Each
line is the median of ``--repeat`` timings, each of enough copies to move 256 MiB, taken in turn
with the other thread counts; "vs first" compares with the first count given (1 by default).
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .common import human, parse_sizes

MOVED_PER_TIMING = 256 << 20


def split_copy(
    pool: ThreadPoolExecutor, dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any], parts: int
) -> None:
    """Copy ``src`` into ``dst`` (both flat bytes) in ``parts`` equal parts at once."""
    step = -(-src.nbytes // parts)
    rest = [
        pool.submit(np.copyto, dst[k * step : (k + 1) * step], src[k * step : (k + 1) * step])
        for k in range(1, parts)
    ]
    np.copyto(dst[:step], src[:step])
    for part in rest:
        part.result()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tensorwire.bench.copy_threads", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--sizes", type=parse_sizes, default="1M,4M,16M,64M", help="sizes (default %(default)s)"
    )
    parser.add_argument("--threads", default="1,2,4", help="thread counts (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=7, help="timings per line (default 7)")
    args = parser.parse_args(argv)
    sizes: list[int] = args.sizes
    try:
        counts = [int(t) for t in args.threads.split(",")]
    except ValueError:
        parser.error(f"--threads takes whole numbers, e.g. 1,2,4; got {args.threads!r}")
    if args.repeat < 1 or not counts or min(counts) < 1:
        parser.error("--repeat and every thread count must be at least 1")
    with ThreadPoolExecutor(max(counts)) as pool:
        print(f"{'size':>8} {'threads':>8} {'GB/s':>8} {'vs first':>9}")
        for size in sizes:
            src = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
            dst = np.empty_like(src)
            copies = max(1, MOVED_PER_TIMING // size)
            # Alternated, so that every thread count sees the same moments of a noisy machine.
            timings: dict[int, list[float]] = {parts: [] for parts in counts}
            for _ in range(args.repeat):
                for parts in counts:
                    started = time.perf_counter()
                    for _ in range(copies):
                        split_copy(pool, dst, src, parts)
                    timings[parts].append((time.perf_counter() - started) / copies)
            single = size / statistics.median(timings[counts[0]]) / 1e9
            for parts in counts:
                rate = size / statistics.median(timings[parts]) / 1e9
                print(f"{human(size):>8} {parts:>8} {rate:>8.1f} {rate / single:>6.2f}x")


if __name__ == "__main__":
    main()
