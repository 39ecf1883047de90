"""1000 pings and 200 first writes' claims (one at a time) over shm, median of 5 rounds: the
cost of the control path (control_path.txt has the runs)."""

import statistics
import time

import numpy as np

import tensorwire as tw

rx = tw.Receiver()
for k in range(200):
    rx.register(f"t{k}", (4,), "int64")
pings, claims = [], []
for _ in range(5):
    with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
        began = time.perf_counter()
        for _ in range(1000):
            tx.ping()
        pings.append((time.perf_counter() - began) / 1000 * 1e6)
        began = time.perf_counter()
        for k in range(200):
            tx.write(f"t{k}", np.zeros(4, np.int64))
        claims.append((time.perf_counter() - began) / 200 * 1e6)
    for k in range(200):
        rx.drain(f"t{k}")
print(
    f"{tw.__file__}: ping {statistics.median(pings):.1f} us, first write (claim) "
    f"{statistics.median(claims):.1f} us  (rounds: {[round(x) for x in pings]}, "
    f"{[round(x) for x in claims]})"
)
rx.close()
