"""The control plane: pyzmq ROUTER (receiver) and DEALER (sender) around the wire format.

The control plane carries only small msgpack messages (hello, address book, claims, heartbeats);
tensors never pass through it. The server runs one thread that owns its ROUTER socket, answers each
request through a handler and calls a periodic ``tick`` (liveness checks). The client is strictly
request/reply with a bounded wait; a request that times out poisons the socket (a late reply could
be mistaken for the next one), so the client then reconnects on a fresh socket. Until a socket's
first reply, ZeroMQ's monitor tells the client what its connection went through, so that a
request that goes unanswered says why (nothing listening, a handshake refused, a receiver that
accepted but is silent), and one that can never be answered (CURVE on one side only) fails at
once.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import math
import os
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator

import zmq

from . import curve, metrics, quietlog, wire
from .curve import CurveKeys
from .doorbell import remaining
from .endpoint import is_ipv6_endpoint
from .errors import (
    AuthenticationError,
    ClosedError,
    LocalProtocolError,
    PeerLostError,
    RemoteProtocolError,
    TensorWireError,
    TransportError,
    UnknownTensorError,
    WireTimeoutError,
)
from .process import open_files_hint
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


def _socket(kind: int, endpoint: str = "") -> zmq.Socket[bytes]:
    try:
        sock = _context().socket(kind)
    except zmq.ZMQError as exc:  # (EMFILE: this process's descriptors are all in use)
        raise TransportError(f"cannot open a ZeroMQ socket: {exc}{open_files_hint()}") from exc
    sock.setsockopt(zmq.LINGER, 0)
    # Bounds what a peer can make us buffer: one control message is never larger than this.
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_CONTROL_MESSAGE)
    # ZeroMQ takes IPv6 only when asked. Asked only for a host reached over IPv6 (an IPv6
    # address, or a name with IPv6 addresses alone: endpoint.reached_over_ipv6): asked for all,
    # it would resolve a name such as ``localhost`` to its IPv6 address first and keep trying
    # to reach a receiver that listens on IPv4 alone.
    if is_ipv6_endpoint(endpoint):
        sock.setsockopt(zmq.IPV6, 1)
    return sock


#: how long a bind waits for its address's listener to go (:func:`_bind`)
BIND_IN_USE_WAIT = 1.0


def _bind(sock: zmq.Socket[bytes], endpoint: str) -> None:
    """``sock.bind(endpoint)``, tried again for up to BIND_IN_USE_WAIT while the address is in
    use. ZeroMQ closes a socket's listener on its I/O thread after ``zmq_close`` returns, so a
    receiver made at once at the address of one just closed in this process (a restart in
    place) met "Address already in use" now and then under load (`make test-floors`); an
    address another process holds is still refused, a second later."""
    deadline = time.monotonic() + BIND_IN_USE_WAIT
    while True:
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                raise
        time.sleep(0.005)


class ControlServer:
    """A ROUTER socket served by one thread. ``handler(identity, msg)`` returns the reply;
    ``tick(caught_up)`` is called every TICK_SECONDS, ``caught_up`` the latest moment
    (monotonic) at which no message was waiting unread: every message sent before it has been
    handled, and a peer's silence can be judged up to there, not further."""

    def __init__(
        self,
        bind: str,
        handler: Handler,
        tick: Callable[[float], None],
        name: str = "tensorwire-control",
        curve_keys: CurveKeys | None = None,
    ) -> None:
        self._sock = _socket(zmq.ROUTER, bind)
        try:
            if curve_keys is not None:
                curve.serve(self._sock, curve_keys)
            _bind(self._sock, bind)
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
        # The tick runs every TICK_SECONDS, by the clock: after every message, it ran once per
        # request of a burst (6.5-12.9 us median a time with one session, and holding the GIL
        # a sender of the same process needed to take its answer: probes-control.txt in
        # docs/bench-ring-words-2026-11-28/).
        tick_at = time.monotonic() + TICK_SECONDS
        # Requests that come faster than they are handled (a host whose cores are taken: 64
        # workers joining two servers on two cores) wait in the socket, a peer's heartbeat
        # among them: judged by the clock alone, a peer whose heartbeat was waiting there
        # was "silent" past the timeout and dropped, and its session set up again, which
        # made more of the work that held the heartbeat up.
        caught_up = time.monotonic()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if not int(self._sock.get(zmq.EVENTS)) & zmq.POLLIN:
                    caught_up = now  # nothing unread: what was sent before now was handled
                wait_ms = max(math.ceil((tick_at - now) * 1000), 0)
                if self._sock in dict(poller.poll(wait_ms)):
                    self._serve_one()
                now = time.monotonic()
                if now < tick_at:
                    continue
                tick_at = now + TICK_SECONDS
                tick = self._tick()
                if tick is None:
                    return  # the owner was collected
                try:
                    tick(caught_up)
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
            payload = wire.encode(reply)
            if len(payload) > MAX_CONTROL_MESSAGE:
                reply = _too_large(reply, len(payload))
                payload = wire.encode(reply)
            if isinstance(reply, wire.ErrorReply):
                metrics.count("tensorwire_control_errors_total", reply.code)
            try:
                self._sock.send_multipart([identity, payload], zmq.NOBLOCK)
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


