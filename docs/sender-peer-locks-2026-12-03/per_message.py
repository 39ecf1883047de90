"""A sender's per-message cost, and one thread's writes while another's write waits for a credit.

Run against one commit, then another (same machine, in turn):
``python docs/sender-peer-locks-2026-12-03/per_message.py``. Prints, per transport (``shm``,
``tcp``; receiver in this process, whose consumer drains between rounds, so only the writes'
own time is counted): microseconds per 4 KiB message for ``write`` on its fast route
(``peer=None``), ``write`` naming its receiver (``peer=``: the general path, until it got
fast routes of its own: per_message_peer_routes.txt), and ``write_many``
of 16 tensors (per message); the median of 5 rounds of 4096 messages. Then, over ``shm``: a
thread writes 2000 messages to one receiver while another thread's write to a second receiver
waits for a credit (its one slot held, timeout 3 s): the seconds those 2000 writes took.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time

import numpy as np

import tensorwire as tw

ROUNDS = 5
PER_ROUND = 4096
RING = 64
TENSORS = 16


def per_message(transport: str) -> dict[str, float]:
    x = np.ones(1024, np.float32)  # 4 KiB
    out: dict[str, float] = {}
    with tw.Receiver(ring=RING) as rx:
        names = [f"t{k}" for k in range(TENSORS)]
        for name in names:
            rx.register(name, (1024,), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:

            def drain(counts: dict[str, int]) -> None:
                for name, n in counts.items():
                    for _ in range(n):
                        rx.wait(name, timeout=10)
                        rx.release(name)

            def timed(step: str, body: object) -> None:
                times = []
                for _ in range(ROUNDS):
                    spent = 0.0
                    done = 0
                    while done < PER_ROUND:
                        began = time.perf_counter()
                        counts = body()  # type: ignore[operator]
                        spent += time.perf_counter() - began
                        drain(counts)
                        done += sum(counts.values())
                    times.append(spent / done * 1e6)
                out[step] = statistics.median(times)

            for name in names:  # claims made, fast routes set up
                tx.write(name, x)
            drain({name: 1 for name in names})

            def fast() -> dict[str, int]:
                for _ in range(RING):
                    tx.write("t0", x)
                return {"t0": RING}

            def named() -> dict[str, int]:
                for _ in range(RING):
                    tx.write("t0", x, peer=rx.address)
                return {"t0": RING}

            batch = {name: x for name in names}

            def many() -> dict[str, int]:
                for _ in range(RING):
                    tx.write_many(batch)
                return {name: RING for name in names}

            timed("write (fast route)", fast)
            timed("write (peer=)", named)
            timed("write_many of 16", many)
    return out


def beside_a_blocked_write() -> float:
    x = np.ones(1024, np.float32)
    with tw.Receiver(ring=1) as held, tw.Receiver(ring=RING) as rx:
        held.register("h", (1024,), "float32")
        rx.register("t", (1024,), "float32")
        with tw.Sender(transport="shm", timeout=3) as tx:
            tx.add_peer(held.address)
            tx.add_peer(rx.address)
            tx.write("h", x)  # its one slot, never released
            tx.write("t", x)
            rx.wait("t", timeout=5)
            rx.release("t")

            def blocked() -> None:
                with contextlib.suppress(tw.WireTimeoutError):
                    tx.write("h", x)

            thread = threading.Thread(target=blocked)
            thread.start()
            time.sleep(0.2)
            began = time.perf_counter()
            for _ in range(2000 // RING + 1):
                for _ in range(RING):
                    tx.write("t", x, timeout=10)
                for _ in range(RING):
                    rx.wait("t", timeout=10)
                    rx.release("t")
            took = time.perf_counter() - began
            thread.join()
    return took


def main() -> None:
    for transport in ("shm", "tcp"):
        for step, us in per_message(transport).items():
            print(f"{transport:4} {step:20} {us:7.2f} us/message")
    print(f"shm  2000+ writes beside a blocked write: {beside_a_blocked_write():.3f} s")


if __name__ == "__main__":
    main()
