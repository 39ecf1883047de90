"""Runs tests/test_random_use.py's random calls for many seeds:
``PYTHONPATH=. python docs/random-use-2026-12-05/drive.py TRANSPORT FIRST_SEED END_SEED CALLS
[THREADS]``; with THREADS, that many threads at once, each with tensors of its own, on the
same receiver and senders (the figures in README.md, 2026-12-05: results.txt)."""

import sys
import threading
import time

import tensorwire as tw
from tests.test_random_use import DRAWS, SHARED_DRAWS, Run

transport, lo, hi, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
threads = int(sys.argv[5]) if len(sys.argv) > 5 else 0


def go(run: Run, k: int, counts: list[int], failures: list[BaseException]) -> None:
    """One thread's calls; what it wrote into ``counts[k]``, or its failure."""
    try:
        for _ in range(calls):
            run.step(run.rnd.choice(SHARED_DRAWS))
        counts[k] = run.finish()
    except BaseException as exc:
        failures.append(exc)


t0 = time.monotonic()
written = 0
for seed in range(lo, hi):
    with (
        tw.Receiver() as rx,
        tw.Sender.connect(rx.address, transport=transport, timeout=30) as a,
        tw.Sender.connect(rx.address, transport=transport, timeout=30) as b,
    ):
        if not threads:
            run = Run(rx, [a, b], transport, seed)
            for _ in range(calls):
                run.step(run.rnd.choice(DRAWS))
            written += run.finish()
            continue
        runs = [Run(rx, [a, b], transport, seed * 100 + k, f"t{k}.") for k in range(threads)]
        failures: list[BaseException] = []
        counts = [0] * threads
        started = [
            threading.Thread(target=go, args=(runs[k], k, counts, failures)) for k in range(threads)
        ]
        for thread in started:
            thread.start()
        for thread in started:
            thread.join(300)
        if any(thread.is_alive() for thread in started):
            sys.exit(f"{transport}: seed {seed}: a thread's calls hung")
        if failures:
            raise failures[0]
        written += sum(counts)
how = f"{threads} threads, " if threads else ""
print(
    f"{transport}: {how}seeds {lo}-{hi - 1}, {calls} calls each, {written} messages, none failed, "
    f"{time.monotonic() - t0:.1f} s"
)
