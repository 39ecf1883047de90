"""Reading the job's words: the tensors a daemon writes to say something (a worker's join, its
request to catch up, rank 0's initial values; a server's status and notices), as opposed to the
gradients and parameters a step waits for.

A receiver tells a waiter that a tensor's writer was lost (``PeerLostError``) after that
writer's messages and before the first message of whoever wrote it next. On a words tensor the
loss of an earlier session says nothing the reader needs: it learns that the peer went from the
gradients or parameters it waits for, from the peer's process, or from a timeout; what counts
is what the peer's next session says. Read with :func:`wait_past_losses`, such a notice is
passed over; it ends the wait only where nothing came after it.
"""

from __future__ import annotations

import time
from typing import Any

import tensorwire as tw


def wait_past_losses(rx: tw.Receiver, name: str, timeout: float) -> Any:
    """``rx.wait(name, timeout)``, passing over the notices of lost writers that a later
    writer's message has landed after. ``PeerLostError`` only for a loss nothing landed
    after; ``WireTimeoutError`` as ``wait``."""
    deadline = time.monotonic() + timeout
    while True:  # bounded: each turn takes a notice, and each writer lost left one at most
        try:
            return rx.wait(name, timeout=max(deadline - time.monotonic(), 0.0))
        except tw.PeerLostError:
            if not rx.pending(name):
                raise
