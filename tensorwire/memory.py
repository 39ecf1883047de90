"""The memory a receiver registers, as the rest of the library sees it.

A receiver's tensors live in spans of memory that it allocates and registers once: host memory
(:class:`tensorwire.region.Region`, shared with this host's senders or private) and GPU memory
(:class:`tensorwire.cuda.DeviceMemory`). The tensor registry, the data servers (which register
each span with their library, e.g. NIXL) and the address book handle a span only through
:class:`Memory`, so a kind of memory is an implementation of it, not a change through every layer.

:class:`RegionInfo` is how the address book describes a span to senders: what they need to reach
it (a shared-memory name, a CUDA IPC handle) and nothing they could misuse beyond it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .errors import LocalProtocolError

#: The kinds of memory a span may be.
HOST = "host"
CUDA = "cuda"
KINDS = (HOST, CUDA)
#: The size of a CUDA IPC handle (cudaIpcMemHandle_t).
IPC_HANDLE_BYTES = 64


class Memory(Protocol):
    """One registered span of memory."""

    #: ``"host"`` (CPU memory) or ``"cuda"`` (GPU memory on CUDA device ``device``)
    kind: str
    device: int
    address: int  # of the first byte, in this process
    size: int  # bytes

    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RegionInfo:
    """One of a receiver's spans as its address book publishes it.

    Host memory: ``name`` is the shared-memory segment's name (None when the span is private to
    the receiver, reachable only through its data servers). GPU memory: ``handle`` is the CUDA
    IPC handle a process on the same host opens it by, ``address`` the span's address in the
    receiver's own process (which a sender in that very process uses, as CUDA will not open a
    process's own handle).
    """

    name: str | None
    size: int
    kind: str = HOST
    device: int = 0
    handle: bytes = b""
    address: int = 0

    def to_wire(self) -> list[Any]:
        if self.kind == HOST:
            return [self.name or "", self.size]
        return [self.name or "", self.size, self.kind, self.device, self.handle, self.address]

    @classmethod
    def from_wire(cls, value: Any) -> RegionInfo:
        """Decode and check one entry of a peer's address book."""
        try:
            if len(value) == 2:
                name, size = value
                return cls(str(name) or None, _size(size))
            name, size, kind, device, handle, address = value
            info = cls(str(name) or None, _size(size), str(kind), int(device), handle, int(address))
        except (TypeError, ValueError) as exc:
            raise LocalProtocolError(f"malformed region in the address book: {value!r}") from exc
        if info.kind not in KINDS or info.device < 0:
            raise LocalProtocolError(
                f"address book names unknown memory: {info.kind}:{info.device}"
            )
        if info.kind == CUDA and (
            not isinstance(info.handle, bytes) or len(info.handle) != IPC_HANDLE_BYTES
        ):
            raise LocalProtocolError("address book has a malformed CUDA IPC handle")
        return info

    @property
    def on_device(self) -> bool:
        return self.kind != HOST


def _size(value: Any) -> int:
    size = int(value)
    if size <= 0:
        raise ValueError(f"region size {size}")
    return size
