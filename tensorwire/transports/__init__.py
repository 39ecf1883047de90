"""Transports by name, for both ends: what a sender opens and what a receiver serves.

Each transport is declared once here: its sender channel, and the key of the receiving server
that carries it (none for ``shm``, whose senders write the receiver's memory themselves; ``grpc``
and ``grpc-stream`` share one gRPC server). Each receiving server is declared once too: how to
start it, whether it can run here, and whether it starts with the receiver or when the first
sender attaches. The receiver starts, publishes, routes claims to and closes what is declared
here without naming any transport; adding one means adding a module and its lines below
(docs/design.md, "How to add a transport").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import TransportError
from ..extras import GRPC, installed, require
from ..rdma import installed as rdma_installed
from .base import Channel, DataServer, DataSink, PeerInfo, ServerSettings
from .shm import ShmChannel
from .shm import unavailable_reason as shm_unavailable_reason
from .tcp import TcpChannel


@dataclass(frozen=True, slots=True)
class Transport:
    """One transport, as both ends know it."""

    name: str
    open_channel: Callable[[PeerInfo], Channel]
    #: key of the receiving server that carries it; None: the sender writes shared memory itself
    server: str | None
    #: it reaches only a receiver on this host whose regions are in shared memory
    same_host: bool = False
    #: its sender stores into the receiver's memory itself (shm, nixl): a dropped one whose
    #: process runs may store again, which only its own end (or the receiver's fences) can stop;
    #: the others write through the receiver's threads, which stop with the session
    stores_itself: bool = False


@dataclass(frozen=True, slots=True)
class ReceivingServer:
    """One kind of receiving server. Published in the welcome under ``key``."""

    key: str
    start: Callable[[ServerSettings, DataSink], DataServer]
    #: can it run here (its optional library installed)?
    available: Callable[[], bool] = lambda: True
    #: started when the first sender attaches rather than with the receiver (an agent that costs
    #: a thread and memory registrations, or a library's import and threads, is not started for
    #: receivers nobody uses it with); published in the welcome with no details until then
    on_demand: bool = False


# Optional or heavy libraries load only for those who use them.
def _grpc(info: PeerInfo) -> Channel:
    require(GRPC, "transport 'grpc'")
    from .grpc import GrpcChannel

    return GrpcChannel(info)


def _grpc_stream(info: PeerInfo) -> Channel:
    require(GRPC, "transport 'grpc-stream'")
    from .grpc import GrpcStreamChannel

    return GrpcStreamChannel(info)


def _nixl(info: PeerInfo) -> Channel:
    from .nixl import NixlChannel

    return NixlChannel(info)


def _tcp_server(settings: ServerSettings, sink: DataSink) -> DataServer:
    from .tcp import start_server

    return start_server(settings, sink)


def _grpc_server(settings: ServerSettings, sink: DataSink) -> DataServer:
    require(GRPC, "serving the gRPC baseline")
    from .grpc import start_server

    return start_server(settings, sink)


def _nixl_server(settings: ServerSettings, sink: DataSink) -> DataServer:
    from .nixl import start_server

    return start_server(settings, sink)


TRANSPORTS: dict[str, Transport] = {
    t.name: t
    for t in (
        Transport("shm", ShmChannel, None, same_host=True, stores_itself=True),
        Transport("tcp", TcpChannel, "tcp"),
        Transport("nixl", _nixl, "nixl", stores_itself=True),
        Transport("grpc", _grpc, "grpc"),
        Transport("grpc-stream", _grpc_stream, "grpc"),
    )
}
SERVERS: dict[str, ReceivingServer] = {
    s.key: s
    for s in (
        ReceivingServer("tcp", _tcp_server),
        # on demand: most receivers never meet a gRPC sender (it is the baseline), and grpcio's
        # import and server cost a daemon about 0.1 s of CPU at every start (a job's three
        # daemons 2.0-2.1 s with it, 1.6-1.8 s without)
        ReceivingServer("grpc", _grpc_server, available=lambda: installed(GRPC), on_demand=True),
        ReceivingServer("nixl", _nixl_server, available=rdma_installed, on_demand=True),
    )
}
#: the sender channels by transport name
CHANNELS: dict[str, Callable[[PeerInfo], Channel]] = {
    name: t.open_channel for name, t in TRANSPORTS.items()
}
TRANSPORT_NAMES = ("auto", *TRANSPORTS)


def check_name(requested: str) -> str:
    """Refuse an unknown transport name with the list of known ones."""
    if requested not in TRANSPORT_NAMES:
        raise TransportError(
            f"unknown transport {requested!r}; choose one of: {', '.join(TRANSPORT_NAMES)}"
        )
    return requested


def choose(requested: str, info: PeerInfo) -> str:
    """Resolve ``"auto"``: shared memory when the receiver is on this host, else TCP.

    ``auto`` never picks ``nixl``: on one host shm is faster, and whether a fabric beats TCP
    between hosts is for the user to measure (``tensorwire bench``) and choose."""
    if check_name(requested) == "auto":
        return "shm" if shm_unavailable_reason(info) is None else "tcp"
    return requested


def open_channel(requested: str, info: PeerInfo) -> Channel:
    return CHANNELS[choose(requested, info)](info)


__all__ = [
    "CHANNELS",
    "SERVERS",
    "TRANSPORTS",
    "TRANSPORT_NAMES",
    "ReceivingServer",
    "Transport",
    "check_name",
    "choose",
    "open_channel",
]
