"""1000 pings and 200 first writes' claims (one at a time), median of 5 rounds: the control path."""
import statistics, time, numpy as np, tensorwire as tw
rx = tw.Receiver()
for k in range(200):
    rx.register(f"t{k}", (4,), "int64")
rounds_ping, rounds_claim = [], []
for r in range(5):
    with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
        t0 = time.perf_counter()
        for _ in range(1000):
            tx.ping()
        rounds_ping.append((time.perf_counter() - t0) / 1000 * 1e6)
        t0 = time.perf_counter()
        for k in range(200):
            tx.write(f"t{k}", np.zeros(4, np.int64))
        rounds_claim.append((time.perf_counter() - t0) / 200 * 1e6)
    rx.drain_all() if hasattr(rx, "drain_all") else [rx.drain(f"t{k}") for k in range(200)]
print(f"{tw.__file__}: ping {statistics.median(rounds_ping):.1f} us, first write (claim) {statistics.median(rounds_claim):.1f} us  (rounds: {[round(x) for x in rounds_ping]}, {[round(x) for x in rounds_claim]})")
rx.close()
