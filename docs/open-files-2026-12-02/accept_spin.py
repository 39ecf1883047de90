"""A receiver left with one descriptor (the control connection takes it, the data connection
cannot be accepted), and a sender connecting over tcp: what the sender hears, and the CPU the
receiver's process spends in the 4 s after it printed its address.

    python docs/open-files-2026-12-02/accept_spin.py
"""

from __future__ import annotations

import subprocess
import sys

import tensorwire as tw

RECEIVER = """
import logging, os, resource, time, tensorwire as tw
logging.basicConfig()
rx = tw.Receiver()
rx.register("t", (4,), "float32")
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 1, hard))
print(rx.address, flush=True)
began = time.process_time()
time.sleep(4)
print("receiver CPU in 4 s:", round(time.process_time() - began, 2), "s", flush=True)
rx.close()
"""


def main() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    address = child.stdout.readline().strip()
    try:
        tw.Sender.connect(address, transport="tcp", timeout=2, connect_timeout=2)
        print("sender: connected")
    except tw.TensorWireError as exc:
        print(f"sender: {type(exc).__name__}: {exc}")
    out, err = child.communicate(timeout=30)
    print(out.strip())
    print("receiver's log:", err.strip() or "(nothing)")


if __name__ == "__main__":
    main()