def _too_large(reply: wire.Message, size: int) -> wire.ErrorReply:
    """What is said instead of a reply larger than a control message may be: the peer's socket
    would drop it and cut the connection (ZeroMQ's MAXMSGSIZE), and its request would wait out
    its whole timeout with no word of why."""
    what = f"its {reply.TYPE} reply"
    if isinstance(reply, wire.AddressBook):
        what = f"its address book of {len(reply.tensors)} tensors"
    log.warning(
        "refusing to send %s: %d bytes, over the %d a control message may be",
        what,
        size,
        MAX_CONTROL_MESSAGE,
    )
    return wire.ErrorReply(
        "protocol",
        f"the receiver cannot send {what}: {size / (1 << 20):.1f} MiB, more than a control "
        f"message may be ({MAX_CONTROL_MESSAGE >> 20} MiB): spread the tensors over several "
        "receivers, or group small ones into fewer tensors",
    )


class NotYetError(RemoteProtocolError):
    """The receiver cannot do what was asked yet, and may soon: the request may be repeated
    (:meth:`ControlClient.request_until`)."""


class FencedError(NotYetError):
    """The receiver fences the tensor for now (its dropped previous writer may be mid-write):
    the claim may succeed later."""


class SilentOwnerError(NotYetError):
    """Another sender holds the tensor, on another host, and has not spoken since a claim
    first met it: it may be dead, and the receiver drops it at its heartbeat timeout (code
    ``"silent-owner"``); the claim may succeed then."""


class StartingError(NotYetError):
    """The receiver's data server for the transport attached to is still starting (one started
    when its first sender attaches, on a thread of its own: NIXL's agent takes over a second on
    a GPU host): the attach may succeed later."""


_ERRORS: dict[str, type[TensorWireError]] = {
    "fenced": FencedError,
    "silent-owner": SilentOwnerError,
    "starting": StartingError,
    "auth": AuthenticationError,
    "unauthenticated": AuthenticationError,
    "stale-generation": PeerLostError,
    "closed": PeerLostError,
    "unknown-tensor": UnknownTensorError,
}


#: How often a request that is given a check calls it while it waits for the reply (ms)
CHECK_EVERY_MS = 100

#: A wait that ends this much later than it was due (seconds): this process did not run
#: meanwhile (stopped, suspended, starved of CPU), so its peer could not be heard, and the gap
#: is nobody's silence. A wait for a reply gives the time it had left again, and a receiver
#: does not count the gap as its senders' silence.
STALL = 0.5
#: The longest single poll of a wait with a deadline (seconds): a stop of this process longer
#: than STALL + POLL_SLICE inside it shows as a poll that returned late
POLL_SLICE = 0.1

#: What a new control socket's monitor reports: enough to tell why a request went unanswered.
_WATCHED = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_monitor_numbers = itertools.count()
#: A monitor event's first frame, as libzmq's zmq_socket_monitor documents it: the event's
#: number (16 bits) and its value (32 bits), in the machine's byte order. Read here rather than
#: with pyzmq's zmq.utils.monitor, whose import brings in asyncio (about 40 ms of CPU in every
#: process that opens a control socket: each daemon, CLI and test peer).
_EVENT = struct.Struct("=HI")


