"""How long one sender takes to open sessions with 16 receivers (each in a process of its own,
its NIXL server started before), one after the other and from 4 or 16 threads at once, over
``tcp`` and over ``nixl``: what a user's loop that connects to many receivers gains by doing it
from threads. Needs f3659a8 or later (add_peer outside the sender's lock; before it, the
threads took turns).

    python docs/bench-ps-many-workers-2026-12-02/add_peers.py
"""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import tensorwire as tw

RECEIVERS = 16

RECEIVER = """
import time, tensorwire as tw
rx = tw.Receiver(nixl=True)
rx.register("x", (1024,), "float32")
print(rx.address, flush=True)
time.sleep(300)
"""


def main() -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
        for _ in range(RECEIVERS)
    ]
    try:
        addresses = [p.stdout.readline().strip() for p in procs if p.stdout is not None]
        warm = False
        for transport in ("tcp", "nixl"):
            # A first round, not counted: a receiver starts its NIXL server as the first sender
            # attaches over nixl, which the first round measured would pay alone.
            for threads in (16, 1, 4, 16, 1, 4, 16):
                with tw.Sender(transport=transport, timeout=60) as tx:
                    began = time.perf_counter()
                    with ThreadPoolExecutor(threads) as pool:
                        list(pool.map(tx.add_peer, addresses))
                    took = time.perf_counter() - began
                    assert len(tx.peers) == RECEIVERS
                if not warm:
                    warm = True
                    continue
                print(
                    f"{transport}, {threads:2d} thread(s): {RECEIVERS} add_peer in "
                    f"{took * 1000:.0f} ms",
                    flush=True,
                )
            warm = False
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
