import sys, time, threading, numpy as np
sys.path.insert(0, sys.argv[1])
import tensorwire as tw
assert tw.__file__.startswith(sys.argv[1]), tw.__file__
transport = sys.argv[2]; n = 8; count = 3000
names = [f"t{i}" for i in range(n)]
with tw.Receiver() as rx:
    for nm in names: rx.register(nm, (1024,), "float32")
    def consume():
        for _ in range(count):
            rx.wait_all(names, timeout=30); rx.release_many(names)
    with tw.Sender.connect(rx.address, transport=transport, timeout=30) as tx:
        arrs = {nm: np.ones(1024, np.float32) for nm in names}
        tx.write_many(arrs); rx.wait_all(names, timeout=30); rx.release_many(names)
        th = threading.Thread(target=consume); th.start()
        t = time.perf_counter()
        for _ in range(count): tx.write_many(arrs)
        th.join(); dt = time.perf_counter() - t
print(sys.argv[1], transport, "%.1f us per batch" % (dt / count * 1e6))
