"""tensorwire: zero-copy, RDMA-style tensor transport for distributed deep learning.

Receivers preallocate registered buffers for tensors of known shape and publish their addresses;
senders write raw payloads straight into them. The public API is re-exported here.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from .errors import (
    AuthenticationError,
    ClosedError,
    LocalProtocolError,
    MissingDependencyError,
    PeerLostError,
    ProtocolError,
    RemoteProtocolError,
    SpecMismatchError,
    TensorWireError,
    TransportError,
    UnknownTensorError,
    WireTimeoutError,
)

if TYPE_CHECKING:
    from .rdma import NixlOptions
    from .received import ReceivedArray
    from .receiver import Receiver
    from .sender import Sender, WriteHandle
    from .spec import TensorSpec
    from .transports import TRANSPORT_NAMES

__version__ = "0.1.0"

#: The endpoints and what they take, imported on first use (PEP 562): numpy, pyzmq and the
#: transports took about a quarter of a second to import, which a command that needs none of
#: them (``tensorwire ping``, a health check run every few seconds) paid on every start.
_LAZY = {
    "NixlOptions": ".rdma",
    "ReceivedArray": ".received",
    "Receiver": ".receiver",
    "Sender": ".sender",
    "WriteHandle": ".sender",
    "TensorSpec": ".spec",
    "TRANSPORT_NAMES": ".transports",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: later reads find it without this call
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


# The library logs under "tensorwire"; what is shown, and where, is the application's choice.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "TRANSPORT_NAMES",
    "AuthenticationError",
    "ClosedError",
    "LocalProtocolError",
    "MissingDependencyError",
    "NixlOptions",
    "PeerLostError",
    "ProtocolError",
    "ReceivedArray",
    "Receiver",
    "RemoteProtocolError",
    "Sender",
    "SpecMismatchError",
    "TensorSpec",
    "TensorWireError",
    "TransportError",
    "UnknownTensorError",
    "WireTimeoutError",
    "WriteHandle",
    "__version__",
]
