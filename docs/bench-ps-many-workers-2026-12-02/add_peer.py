"""How long one process takes to open a sender's session with each of 8 receivers (each in a
process of its own, its NIXL server started with it), over ``tcp`` and over ``nixl``: what a
parameter server pays for each worker that joins, one after the other.

    python docs/bench-ps-many-workers-2026-12-02/add_peer.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import tensorwire as tw

RECEIVER = """
import time, tensorwire as tw
rx = tw.Receiver(nixl=True)
rx.register("x", (1024,), "float32")
print(rx.address, flush=True)
time.sleep(120)
"""


def main() -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    try:
        addresses = [p.stdout.readline().strip() for p in procs if p.stdout is not None]
        for transport in ("tcp", "nixl"):
            with tw.Sender(transport=transport, timeout=30) as tx:
                took = []
                for address in addresses:
                    began = time.perf_counter()
                    tx.add_peer(address)
                    took.append(time.perf_counter() - began)
            ms = [round(t * 1000) for t in took]
            print(f"{transport}: add_peer ms {ms}, median {statistics.median(ms)}", flush=True)
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
