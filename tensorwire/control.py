"""The control plane: pyzmq ROUTER (receiver) and DEALER (sender) around the wire format.

The control plane carries only small msgpack messages (hello, address book, claims, heartbeats);
tensors never pass through it. The server runs one thread that owns its ROUTER socket, answers each
request through a handler and calls a periodic ``tick`` (liveness checks). The client is strictly
request/reply with a bounded wait; a request that times out poisons the socket (a late reply could
be mistaken for the next one), so the client then reconnects on a fresh socket.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import weakref
from collections.abc import Callable

import zmq

from . import curve, metrics, quietlog, wire
from .curve import CurveKeys
from .errors import (
    AuthenticationError,
    ClosedError,
    LocalProtocolError,
    PeerLostError,
    RemoteProtocolError,
    TensorWireError,
    UnknownTensorError,
    WireTimeoutError,
)
from .quietlog import QuietLog

log = logging.getLogger(__name__)
#: warnings about what any peer can send: rate-limited per reason (one per process is enough)
quiet = QuietLog(log)

MAX_CONTROL_MESSAGE = 16 << 20
TICK_SECONDS = 0.1

Handler = Callable[[bytes, wire.Message], wire.Message | None]


def _context() -> zmq.Context[zmq.Socket[bytes]]:
    """The process's one ZeroMQ context (pyzmq's convention): every control socket shares its
    I/O thread, so a process with many peers does not grow a thread pair per peer. pyzmq makes
    a fresh one in a forked child."""
    return zmq.Context.instance()


def _socket(kind: int) -> zmq.Socket[bytes]:
    sock = _context().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    # Bounds what a peer can make us buffer: one control message is never larger than this.
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_CONTROL_MESSAGE)
    return sock


class ControlServer:
    """A ROUTER socket served by one thread. ``handler(identity, msg)`` returns the reply."""

    def __init__(
        self,
        bind: str,
        handler: Handler,
        tick: Callable[[], None],
        name: str = "tensorwire-control",
        curve_keys: CurveKeys | None = None,
    ) -> None:
        self._sock = _socket(zmq.ROUTER)
        try:
            if curve_keys is not None:
                curve.serve(self._sock, curve_keys)
            self._sock.bind(bind)
        except (zmq.ZMQError, TensorWireError) as exc:
            self._sock.close()
            if isinstance(exc, TensorWireError):
                raise
            raise TensorWireError(f"cannot bind the control plane to {bind}: {exc}") from exc
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        # Weak references: the thread must not keep its owner alive, or an owner dropped without
        # close() would never be collected (and never warned about).
        self._handler = weakref.WeakMethod(handler)
        self._tick = weakref.WeakMethod(tick)
        self._stop = threading.Event()
        # close() writes a byte here so the thread leaves its poll at once, not at the next tick.
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r.fileno(), zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if self._sock in dict(poller.poll(int(TICK_SECONDS * 1000))):
                    self._serve_one()
                tick = self._tick()
                if tick is None:
                    return  # the owner was collected
                try:
                    tick()
                    quietlog.report_due()  # counts of warnings not logged one by one
                except Exception:  # a liveness check must never kill the control thread
                    log.exception("control-plane tick failed")
                del tick
        finally:
            self._sock.close()

    def _serve_one(self) -> None:
        try:
            frames = self._sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        if len(frames) != 2:
            quiet.warning(
                "control messages of a wrong frame count",
                "dropping a control message of %d frames (want 2)",
                len(frames),
            )
            return
        identity, payload = frames
        handler = self._handler()
        if handler is None:
            return
        try:
            reply = handler(identity, wire.decode(payload))
        except LocalProtocolError as exc:
            quiet.warning(
                "malformed control messages", "refusing a malformed control message: %s", exc
            )
            reply = wire.ErrorReply("protocol", str(exc))
        except Exception as exc:
            log.exception("control handler failed")
            reply = wire.ErrorReply("protocol", f"internal error: {exc}")
        if reply is not None:
            if isinstance(reply, wire.ErrorReply):
                metrics.count("tensorwire_control_errors_total", reply.code)
            try:
                self._sock.send_multipart([identity, wire.encode(reply)], zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                quiet.warning(
                    "unanswered control requests", "could not answer a control request: %s", exc
                )

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake_w.send(b"x")
        if threading.current_thread() is self._thread:
            return  # closed from our own thread (an owner collected there): the loop ends itself
        self._thread.join()
        self._wake_r.close()
        self._wake_w.close()


class FencedError(RemoteProtocolError):
    """The receiver fences the tensor for now (its dropped previous writer may be mid-write):
    the claim may succeed later."""


_ERRORS: dict[str, type[TensorWireError]] = {
    "fenced": FencedError,
    "auth": AuthenticationError,
    "unauthenticated": AuthenticationError,
    "stale-generation": PeerLostError,
    "closed": PeerLostError,
    "unknown-tensor": UnknownTensorError,
}


#: How often a request that is given a check calls it while it waits for the reply (ms)
CHECK_EVERY_MS = 100


class ControlClient:
    """A DEALER socket doing one request/reply at a time."""

    def __init__(self, address: str, curve_server_key: bytes | None = None) -> None:
        self.address = address
        self._curve = curve_server_key
        self._sock: zmq.Socket[bytes] | None = None
        try:
            self._open()
        except BaseException:
            if self._sock is not None:
                self._sock.close()
            raise

    def _open(self) -> None:
        self._sock = _socket(zmq.DEALER)
        if self._curve is not None:
            curve.connect(self._sock, self._curve)
        self._sock.connect(self.address)

    def request(
        self, msg: wire.Message, timeout: float | None, check: Callable[[], None] | None = None
    ) -> wire.Message:
        """Send ``msg`` and return the reply; an :class:`~wire.ErrorReply` is raised as an error.
        ``check``, if given, is called every :data:`CHECK_EVERY_MS` while the reply is awaited,
        and what it raises (a receiver known dead: PeerLostError) ends the wait."""
        if self._sock is None:
            raise ClosedError("control client is closed")
        deadline = None if timeout is None else time.monotonic() + timeout

        def left_ms() -> int | None:
            return None if deadline is None else max(int((deadline - time.monotonic()) * 1000), 0)

        # A DEALER's send blocks while it has no connection to queue on (between reconnects,
        # e.g. after a refused CURVE handshake): wait for one within the same deadline.
        sent = False
        if self._sock.poll(left_ms(), zmq.POLLOUT):
            try:
                self._sock.send(wire.encode(msg), zmq.NOBLOCK)
                sent = True
            except zmq.Again:
                pass
        if not sent or not self._replied(left_ms, check):
            self._reset()
            raise WireTimeoutError(
                f"receiver at {self.address} did not answer a {msg.TYPE} request within "
                f"{timeout} s (is it running, and is the address right?)"
            )
        reply = wire.decode(self._sock.recv())
        if isinstance(reply, wire.ErrorReply):
            err = _ERRORS.get(reply.code, RemoteProtocolError)
            raise err(f"receiver at {self.address} refused {msg.TYPE}: {reply.message}")
        return reply

    def _replied(self, left_ms: Callable[[], int | None], check: Callable[[], None] | None) -> bool:
        """Has the reply come within the deadline (``check()`` between slices, see request)?"""
        assert self._sock is not None
        if check is None:
            return bool(self._sock.poll(left_ms(), zmq.POLLIN))
        while True:
            left = left_ms()
            step = CHECK_EVERY_MS if left is None else min(left, CHECK_EVERY_MS)
            if self._sock.poll(step, zmq.POLLIN):
                return True
            if left is not None and left <= step:
                return False
            try:
                check()
            except BaseException:
                self._reset()
                raise

    def _reset(self) -> None:
        """A request went unanswered: a new socket, so that a late reply to it cannot pass for
        the reply to the next request."""
        assert self._sock is not None
        self._sock.close()
        self._open()

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
