"""What every part of a receiver shares: who it is, its one lock, and whether it is closed.

The parts (the tensor registry, the consumer API, the session handler, the landing of networked
writes and the data servers) run on different threads: the user's, the control-plane thread and
each transport's own. They take this one re-entrant lock for every change to shared state, so a
step that reads one part and changes another (a claim, a session's drop) is atomic.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..errors import ClosedError


@dataclass(eq=False)
class ReceiverState:
    name: str
    #: this incarnation of the receiver; a sender holding another one talks to a restarted peer
    generation: int
    host: str  # this host's identity (tensorwire.process.host_identity)
    lock: threading.RLock = field(default_factory=threading.RLock)
    closed: bool = False
    #: why it is closed where that is not close(): a forked child's copy (Resource._forked)
    closed_because: str | None = None

    def check_open(self) -> None:
        if self.closed:
            raise ClosedError(self.closed_because or f"receiver {self.name} is closed")
