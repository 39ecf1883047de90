"""File descriptors a process holds per peer, by transport: a Sender connected to 8 receivers
(each in a process of its own) and a Receiver written by 8 senders (each in a process of its
own), counted in /proc/self/fd after each peer's first message, past the first peer (which
also starts what a process keeps once: NIXL's and gRPC's runtimes).

    python docs/open-files-2026-12-02/fds.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np

import tensorwire as tw

PEERS = 8
TRANSPORTS = ("shm", "tcp", "nixl", "grpc")

RECEIVER = """
import time, tensorwire as tw
rx = tw.Receiver(nixl=True)
rx.register("x", (1024,), "float32")
print(rx.address, flush=True)
time.sleep(120)
"""

SENDER = """
import sys, time, numpy as np, tensorwire as tw
tx = tw.Sender.connect(sys.argv[1], transport=sys.argv[2], timeout=30)
tx.write(sys.argv[3], np.zeros(1024, np.float32))
print("ok", flush=True)
time.sleep(120)
"""


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def per_receiver(transport: str) -> float:
    """A sender's descriptors per receiver it writes to."""
    procs = [
        subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
        for _ in range(PEERS)
    ]
    try:
        addresses = [p.stdout.readline().strip() for p in procs if p.stdout is not None]
        with tw.Sender(transport=transport, timeout=30) as tx:
            before = 0
            for k, address in enumerate(addresses):
                tx.add_peer(address)
                tx.write("x", np.zeros(1024, np.float32), peer=address)
                if k == 0:
                    before = open_fds()
            return (open_fds() - before) / (PEERS - 1)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def per_sender(transport: str) -> float:
    """A receiver's descriptors per sender writing to it (a tensor each)."""
    with tw.Receiver(nixl=True) as rx:
        for k in range(PEERS):
            rx.register(f"x{k}", (1024,), "float32")
        procs: list[subprocess.Popen[str]] = []
        try:
            before = 0
            for k in range(PEERS):
                argv = [sys.executable, "-c", SENDER, rx.address, transport, f"x{k}"]
                procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))
                assert procs[-1].stdout is not None and procs[-1].stdout.readline() == "ok\n"
                if k == 0:
                    time.sleep(0.5)  # (what the first attach starts, started)
                    before = open_fds()
            time.sleep(0.5)
            return (open_fds() - before) / (PEERS - 1)
        finally:
            for p in procs:
                p.kill()
                p.wait()


def main() -> None:
    for transport in TRANSPORTS:
        print(
            f"{transport}: a sender holds {per_receiver(transport):.1f} descriptors per receiver, "
            f"a receiver {per_sender(transport):.1f} per sender",
            flush=True,
        )


if __name__ == "__main__":
    main()
