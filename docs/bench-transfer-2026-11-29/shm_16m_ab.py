"""shm throughput at 16 MiB, public API only: a receiver process consumes and releases.

Used for the A/B of shm_16m_ab.json: `python shm_16m_ab.py LABEL`, with each library swapped in
by `git checkout REV -- tensorwire/` (and restored after)."""

import multiprocessing as mp
import sys
import time

import numpy as np

SIZE = 16 << 20
N = 64


def consume(q, n):
    import tensorwire as tw

    with tw.Receiver() as rx:
        rx.register("t", (SIZE // 4,), "float32")
        q.put(rx.address)
        for _ in range(n):
            rx.wait("t", timeout=60)
            rx.release("t")
        q.get()  # hold until told


def main():
    import tensorwire as tw

    ctx = mp.get_context("spawn")
    out = []
    for _ in range(5):
        q = ctx.Queue()
        p = ctx.Process(target=consume, args=(q, N + 8))
        p.start()
        addr = q.get(timeout=60)
        a = np.ones(SIZE // 4, np.float32)
        with tw.Sender.connect(addr, transport="shm", timeout=60) as tx:
            for _ in range(8):
                tx.write("t", a)
            t0 = time.perf_counter()
            for _ in range(N):
                tx.write("t", a)
            dt = time.perf_counter() - t0
        q.put(None)
        p.join(30)
        b = np.empty_like(a)
        t1 = time.perf_counter()
        for _ in range(N):
            np.copyto(b, a)
        dm = time.perf_counter() - t1
        out.append((N * SIZE / dt / 1e9, N * SIZE / dm / 1e9))
    s = sorted(x[0] for x in out)
    m = sorted(x[1] for x in out)
    label = sys.argv[1] if len(sys.argv) > 1 else ""
    print(
        f"{label}: shm {s[2]:.2f} GB/s memcpy {m[2]:.2f} GB/s ratio {s[2] / m[2]:.2f}"
        f"  shm={[round(x[0], 1) for x in out]}"
    )


if __name__ == "__main__":
    main()
