"""The one error hierarchy of tensorwire.

Every failure the library reports is a :class:`TensorWireError`. Where a standard exception
already says what kind of failure it is (a bad value, a missing key, a time-out), the tensorwire
error is also that exception, so callers can catch either.
"""

from __future__ import annotations


class TensorWireError(Exception):
    """Root of every error raised by tensorwire."""


class SpecMismatchError(TensorWireError, ValueError):
    """A tensor does not match the spec it was registered or published with.

    Raised before any byte moves: the receiver's buffer is unchanged.
    """


class UnknownTensorError(TensorWireError, KeyError):
    """No tensor of that name is registered (or published by the peer)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else "unknown tensor"


class ProtocolError(TensorWireError):
    """A message broke the wire protocol.

    ``remote`` is True when the peer reported the violation (we sent something it refused),
    False when we detected it in what the peer sent us.
    """

    remote: bool = False


class LocalProtocolError(ProtocolError):
    """We received bytes that break the protocol."""

    remote = False


class RemoteProtocolError(ProtocolError):
    """The peer refused what we sent as a protocol violation.

    ``code``: the receiver's reason, where it gave one (``"busy"``: another sender writes the
    tensor; ``"silent-owner"``: another sender, on another host, wrote it and has not spoken
    since, and was still not dropped when the write's time ran out (the claim is asked again
    until then); ``"protocol"``: the request broke the protocol), else None."""

    remote = True
    code: str | None = None

    @property
    def held_by_another(self) -> bool:
        """Whether the tensor was refused because another sender's session holds it (``busy``
        or ``silent-owner``): a claim that may succeed once that session ends."""
        return self.code in ("busy", "silent-owner")


class AuthenticationError(TensorWireError):
    """The control-plane handshake failed: a missing, wrong or unexpected shared secret, or a
    CURVE setting that differs between the ends (a key missing at one, or given to a receiver
    without CURVE)."""


class TransportError(TensorWireError):
    """The data plane failed: a transport could not be set up or a write could not complete."""


class PeerLostError(TransportError):
    """The peer died, closed, or restarted with a new generation.

    ``tensor``: raised by a receiver's wait, the tensor whose writer was lost (a
    :meth:`~tensorwire.Receiver.wait_any` says which), else None.

    ``reason``: the receiver's own account of why it ended this sender's session (``"sender
    'w3' (pid 812) was dropped: silent for 15.0 s ..."``) where the error carries it: a request
    the receiver refused for that, or a write's loss the sender asked the receiver about. None
    where the loss was seen otherwise (the text then says what was seen)."""

    def __init__(self, *args: object, tensor: str | None = None, reason: str | None = None) -> None:
        super().__init__(*args)
        self.tensor = tensor
        self.reason = reason


class ClosedError(TensorWireError):
    """The object was closed (possibly while this call was waiting on it)."""


class WireTimeoutError(TensorWireError, TimeoutError):
    """A bounded wait ran out before the awaited event happened.

    ``silent`` (a request to a receiver that went unanswered, as ``add_peer``'s handshake): True
    where the receiver's address took the connection and nothing answered on it, as a process
    stopped (SIGSTOP, Ctrl-Z, a paused container) or too busy to answer does: it may answer
    once it runs. False where nothing accepted a connection there or the handshake was refused
    (a wrong address, port or key, a firewall), and for every other wait: waiting would not
    mend those."""

    silent: bool = False


class MissingDependencyError(TensorWireError, ImportError):
    """A feature needs an optional package that is not installed; the message names the extra
    (``pip install 'tensorwire[...]'``) that brings it."""
