"""The CPU an idle receiver takes (its process, over 10 s), one sender attached and quiet after
one message: over ``nixl`` (its polling thread), and over ``tcp`` from a receiver without NIXL,
three times each, alternating.

    python docs/bench-ps-many-workers-2026-12-02/idle_receiver.py
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time

import tensorwire as tw

SENDER = """
import sys, time, numpy as np, tensorwire as tw
tx = tw.Sender.connect(sys.argv[1], transport=sys.argv[2], timeout=30)
tx.write("x", np.ones(1024, np.float32))
time.sleep(14)
"""


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    for transport in ("nixl", "tcp") * 3:
        with tw.Receiver(nixl=transport == "nixl") as rx:
            rx.register("x", (1024,), "float32")
            sender = subprocess.Popen([sys.executable, "-c", SENDER, rx.address, transport])
            rx.wait("x", timeout=30)
            rx.release("x")
            time.sleep(1.5)
            began, cpu = time.monotonic(), cpu_seconds()
            time.sleep(10)
            share = (cpu_seconds() - cpu) / (time.monotonic() - began)
            print(f"{transport}: idle receiver {100 * share:.2f}% of a core", flush=True)
            sender.wait()


if __name__ == "__main__":
    main()