class _Watch:
    """What a control socket's connection went through, from ZeroMQ's monitor, until its first
    reply (the connection is then known good, and the monitor is stopped).

    The monitor's queue is unbounded: libzmq's I/O thread, which every control socket of the
    process shares, blocks once a monitor's queue is full (a thousand events: under a minute of
    refused reconnections, measured). Events are read while a request waits, and a socket is
    opened only where a request follows at once (a client's first, or the one after a request
    went unanswered), so no queue grows unread for long."""

    def __init__(self, sock: zmq.Socket[bytes], curve: bool) -> None:
        self._curve = curve
        self.refused = 0  # connections refused (nothing listening)
        self.cut = 0  # connections closed by the far end during the ZeroMQ handshake
        self.connected = False  # a TCP connection stands (handshake done or not)
        self.up = False  # handshake done, not disconnected since
        self.fatal: str | None = None  # a handshake that can never succeed, and why
        address = f"inproc://tensorwire-control-monitor-{os.getpid()}-{next(_monitor_numbers)}"
        sock.monitor(address, _WATCHED)
        try:
            self.events: zmq.Socket[bytes] = _context().socket(zmq.PAIR)
        except BaseException:  # (no descriptor left for it): as close() does, monitor stopped
            sock.disable_monitor()
            raise
        self.events.setsockopt(zmq.LINGER, 0)
        self.events.setsockopt(zmq.RCVHWM, 0)  # unbounded (see above)
        self.events.connect(address)

    def read(self) -> None:
        """Take in every event that has arrived."""
        while True:
            try:
                frames = self.events.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            kind, value = _EVENT.unpack(frames[0])  # (frames[1]: the endpoint)
            if kind == zmq.EVENT_CONNECT_RETRIED and not self.up:
                self.refused += 1  # a retry follows a refusal, or the loss of a connection
            elif kind == zmq.EVENT_CONNECTED:
                self.connected = True
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.up = True
            elif kind == zmq.EVENT_DISCONNECTED:
                self.connected = self.up = False
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.fatal = "it refused this sender's CURVE credentials"
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and (
                value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
            ):
                # ZeroMQ does not try again after this: the wait could only run out
                self.fatal = (
                    "it does not encrypt its control plane with CURVE, and this sender was "
                    "given a server key (curve_server_key; --curve-keys on the daemons): use "
                    "the same setting at both ends"
                    if self._curve
                    else "it encrypts its control plane with CURVE, and this sender was given no "
                    "server key: pass its public key (curve_server_key=; --curve-keys DIR on the "
                    "daemons)"
                )
            elif kind in (
                zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
            ):
                self.cut += 1

    def silent(self) -> bool:
        """Whether the peer took the connection and said nothing back (read first: :meth:`why`):
        a process stopped or too busy to answer, which may answer once it runs (not one that
        refused the connection or closed the handshake)."""
        return self.up or (self.connected and not self.cut)

    def why(self) -> str:
        """Why no reply came, as far as the connection tells (and where this process is out of
        descriptors, that too: a connection it could not make reads as one refused)."""
        return self._why() + open_files_hint()

    def _why(self) -> str:
        self.read()
        if self.up:
            return "it accepted the connection but sent no reply (busy, stopped, or overloaded?)"
        if self.cut:
            if self._curve:
                return (
                    f"it closed the connection during the CURVE handshake ({self.cut} tries): "
                    "is the server key the receiver's public key (server.key of its "
                    "--curve-keys directory)?"
                )
            return (
                f"it closed the connection during the ZeroMQ handshake ({self.cut} tries): is "
                "a tensorwire receiver listening there?"
            )
        if self.connected:
            return (
                "it accepted the connection but never answered the ZeroMQ handshake (stopped, "
                "or not a tensorwire receiver?)"
            )
        if self.refused:
            return (
                f"nothing accepted a connection there ({self.refused} tries refused): is it "
                "running, and is the address right?"
            )
        return (
            "no connection could be made in that time: is the host right, and does a firewall "
            "let the port through?"
        )

    def close(self, sock: zmq.Socket[bytes]) -> None:
        # Stopped before the socket closes: closed with its monitor running, a socket leaves
        # the monitor's descriptors open (3 a socket, measured).
        sock.disable_monitor()
        self.events.close()


