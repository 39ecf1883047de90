"""Where a first write's time goes: 500 small tensors, each written once by a sender of the
same process (one claim each). Times the sender's request-reply exchange and the receiver's
handling of the claim, by wrapping them; prints the medians."""

import statistics
import time
from typing import Any

import numpy as np

import tensorwire as tw
from tensorwire import control
from tensorwire.receiver import sessions

N = 500
names = [f"t{i}" for i in range(N)]
x = np.ones(16, np.float32)
events: list[tuple[str, float]] = []

handle = sessions.SessionHandler.handle
exchange = control.ControlClient._exchange


def timed_handle(self: Any, identity: bytes, msg: Any) -> Any:
    began = time.perf_counter()
    reply = handle(self, identity, msg)
    events.extend([("handle began", began), ("handle ended", time.perf_counter())])
    return reply


def timed_exchange(self: Any, *args: Any, **kwargs: Any) -> Any:
    began = time.perf_counter()
    reply = exchange(self, *args, **kwargs)
    events.extend([("exchange began", began), ("exchange ended", time.perf_counter())])
    return reply


sessions.SessionHandler.handle = timed_handle  # type: ignore[method-assign]
control.ControlClient._exchange = timed_exchange  # type: ignore[method-assign]


def median_us(values: list[float]) -> float:
    return statistics.median(values) * 1e6


with tw.Receiver() as rx:
    rx.register_many([(n, (16,), "float32") for n in names])
    with tw.Sender.connect(rx.address, transport="shm", timeout=60) as tx:
        events.clear()
        writes = []
        for n in names:
            began = time.perf_counter()
            tx.write(n, x)
            writes.append(time.perf_counter() - began)
        there, handling, back = [], [], []
        # per write, in order: the handling's two stamps, then the exchange's
        for i in range(0, len(events), 4):
            (_, h0), (_, h1), (_, x0), (_, x1) = events[i : i + 4]
            there.append(h0 - x0)
            handling.append(h1 - h0)
            back.append(x1 - h1)
        exchanges = [a + b + c for a, b, c in zip(there, handling, back, strict=True)]
        print(
            f"write {median_us(writes):.0f} us; exchange {median_us(exchanges):.0f}: "
            f"send->handle {median_us(there):.0f}, handle {median_us(handling):.0f}, "
            f"handled->reply {median_us(back):.0f}"
        )
