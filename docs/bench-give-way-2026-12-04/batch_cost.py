import time, numpy as np, tensorwire as tw
names = [f"t{i}" for i in range(8)]
with tw.Receiver(ring=4) as rx:
    for n in names: rx.register(n, (1024,), "float32")
    with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
        arrs = [(n, np.ones(1024, np.float32)) for n in names]
        best = []
        for rep in range(5):
            t0 = time.perf_counter()
            for _ in range(3000):
                tx.write_many(arrs)
                rx.wait_all(names); rx.release_many(names)
            best.append((time.perf_counter() - t0) / 3000 * 1e6)
        print(f"{min(best):.2f} us per batch of 8 (write_many + wait_all + release_many), min of 5")
