"""How long ``rx.wait_any()`` takes to find one message among idle tensors.

A ``shm`` receiver of N tensors of 4 float32 (32 slots each, the depth it picks for them); one
sender in the same process writes a tensor, the receiver takes it with ``wait_any`` and releases
it, 200 times, each time another tensor. Only the ``wait_any`` call is timed; the message is
already there, so this is the search. Prints a JSON line per N.

    cd docs/bench-wait-any-2026-11-29 && python wait_any_idle.py > wait_any_idle.json
"""

from __future__ import annotations

import json
import time

import numpy as np

import tensorwire as tw

MESSAGES = 200


def main() -> None:
    for n in (10, 1000, 20000):
        with tw.Receiver() as rx:
            rx.register_many([(f"t{i}", (4,), "float32") for i in range(n)])
            with tw.Sender.connect(rx.address, transport="shm", timeout=60) as tx:
                a = np.ones(4, np.float32)
                took = []
                for k in range(MESSAGES):
                    tx.write(f"t{(k * 7919) % n}", a)
                    t0 = time.perf_counter()
                    name, _ = rx.wait_any(timeout=5)
                    took.append(time.perf_counter() - t0)
                    rx.release(name)
        took.sort()
        us = [t * 1e6 for t in took]
        print(
            json.dumps(
                {
                    "tensors": n,
                    "messages": MESSAGES,
                    "median_us": round(us[len(us) // 2], 1),
                    "p90_us": round(us[int(len(us) * 0.9)], 1),
                    "min_us": round(us[0], 1),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
