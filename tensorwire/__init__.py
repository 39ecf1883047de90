"""tensorwire: zero-copy, RDMA-style tensor transport for distributed deep learning.

Receivers preallocate registered buffers for tensors of known shape and publish their addresses;
senders write raw payloads straight into them. The public API is re-exported here.
"""

from __future__ import annotations

import logging

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
from .rdma import NixlOptions
from .received import ReceivedArray
from .receiver import Receiver
from .sender import Sender, WriteHandle
from .spec import TensorSpec
from .transports import TRANSPORT_NAMES

__version__ = "0.1.0"

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
