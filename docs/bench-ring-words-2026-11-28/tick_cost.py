"""What the receiver's control-thread tick (SessionHandler.tick: each session's liveness, the
spare region) costs a call: 500 small tensors, each written once by a sender of the same
process (one claim each), the tick timed by wrapping it. Prints how many ran, their median and
longest. Before 64aa382 one ran after every control message; since, one every TICK_SECONDS."""

import statistics
import time
from typing import Any

import numpy as np

import tensorwire as tw
from tensorwire.receiver import sessions

N = 500
names = [f"t{i}" for i in range(N)]
x = np.ones(16, np.float32)
ticks: list[float] = []
tick = sessions.SessionHandler.tick


def timed_tick(self: Any) -> None:
    began = time.perf_counter()
    tick(self)
    ticks.append(time.perf_counter() - began)


sessions.SessionHandler.tick = timed_tick  # type: ignore[method-assign]

with tw.Receiver() as rx:
    rx.register_many([(n, (16,), "float32") for n in names])
    with tw.Sender.connect(rx.address, transport="shm", timeout=60) as tx:
        ticks.clear()
        began = time.perf_counter()
        for n in names:
            tx.write(n, x)
        took = time.perf_counter() - began
        print(
            f"{N} first writes in {took:.3f} s: {len(ticks)} ticks, median "
            f"{statistics.median(ticks) * 1e6:.1f} us, longest {max(ticks) * 1e6:.0f} us"
        )
