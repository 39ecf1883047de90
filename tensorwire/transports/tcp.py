"""The ``tcp`` transport: one data connection per sender-receiver pair, payloads received in place.

Sender: after the control-plane hello, it opens one TCP connection to the receiver's data port and
presents the session token it was issued; each write is one ``sendmsg`` of a fixed header plus the
array's own memory (no ``tobytes()``, no staging copy).

Receiver: one thread per connection reads a header, asks the receiver where that payload must land
(which also validates tensor id, slot, generation, sequence number, credits and size) and
``recv_into``s the payload straight into the registered slot, then completes the slot exactly as a
shared-memory write would. Credits flow back on the same connection as 20-byte frames carrying the
cumulative released count, so a lost or coalesced frame is harmless.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import wire
from ..doorbell import deadline_of
from ..errors import (
    LocalProtocolError,
    PeerLostError,
    TensorWireError,
    TransportError,
    WireTimeoutError,
)
from ..ring import SlotChooser
from .base import Channel, DataSink, PeerInfo, TensorEntry, TensorWriter, live_sink, wait_for_slot

log = logging.getLogger(__name__)

#: Tensor id of the credit frame that acknowledges a data hello (carries the generation).
HELLO_ACK = 0xFFFFFFFF
#: Large socket buffers keep a 2-core loopback pipeline busy; the kernel caps them anyway.
SOCKET_BUFFER = 4 << 20
HELLO_TIMEOUT = 10.0
CREDIT_SEND_TIMEOUT = 10.0


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)


def recv_exact_into(sock: socket.socket, view: memoryview, idle_ok: bool = False) -> bool:
    """Fill ``view`` from ``sock``; False on a clean EOF before the first byte.

    On a socket with ``SO_RCVTIMEO`` set, a peer that stops in the middle raises ``TimeoutError``;
    with ``idle_ok`` a peer that has not started yet may take as long as it likes.
    """
    got = 0
    total = len(view)
    while got < total:
        try:
            n = sock.recv_into(view[got:], total - got, socket.MSG_WAITALL)
        except BlockingIOError:  # SO_RCVTIMEO expired with nothing more read
            if got == 0 and idle_ok:
                continue
            raise TimeoutError(f"peer stalled after {got} of {total} bytes") from None
        if n == 0:
            if got == 0:
                return False
            raise ConnectionError(f"connection closed after {got} of {total} bytes")
        got += n
    return True


def set_receive_timeout(sock: socket.socket, seconds: float) -> None:
    """Kernel-level receive timeout on a blocking socket: costs nothing per read."""
    whole = int(seconds)
    sock.setsockopt(
        socket.SOL_SOCKET,
        socket.SO_RCVTIMEO,
        struct.pack("ll", whole, int((seconds - whole) * 1e6)),
    )


def send_all(sock: socket.socket, buffers: list[memoryview]) -> None:
    """``sendmsg`` every buffer completely, resuming after partial sends."""
    total = sum(len(b) for b in buffers)
    sent = sock.sendmsg(buffers)
    while sent < total:
        total -= sent
        while sent >= len(buffers[0]):
            sent -= len(buffers[0])
            buffers = buffers[1:]
        buffers = [buffers[0][sent:], *buffers[1:]]
        sent = sock.sendmsg(buffers)


def _bytes_of(array: np.ndarray[Any, Any]) -> memoryview:
    return array.reshape(-1).view(np.uint8).data


# --------------------------------------------------------------------------------------------
# Sender side
# --------------------------------------------------------------------------------------------


class TcpChannel(Channel):
    transport = "tcp"

    def __init__(self, info: PeerInfo) -> None:
        host, port = info.data_endpoint("tcp")
        self._where = f"{host}:{port}"
        self._generation = info.welcome.generation
        try:
            sock = socket.create_connection((host, port), timeout=info.timeout)
        except OSError as exc:
            raise TransportError(
                f"cannot open the tcp data connection to {self._where}: {exc}"
            ) from exc
        self._sock: socket.socket | None = sock
        self._released: dict[int, int] = {}
        self._inbox = bytearray()
        self._chunk = bytearray(wire.CREDIT.size * 256)
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)
        try:
            _tune(sock)
            sock.sendall(wire.encode_data_hello(self._generation, info.welcome.token))
            deadline = deadline_of(info.timeout)
            sock.settimeout(None)
            self.await_credit(
                HELLO_ACK,
                self._generation,
                deadline,
                lambda: f"receiver's data port {self._where} did not acknowledge our token",
            )
        except BaseException:
            self.close()
            raise

    # -- credits ---------------------------------------------------------------------------

    def _absorb(self, block_ms: int) -> None:
        """Read whatever credit frames have arrived (waiting up to ``block_ms`` for the first)."""
        sock = self._sock
        if sock is None:
            raise PeerLostError(f"tcp channel to {self._where} is closed")
        if self.lost is not None:
            raise PeerLostError(self.lost)
        if not self._poller.poll(block_ms):
            return
        try:
            n = sock.recv_into(self._chunk, len(self._chunk), socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError as exc:
            raise PeerLostError(f"tcp data connection to {self._where} failed: {exc}") from exc
        if n == 0:
            raise PeerLostError(f"receiver at {self._where} closed the data connection")
        self._inbox += memoryview(self._chunk)[:n]
        size = wire.CREDIT.size
        whole = len(self._inbox) // size * size
        for off in range(0, whole, size):
            credit = wire.decode_credit(self._inbox[off : off + size])
            if credit.released > self._released.get(credit.tensor_id, 0):
                self._released[credit.tensor_id] = credit.released
        del self._inbox[:whole]

    def released(self, tensor_id: int) -> int:
        return self._released.get(tensor_id, 0)

    def await_credit(
        self, tensor_id: int, at_least: int, deadline: float | None, what: Callable[[], str]
    ) -> None:
        while self._released.get(tensor_id, 0) < at_least:
            if deadline is None:
                wait_ms = 100
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WireTimeoutError(what())
                wait_ms = max(1, min(100, int(left * 1000)))
            self._absorb(wait_ms)

    def send(self, buffers: list[memoryview]) -> None:
        sock = self._sock
        if sock is None:
            raise PeerLostError(f"tcp channel to {self._where} is closed")
        # One poll per write: picks up returned credits (so the return path never fills) and
        # notices a receiver that closed or restarted before we send into a dead connection.
        self._absorb(0)
        try:
            send_all(sock, buffers)
        except OSError as exc:
            raise PeerLostError(f"tcp data connection to {self._where} failed: {exc}") from exc

    # -- Channel ---------------------------------------------------------------------------

    def writer(
        self, entry: TensorEntry, next_seq: int, released: int, slot_seqs: list[int]
    ) -> TensorWriter:
        self._released[entry.tensor_id] = max(released, self._released.get(entry.tensor_id, 0))
        return TcpWriter(self, entry, next_seq, self._generation, slot_seqs)

    def check_peer(self) -> None:
        self._absorb(0)

    def goodbye(self, timeout: float) -> bool:
        """Send the goodbye frame behind every write, then wait for the receiver to hang up."""
        sock = self._sock
        if sock is None:
            return False
        try:
            sock.sendall(wire.encode_data_header(wire.DataHeader(0, 0, 0, 0, 0, None, bye=True)))
            sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                self._absorb(max(1, int((deadline - time.monotonic()) * 1000)))
        except PeerLostError:
            return True  # the receiver hung up: it has read everything up to our goodbye
        except OSError:
            return False
        return False

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class TcpWriter(TensorWriter):
    def __init__(
        self,
        channel: TcpChannel,
        entry: TensorEntry,
        next_seq: int,
        generation: int,
        slot_seqs: list[int],
    ) -> None:
        self.spec = entry.spec
        self._channel = channel
        self._tid = entry.tensor_id
        self._depth = entry.layout.depth
        self.next_seq = next_seq
        self._generation = generation
        self._header = bytearray(wire.MAX_HEADER_BYTES)
        self._header_view = memoryview(self._header)
        self._staging: np.ndarray[Any, Any] | None = None
        self._slots = SlotChooser(slot_seqs)

    def _wait_credit(self, deadline: float | None) -> None:
        wait_for_slot(self._channel, self._tid, self.spec, self.next_seq, self._depth, deadline)

    def _send(self, payload: memoryview, shape: tuple[int, ...]) -> None:
        seq = self.next_seq
        slot = self._slots.choose(self._channel.released(self._tid))
        header = wire.DataHeader(
            self._tid,
            slot,
            self._generation,
            seq,
            len(payload),
            shape if self.spec.dynamic else None,
        )
        used = wire.pack_data_header(self._header, header)
        self._channel.send([self._header_view[:used], payload])
        self._slots.wrote(slot, seq)
        self.next_seq = seq + 1

    def write(self, array: np.ndarray[Any, Any], deadline: float | None) -> None:
        self._wait_credit(deadline)
        self._send(_bytes_of(array), array.shape)

    def acquire(self, shape: tuple[int, ...], deadline: float | None) -> np.ndarray[Any, Any]:
        # Produce-in-place over a network has to stage somewhere: one buffer per tensor, allocated
        # once, reused for every message.
        self._wait_credit(deadline)
        if self._staging is None:
            self._staging = np.empty(self.spec.max_bytes, dtype=np.uint8)
        nbytes = int(np.prod(shape)) * self.spec.dtype.itemsize
        return self._staging[:nbytes].view(self.spec.dtype).reshape(shape)

    def commit(self, shape: tuple[int, ...]) -> None:
        assert self._staging is not None
        nbytes = int(np.prod(shape)) * self.spec.dtype.itemsize
        self._send(self._staging[:nbytes].data, shape)


# --------------------------------------------------------------------------------------------
# Receiver side
# --------------------------------------------------------------------------------------------


class _Connection:
    """One accepted data connection; the credit link back to its sender."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self._send_lock = threading.Lock()
        self._pending = bytearray()

    def send_credit(self, tensor_id: int, released: int) -> None:
        with self._send_lock:
            self._pending += wire.encode_credit(tensor_id, released)
            deadline = time.monotonic() + CREDIT_SEND_TIMEOUT
            while self._pending:
                try:
                    n = self.sock.send(self._pending, socket.MSG_DONTWAIT)
                    del self._pending[:n]
                except BlockingIOError:
                    # The sender reads credits before every write and whenever it waits for one,
                    # so this clears; a peer that never reads is cut off.
                    if time.monotonic() > deadline:
                        self.shutdown()
                        return
                    select.select([], [self.sock], [], 0.05)
                except OSError:
                    return

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


