"""A batch's cost where it never waits: 8 tensors of 4 KiB over shm, ``write_many`` then
``wait_all`` and ``release_many`` in one process, 3000 a run, the best of 5 runs."""

from __future__ import annotations

import time

import numpy as np

import tensorwire as tw

NAMES = [f"t{i}" for i in range(8)]


def main() -> None:
    with tw.Receiver(ring=4) as rx:
        for name in NAMES:
            rx.register(name, (1024,), "float32")
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            arrays = [(name, np.ones(1024, np.float32)) for name in NAMES]
            runs = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(3000):
                    tx.write_many(arrays)
                    rx.wait_all(NAMES)
                    rx.release_many(NAMES)
                runs.append((time.perf_counter() - t0) / 3000 * 1e6)
            print(f"{min(runs):.2f} us per batch of 8 (write_many + wait_all + release_many)")


if __name__ == "__main__":
    main()
