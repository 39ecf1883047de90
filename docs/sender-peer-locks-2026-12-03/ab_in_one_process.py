"""Two versions of ``tensorwire/sender.py`` side by side in one process: the per-message cost of
each, measured in turn round by round, so that both see the same machine at the same moment
(the 2-core VM's speed changes by half from one run to the next).

``python docs/sender-peer-locks-2026-12-03/ab_in_one_process.py OLD_SENDER.py`` loads
``OLD_SENDER.py`` (say ``git show 01fdefa:tensorwire/sender.py > /tmp/old.py``) as a module of
the installed ``tensorwire`` package beside its own ``tensorwire.sender``, connects one sender of
each over ``shm`` to a receiver of its own in this process (ring of 64), and for 80 rounds each
writes 64 4 KiB messages of a kind, then its consumer drains them (not timed): a dynamic tensor
(every write takes the general path), a static one (its fast route), the static one naming its
receiver (``peer=``), and ``write_many`` of 8 static tensors (per message). Prints the minimum,
25th percentile and median microseconds per message of each.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import tensorwire as tw

ROUNDS = 80
PER_ROUND = 64
TENSORS = 8


def load_old(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("tensorwire._sender_old", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    old = load_old(sys.argv[1])
    x = np.ones(1024, np.float32)
    times: dict[tuple[str, str], list[float]] = {}
    with tw.Receiver(ring=PER_ROUND) as ra, tw.Receiver(ring=PER_ROUND) as rb:
        for rx in (ra, rb):
            rx.register("d", (None,), "float32", max_bytes=4096)
            for k in range(TENSORS):
                rx.register(f"s{k}", (1024,), "float32")
        pairs = [
            ("old", old.Sender.connect(ra.address, transport="shm", timeout=10), ra),
            ("new", tw.Sender.connect(rb.address, transport="shm", timeout=10), rb),
        ]
        batch = {f"s{k}": x for k in range(TENSORS)}
        kinds: dict[str, tuple[Callable[[Any, str], object], list[str]]] = {
            "dynamic (general path)": (lambda tx, _: tx.write("d", x), ["d"]),
            "static (fast route)": (lambda tx, _: tx.write("s0", x), ["s0"]),
            "static, peer=": (lambda tx, at: tx.write("s0", x, peer=at), ["s0"]),
            "write_many of 8": (lambda tx, _: tx.write_many(batch), list(batch)),
        }
        try:
            for kind, (write, names) in kinds.items():
                for _, tx, rx in pairs:  # claims made, routes set up
                    write(tx, rx.address)
                    for name in names:
                        rx.wait(name, timeout=10)
                        rx.release(name)
                for _ in range(ROUNDS):
                    for label, tx, rx in pairs:
                        began = time.perf_counter()
                        for _ in range(PER_ROUND):
                            write(tx, rx.address)
                        spent = time.perf_counter() - began
                        times.setdefault((kind, label), []).append(
                            spent / (PER_ROUND * len(names)) * 1e6
                        )
                        for name in names:
                            for _ in range(PER_ROUND):
                                rx.wait(name, timeout=10)
                                rx.release(name)
        finally:
            for _, tx, _ in pairs:
                tx.close()
    for (kind, label), spent in times.items():
        spent.sort()
        print(
            f"{kind:24} {label}: min {spent[0]:6.2f}  p25 {spent[len(spent) // 4]:6.2f}  "
            f"median {spent[len(spent) // 2]:6.2f} us/message"
        )


if __name__ == "__main__":
    main()
