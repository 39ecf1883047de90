"""One sender's ``write_many`` of eight 4 KiB tensors into an in-process receiver, whose consumer
thread takes each batch with ``wait_all``: microseconds a batch, for the library found first on
the path given (a worktree of another commit, or this checkout).

    python batch_loop.py LIBRARY_ROOT tcp|shm
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

sys.path.insert(0, sys.argv[1])
import tensorwire as tw  # (the library of the root given: after the path)

assert tw.__file__.startswith(sys.argv[1]), tw.__file__
transport = sys.argv[2]
count = 3000
names = [f"t{i}" for i in range(8)]
with tw.Receiver() as rx:
    for name in names:
        rx.register(name, (1024,), "float32")

    def consume() -> None:
        for _ in range(count):
            rx.wait_all(names, timeout=30)
            rx.release_many(names)

    with tw.Sender.connect(rx.address, transport=transport, timeout=30) as tx:
        arrays = {name: np.ones(1024, np.float32) for name in names}
        tx.write_many(arrays)  # (the claims)
        rx.wait_all(names, timeout=30)
        rx.release_many(names)
        consumer = threading.Thread(target=consume)
        consumer.start()
        began = time.perf_counter()
        for _ in range(count):
            tx.write_many(arrays)
        consumer.join()
        took = time.perf_counter() - began
print(f"{sys.argv[1]} {transport} {took / count * 1e6:.1f} us per batch")