class TcpDataServer:
    """Accepts data connections and receives payloads in place, one thread per connection."""

    def __init__(
        self, host: str, sink: DataSink, *, max_connections: int = 1024, frame_timeout: float = 30.0
    ) -> None:
        self._frame_timeout = frame_timeout
        # Weak: serving threads must not keep the receiver alive (see ControlServer).
        self._sink_ref = weakref.ref(sink)
        self._max = max_connections
        try:
            self._listener = socket.create_server((host, 0), backlog=128)
        except OSError as exc:
            raise TensorWireError(f"cannot bind the tcp data port on {host}: {exc}") from exc
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._conns: dict[_Connection, threading.Thread] = {}
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()  # close() wakes the accept loop
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="tensorwire-tcp-accept", daemon=True
        )
        self._accept_thread.start()

    def details(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port}

    def _accept_loop(self) -> None:
        while not self._closed:
            ready, _, _ = select.select([self._listener, self._wake_r], [], [])
            if self._listener not in ready or self._closed:
                continue
            try:
                sock, addr = self._listener.accept()
            except OSError:
                continue
            with self._lock:
                if self._closed or len(self._conns) >= self._max:
                    log.warning("refusing data connection from %s (limit %d)", addr, self._max)
                    sock.close()
                    continue
                conn = _Connection(sock, f"{addr[0]}:{addr[1]}")
                thread = threading.Thread(
                    target=self._serve,
                    args=(conn,),
                    name=f"tensorwire-tcp-{conn.peer}",
                    daemon=True,
                )
                self._conns[conn] = thread
            thread.start()

    def _sink(self) -> DataSink:
        return live_sink(self._sink_ref)

    def _serve(self, conn: _Connection) -> None:
        sock = conn.sock
        session: object = None
        reason: str | None = "closed without a goodbye"
        try:
            _tune(sock)
            sock.settimeout(HELLO_TIMEOUT)
            hello = bytearray(wire.DATA_HELLO.size)
            if not recv_exact_into(sock, memoryview(hello)):
                return
            msg = wire.decode_data_hello(hello)
            session = self._sink().admit(msg.token, msg.generation, conn, "tcp")
            sock.settimeout(None)
            # A peer that stops in the middle of a frame is cut off after frame_timeout.
            set_receive_timeout(sock, self._frame_timeout)
            conn.send_credit(HELLO_ACK, msg.generation)
            reader = wire.HeaderReader()
            hbuf = bytearray(wire.MAX_HEADER_BYTES)
            hview = memoryview(hbuf)
            while not self._closed:
                header = None
                fresh = True  # between frames a sender may be idle for as long as it likes
                while header is None:
                    need = reader.need
                    if not recv_exact_into(sock, hview[:need], idle_ok=fresh):
                        return
                    fresh = False
                    header = reader.feed(hview[:need])
                if header.bye:
                    reason = None  # clean: every frame before the goodbye has landed
                    return
                sink = self._sink()
                dst = sink.begin_write(session, header)
                if not recv_exact_into(sock, dst):
                    raise ConnectionError("connection closed before the payload")
                sink.end_write(session, header)
                del sink, dst
        except (LocalProtocolError, TensorWireError) as exc:
            reason = f"protocol error: {exc}"
            log.warning("dropping data connection from %s: %s", conn.peer, exc)
        except TimeoutError as exc:
            reason = f"stalled mid-frame: {exc}"
            log.warning("dropping data connection from %s: %s", conn.peer, exc)
        except (OSError, ConnectionError) as exc:
            reason = f"connection error: {exc}"
        finally:
            sink_or_none = self._sink_ref()
            if session is not None and sink_or_none is not None:
                sink_or_none.disconnected(session, reason)
            del sink_or_none
            with self._lock:
                self._conns.pop(conn, None)
            conn.shutdown()
            sock.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake_w.send(b"x")
        me = threading.current_thread()
        if me is not self._accept_thread:
            self._accept_thread.join()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        with self._lock:
            conns = list(self._conns.items())
        for conn, _ in conns:
            conn.shutdown()
        for _, thread in conns:
            if thread is not me:
                thread.join()
