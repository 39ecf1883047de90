"""Where a ``nixl`` message's time goes, in two processes: the probe behind
docs/bench-gpu-nixl-context/README.md (a measurement script, not part of the library).

    python nixl_probe.py SIZE DEVICE COUNT [thread]

A receiver (a child process, or with ``thread`` a thread of this one) registers one float32
tensor of SIZE bytes on DEVICE (``cpu`` or ``cuda``) and takes the messages; this process
connects over ``nixl`` and writes 300 untimed messages, then COUNT with the channel's internal
calls wrapped and timed one by one (medians printed), then COUNT under cProfile. With
PROBE_PREINIT=1 a CUDA context is made current before connecting, as the library now does
itself (7d8cf27); before that, a sender that connected first wrote GPU memory through UCX's
software emulation over tcp (UCX_PROTO_INFO=y shows which protocol UCX chose).
"""

import collections
import cProfile
import io
import multiprocessing as mp
import os
import pstats
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np

import tensorwire as tw
from tensorwire import cuda
from tensorwire.transports import nixl

TIMES: dict[str, list[float]] = collections.defaultdict(list)
WARM_UP = 300


def receiver(queue: Any, done: Any, elements: int, count: int, device: str) -> None:
    with tw.Receiver(heartbeat_timeout=None) as rx:
        rx.register("t", (elements,), "float32", device=device)
        queue.put(rx.address)
        waits, releases = [], []
        for _ in range(count):
            t0 = time.perf_counter()
            rx.wait("t", timeout=60)
            t1 = time.perf_counter()
            rx.release("t")
            waits.append(t1 - t0)
            releases.append(time.perf_counter() - t1)
        queue.put((statistics.median(waits) * 1e6, statistics.median(releases) * 1e6))
        done.wait(30)


def timed(owner: Any, name: str) -> None:
    """Wrap ``owner.name`` so that each call's time lands in TIMES[name]."""
    call = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            TIMES[name].append(time.perf_counter() - t0)

    setattr(owner, name, wrapper)


def main() -> None:
    size, device, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    elements = size // 4
    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Event()
    args = (queue, done, elements, WARM_UP + 2 * count, device)
    if sys.argv[4:] == ["thread"]:
        peer: Any = threading.Thread(target=receiver, args=args, daemon=True)
    else:
        peer = ctx.Process(target=receiver, args=args)
    peer.start()
    address = queue.get(timeout=60)
    if os.environ.get("PROBE_PREINIT") == "1" and device != "cpu":
        cp = cuda.cupy()
        cp.cuda.Device(0).use()
        cp.empty(1)
        print("CUDA context current before connect")
    with tw.Sender.connect(address, transport="nixl", timeout=20) as tx:
        if device == "cpu":
            payload: Any = np.ones(elements, np.float32)
        else:
            cp = cuda.cupy()
            payload = cp.ones(elements, dtype=cp.float32)
        for _ in range(WARM_UP):
            tx.write("t", payload)
        for name in ("start", "complete", "notify", "source", "check_peer", "_absorb"):
            timed(nixl.NixlChannel, name)
        timed(nixl.NixlChannel, "await_credit")
        timed(nixl.NixlWriter, "wait_credit")
        timed(nixl, "synchronize_current")
        t0 = time.perf_counter()
        for _ in range(count):
            t1 = time.perf_counter()
            tx.write("t", payload)
            TIMES["write"].append(time.perf_counter() - t1)
        elapsed = time.perf_counter() - t0
        print(
            f"{size} B {device}: {elapsed / count * 1e6:.1f} us/message "
            f"({size * count / elapsed / 1e9:.1f} GB/s)"
        )
        for name, times in TIMES.items():
            print(
                f"   {name:20} n {len(times):5} median {statistics.median(times) * 1e6:8.1f} us"
                f"  mean {statistics.mean(times) * 1e6:8.1f}"
            )
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(count):
            tx.write("t", payload)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(14)
        print(out.getvalue()[-2600:])
    print("receiver wait/release medians us:", queue.get(timeout=60))
    done.set()
    peer.join(30)


if __name__ == "__main__":
    main()
