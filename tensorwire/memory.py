"""The memory a receiver registers, as the rest of the library sees it.

A receiver's tensors live in spans of memory that it allocates and registers once: host memory
today (:class:`tensorwire.region.Region`, shared with this host's senders or private), GPU memory
next. The tensor registry, the data servers (which register each span with their library, e.g.
NIXL) and the address book handle a span only through :class:`Memory`, so a new kind of memory is
a new implementation of it, not a change through every layer.
"""

from __future__ import annotations

from typing import Protocol

#: The kinds of memory a span may be, and what each is called where it is registered.
HOST = "host"


class Memory(Protocol):
    """One registered span of memory."""

    #: ``"host"`` (CPU memory); a GPU kind names its device in ``device``
    kind: str
    device: int
    address: int  # of the first byte, in this process
    size: int  # bytes

    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...
