"""Runs tests/test_random_use.py's random calls for many seeds: PYTHONPATH=. python
docs/random-use-2026-12-05/drive.py TRANSPORT FIRST_SEED END_SEED CALLS (the figures in
README.md, 2026-12-05: seeds 100-159, 1500 calls each, every transport: results.txt)."""

import sys
import time

import tensorwire as tw
from tests.test_random_use import DRAWS, Run

transport, lo, hi, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t0 = time.monotonic()
written = 0
for seed in range(lo, hi):
    with (
        tw.Receiver() as rx,
        tw.Sender.connect(rx.address, transport=transport, timeout=30) as a,
        tw.Sender.connect(rx.address, transport=transport, timeout=30) as b,
    ):
        run = Run(rx, [a, b], transport, seed)
        for _ in range(calls):
            run.step(run.rnd.choice(DRAWS))
        written += run.finish()
print(
    f"{transport}: seeds {lo}-{hi - 1}, {calls} calls each, {written} messages, none failed, "
    f"{time.monotonic() - t0:.1f} s"
)
