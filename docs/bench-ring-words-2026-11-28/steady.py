"""A write_many of 2,000 small tensors over shm, wait_all and release_many, 40 times: the median
per tensor (the steady state of a step's many small tensors)."""

import json
import statistics
import sys
import time

import numpy as np

import tensorwire as tw

N = 2000
names = [f"t{i}" for i in range(N)]
x = np.ones(16, np.float32)
with tw.Receiver() as rx:
    rx.register_many([(n, (16,), "float32") for n in names])
    with tw.Sender.connect(rx.address, transport="shm", timeout=60) as tx:
        batch = {n: x for n in names}
        tx.write_many(batch)
        rx.wait_all(names, timeout=60)
        rx.release_many(names)
        ts = []
        for _ in range(40):
            t = time.perf_counter()
            tx.write_many(batch)
            rx.wait_all(names, timeout=60)
            rx.release_many(names)
            ts.append(time.perf_counter() - t)
us = statistics.median(ts) / N * 1e6
print(f"{us:.2f} us a tensor")
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as out:
        json.dump(
            {
                "what": __doc__,
                "library": tw.__file__,
                "tensors": N,
                "rounds_s": ts,
                "median_us_a_tensor": us,
            },
            out,
            indent=1,
        )