class _ConnectedAnew(Exception):
    """The receiver did not know this client's connection, though the client has a session
    (:meth:`ControlClient.request` resumes it)."""


class ControlClient:
    """A DEALER socket doing one request/reply at a time, for any thread.

    A ZeroMQ socket belongs to one thread at a time: a request holds the client's lock (its
    :meth:`turn`) from its send to its reply, and a request of another thread meanwhile waits
    for it, by its own deadline and check. :meth:`close` ends a request under way (it sees the
    close within CHECK_EVERY_MS) before the socket closes."""

    def __init__(self, address: str, curve_server_key: bytes | None = None) -> None:
        self.address = address
        self._curve = curve_server_key
        self._sock: zmq.Socket[bytes] | None = None
        self._watch: _Watch | None = None
        self._closed = False
        # (reentrant: a caller may hold the turn across its request, to act on the reply
        # before another thread's request: _Peer's address books)
        self._lock = threading.RLock()
        #: what a socket opened anew (after an unanswered request) sends before anything else,
        #: so that the receiver knows it for the session of the one before (None: nothing)
        self.resume: Callable[[], wire.Message] | None = None
        self._open()

    def _open(self) -> zmq.Socket[bytes]:
        sock = _socket(zmq.DEALER, self.address)
        try:
            if self._curve is not None:
                curve.connect(sock, self._curve)
            self._watch = _Watch(sock, self._curve is not None)  # before connect: all of it
            sock.connect(self.address)
        except BaseException as exc:
            self._unwatch(sock)
            sock.close()
            if isinstance(exc, zmq.ZMQError):  # (EMFILE: the watch's sockets take descriptors)
                raise TransportError(
                    f"cannot connect to {self.address}: {exc}{open_files_hint()}"
                ) from exc
            raise
        self._sock = sock
        return sock

    def request(
        self, msg: wire.Message, timeout: float | None, check: Callable[[], None] | None = None
    ) -> wire.Message:
        """Send ``msg`` and return the reply; an :class:`~wire.ErrorReply` is raised as an error.
        ``check``, if given, is called every :data:`CHECK_EVERY_MS` while the request waits (for
        a connection to send on, then for the reply), and what it raises (a receiver known dead:
        PeerLostError) ends the wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.turn(deadline, check, msg.TYPE, timeout):
            return self._request(msg, deadline, timeout, check)

    @contextlib.contextmanager
    def turn(
        self,
        deadline: float | None,
        check: Callable[[], None] | None = None,
        what: str = "control",
        timeout: float | None = None,
    ) -> Iterator[None]:
        """This thread's turn at the socket, for the requests inside: waited for (behind
        another thread's request) until ``deadline`` (monotonic; None: no limit), ``check``
        called every CHECK_EVERY_MS meanwhile; WireTimeoutError names the ``what`` request
        that waited (``timeout``: the bound it was given); ClosedError once the client is
        closed."""
        lock = self._lock
        if not lock.acquire(blocking=False):
            while True:
                if self._closed:
                    raise ClosedError("control client is closed")
                if check is not None:
                    check()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WireTimeoutError(
                        f"a {what} request to the receiver at {self.address} waited"
                        + ("" if timeout is None else f" {timeout:.3g} s")
                        + " in vain for another thread's request to it to end (the receiver "
                        "has not answered that one)"
                    )
                step = CHECK_EVERY_MS / 1000
                if lock.acquire(timeout=step if left is None else min(step, left)):
                    break
        try:
            if self._closed:
                raise ClosedError("control client is closed")
            yield
        finally:
            if self._closed:  # closed meanwhile: close() left the socket to this thread
                self._reset()
            lock.release()

    def _request(
        self,
        msg: wire.Message,
        deadline: float | None,
        timeout: float | None,
        check: Callable[[], None] | None,
    ) -> wire.Message:
        if self._sock is None:  # after an unanswered request, a new socket
            self._open()
            if self.resume is not None:
                try:
                    self._exchange(self.resume(), deadline, timeout, check)
                except TensorWireError:
                    # not resumed (the session is over, or no answer): the next request tries
                    # again on a socket anew, and meets the same answer, not "say hello first"
                    self._reset()
                    raise
        try:
            return self._exchange(msg, deadline, timeout, check, resumable=True)
        except _ConnectedAnew:
            # ZeroMQ connected this socket anew after its connection was cut (by a firewall's
            # reset, `ss -K`, ...): the receiver's ROUTER knows it under a new identity, not
            # as the session's, and refused the request unheard ("say hello first", which
            # read as a wrong secret and ended a parameter-server job's worker at its first
            # claim). The session moves to it by its token, as after an unanswered request,
            # and the request is asked once more; a session that is over is told as such.
            assert self.resume is not None
            self._exchange(self.resume(), deadline, timeout, check)
            return self._exchange(msg, deadline, timeout, check)

    def _exchange(
        self,
        msg: wire.Message,
        deadline: float | None,
        timeout: float | None,
        check: Callable[[], None] | None,
        *,
        resumable: bool = False,
    ) -> wire.Message:
        """One request and its reply on the open socket (see :meth:`request`). ``resumable``:
        a refusal of an unknown connection raises :class:`_ConnectedAnew` where this client
        has a session to resume."""
        sock = self._sock
        assert sock is not None
        # A DEALER's send blocks while it has no connection to queue on (between reconnects,
        # e.g. after a refused CURVE handshake): wait for one within the same deadline. Tried
        # first without a wait: a connection is there for nearly every request, and a poll
        # that says so costs a poller made and polled.
        payload = wire.encode(msg)
        ready, sent, polled = True, False, False
        while ready and not sent:
            try:
                sock.send(payload, zmq.NOBLOCK)
                sent = True
            except zmq.Again:
                # No connection, or it went between the poll and the send (the receiver closed
                # the handshake: a mechanism mismatch, seen 4 times in 15 runs of a test): wait
                # for another within the same deadline, unless the handshake can never succeed.
                # Before, this ended the request at once as a timeout of its whole deadline.
                self._raise_if_fatal()
                if polled:
                    time.sleep(0.001)  # (the poll said a connection was there)
                ready, deadline = self._ready(zmq.POLLOUT, deadline, check)
                polled = True
        if sent:
            try:
                ready, deadline = self._ready(zmq.POLLIN, deadline, check)
            except BaseException:
                # check() ended the wait: the reply may still come, and must not be taken for
                # the next request's (the timeout below resets for the same reason)
                self._reset()
                raise
        if not ready:
            watch = self._watch
            why = (
                watch.why()
                if watch is not None
                else "it answered before on this connection: has it exited, or stopped?"
            )
            # (an answer before on this connection: a process there, as one that took it)
            silent = watch is None or watch.silent()
            self._reset()
            timed_out = WireTimeoutError(
                f"receiver at {self.address} did not answer a {msg.TYPE} request within "
                f"{timeout:.3g} s: {why}"
            )
            timed_out.silent = silent
            raise timed_out
        reply = wire.decode(sock.recv())
        self._unwatch(sock)  # the connection works: nothing more to learn from it
        if isinstance(reply, wire.ErrorReply):
            if resumable and reply.code == "unauthenticated" and self.resume is not None:
                raise _ConnectedAnew
            err = _ERRORS.get(reply.code, RemoteProtocolError)
            error = err(f"receiver at {self.address} refused {msg.TYPE}: {reply.message}")
            if isinstance(error, RemoteProtocolError):
                error.code = reply.code
            elif isinstance(error, PeerLostError):
                error.reason = reply.message  # kept apart from the text, for the sender to read
            raise error
        return reply

    def request_until(
        self,
        msg: wire.Message,
        deadline: float | None,
        check: Callable[[], None] | None = None,
        pause: float = 0.05,
    ) -> wire.Message:
        """:meth:`request`, repeated every ``pause`` seconds while the receiver answers that it
        cannot do it yet (:class:`NotYetError`), until ``deadline`` (monotonic; None: no limit).
        Past the deadline the last refusal is raised, so the caller learns what it waited for;
        a last try that the deadline cut short says that refusal too (a try begun with
        milliseconds left ran out before the answer under load, and its timeout named no
        reason: "did not answer a claim request within 0.0123 s")."""
        refused: NotYetError | None = None
        while True:
            try:
                return self.request(msg, remaining(deadline), check)
            except NotYetError as exc:
                if deadline is not None and time.monotonic() + pause >= deadline:
                    raise
                refused = exc
                time.sleep(pause)
            except WireTimeoutError as exc:
                if refused is None:
                    raise
                raise WireTimeoutError(f"{exc}; its answer before: {refused}") from exc

    def _ready(
        self, flag: int, deadline: float | None, check: Callable[[], None] | None
    ) -> tuple[bool, float | None]:
        """Is the socket ready for ``flag`` before ``deadline``? Meanwhile ``check()`` every
        :data:`CHECK_EVERY_MS` (see request), and the connection's events: a handshake that can
        never succeed raises :class:`AuthenticationError` at once. Returns the answer and the
        deadline in force, which a stop of this process moved on.

        A poll that returned over :data:`STALL` later than it was due means this process did
        not run meanwhile: the time left when it began is given again, once per call (a wait
        with a deadline polls :data:`POLL_SLICE` at a time, so that a stop inside it shows).
        Counted, a sender stopped past its request's deadline took the reply that came meanwhile
        for a timeout when its own I/O thread had not yet read it (1 in 8 tries: a refresh with
        a 1 s timeout, the sender stopped 2 s while its receiver answered), or did not wait for
        a receiver that ran again just after it."""
        assert self._sock is not None
        poller = zmq.Poller()
        poller.register(self._sock, flag)
        watch = self._watch
        if watch is not None:
            poller.register(watch.events, zmq.POLLIN)
        # By the clock, not per wake-up: the monitor's events (a refused reconnection every
        # ~0.1 s) must not put the check off.
        check_at = None if check is None else time.monotonic() + CHECK_EVERY_MS / 1000
        moved = False
        while True:
            began = time.monotonic()
            ends = [t for t in (deadline, check_at) if t is not None]
            # (sliced, with or without a deadline: a close() from another thread shows)
            ends.append(began + POLL_SLICE)
            ms = max(math.ceil((min(ends) - began) * 1000), 0)
            ready = dict(poller.poll(ms))
            if self._sock in ready:
                return True, deadline
            if self._closed:  # by another thread (it leaves the socket to this one)
                self._reset()
                raise ClosedError(f"the control connection to {self.address} was closed")
            if watch is not None and watch.events in ready:
                self._raise_if_fatal()
            now = time.monotonic()
            if not moved and deadline is not None:
                overslept = now - began - ms / 1000
                if overslept > STALL:
                    moved = True
                    deadline = now + max(deadline - began, 0.0)
            if deadline is not None and now >= deadline:
                return False, deadline
            if check_at is not None and now >= check_at:
                assert check is not None
                try:
                    check()
                except BaseException:
                    self._reset()
                    raise
                check_at = now + CHECK_EVERY_MS / 1000

    def _raise_if_fatal(self) -> None:
        """AuthenticationError if the connection's events say its handshake can never
        succeed (they are read first)."""
        watch = self._watch
        if watch is None:
            return
        watch.read()
        if watch.fatal is not None:
            why = watch.fatal
            self._reset()
            raise AuthenticationError(f"cannot talk to the receiver at {self.address}: {why}")

    def _reset(self) -> None:
        """A request went unanswered: the socket is closed, so that a late reply to it cannot
        pass for the reply to the next request, which opens a new one."""
        sock, self._sock = self._sock, None
        if sock is not None:
            self._unwatch(sock)
            sock.close()

    def _unwatch(self, sock: zmq.Socket[bytes]) -> None:
        """Stop ``sock``'s monitor, if it has one (before the socket closes: see _Watch.close)."""
        if self._watch is not None:
            self._watch.close(sock)
            self._watch = None

    def close(self) -> None:
        """Close the socket; a request under way in another thread ends (ClosedError) within
        POLL_SLICE, and the socket is closed once it has. Idempotent."""
        self._closed = True
        # A request of another thread holding the turn sees the close within POLL_SLICE and
        # lets go; bounded all the same: one that does not closes the socket itself as it
        # ends (turn's finally).
        if self._lock.acquire(timeout=1.0):
            try:
                self._reset()
            finally:
                self._lock.release()
