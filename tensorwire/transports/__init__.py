"""Transports by name: every one implements :mod:`tensorwire.transports.base` on both ends."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import TransportError
from .base import Channel, PeerInfo
from .shm import ShmChannel
from .shm import unavailable_reason as shm_unavailable_reason
from .tcp import TcpChannel


def _grpc(info: PeerInfo) -> Channel:
    from .grpc import GrpcChannel  # grpcio loads only for those who use the baseline

    return GrpcChannel(info)


def _grpc_stream(info: PeerInfo) -> Channel:
    from .grpc import GrpcStreamChannel

    return GrpcStreamChannel(info)


def _nixl(info: PeerInfo) -> Channel:
    from .nixl import NixlChannel  # NIXL is optional: loaded only by those who ask for it

    return NixlChannel(info)


CHANNELS: dict[str, Callable[[PeerInfo], Channel]] = {
    "shm": ShmChannel,
    "tcp": TcpChannel,
    "nixl": _nixl,
    "grpc": _grpc,
    "grpc-stream": _grpc_stream,
}
TRANSPORT_NAMES = ("auto", *CHANNELS)


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


__all__ = ["CHANNELS", "TRANSPORT_NAMES", "check_name", "choose", "open_channel"]
