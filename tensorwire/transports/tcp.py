"""The ``tcp`` transport: one data connection per sender-receiver pair, payloads received in place.

Sender: after the control-plane hello, it opens one TCP connection to the receiver's data port and
presents the session token it was issued; each write is one ``sendmsg`` of a fixed header plus the
array's own memory (no ``tobytes()``, no staging copy). A GPU array goes through pinned host memory
a chunk at a time, the GPU copying the next chunk while the last one is sent.

Receiver: one thread per connection reads a header, asks the receiver where that payload must land
(which also validates tensor id, slot, generation, sequence number, credits and size) and
``recv_into``s the payload straight into the registered slot, then completes the slot exactly as a
shared-memory write would. Credits flow back on the same connection as 20-byte frames carrying the
cumulative released count, so a lost or coalesced frame is harmless.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable, Generator
from time import monotonic as _monotonic
from typing import Any

import numpy as np

from .. import wire
from ..cuda import STAGING_CHUNK_BYTES, PinnedBuffer, device_bytes
from ..doorbell import deadline_of
from ..dtypes import exports_buffer
from ..endpoint import host_port, listener
from ..errors import (
    LocalProtocolError,
    PeerLostError,
    TensorWireError,
    TransportError,
    WireTimeoutError,
)
from ..process import open_files_hint
from ..quietlog import QuietLog
from ..ring import SlotChooser
from .base import (
    CONSUMER_DRIVES,
    CREDIT_DEFER_LIMIT,
    ENDED_BY_RECEIVER,
    Channel,
    CreditedWriter,
    CreditLink,
    DataServer,
    DataSink,
    PeerInfo,
    Poller,
    ServerSettings,
    TensorEntry,
    TensorWriter,
    live_sink,
)

log = logging.getLogger(__name__)
quiet = QuietLog(log)  # what any peer can provoke: rate-limited per reason
#: Seconds between tries to accept a data connection while this process is out of descriptors
ACCEPT_RETRY = 0.1

#: Tensor id of the credit frame that acknowledges a data hello (carries the generation).
HELLO_ACK = 0xFFFFFFFF
#: Large socket buffers keep a 2-core loopback pipeline busy; the kernel caps them anyway.
SOCKET_BUFFER = 4 << 20
HELLO_TIMEOUT = 10.0
CREDIT_SEND_TIMEOUT = 10.0
#: Most messages a connection completes before it wakes the consumers, while more keep coming.
BELL_EVERY = 16
#: Longest a connection's thread waits for data before it looks at close() and stalls again.
IDLE_CHECK_MS = 100
#: What one read of a connection takes at most into its read-ahead buffer.
READ_AHEAD = 256 << 10
#: A payload (or the rest of one) up to this size is read through the read-ahead buffer and
#: copied into its slot: one system call then brings it and the frames behind it, where reading
#: it straight into the slot costs a call for its header and one for itself (~3-5 us each from
#: Python on this project's VM, against 1-3 us to copy 16-64 KiB). A larger payload is read
#: straight into its slot. Timed in pairs (BENCHMARKS.md), 64 KiB against the 16 KiB this was
#: before: a stream 1.73x faster at 32 KiB, 1.11-1.38x at 64 KiB; at 128 KiB copying was 0.83x.
COPY_BELOW = 64 << 10


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


def _recv_some(sock: socket.socket, view: memoryview) -> int | None:
    """Read into ``view`` what is already there: the byte count (0: the peer closed), or None
    when nothing is."""
    try:
        return sock.recv_into(view, len(view), socket.MSG_DONTWAIT)
    except BlockingIOError:
        return None


def set_receive_timeout(sock: socket.socket, seconds: float) -> None:
    """Kernel-level receive timeout on a blocking socket: costs nothing per read."""
    whole = int(seconds)
    sock.setsockopt(
        socket.SOL_SOCKET,
        socket.SO_RCVTIMEO,
        struct.pack("ll", whole, int((seconds - whole) * 1e6)),
    )


_HEADER_SIZE = wire.DATA_HEADER.size  # a static tensor's whole header
#: How long a writer waiting for a credit polls for it without sleeping (seconds; as nixl's
#: Backoff and the doorbell's yield phase)
CREDIT_SPIN = 200e-6
#: A write on the fast route that has credit in hand skips the poll for credits and for a
#: receiver that hung up, unless the last one is this old (seconds): the poll is a system call,
#: about a fifth of a 4 KiB message's cost to its writer, and a writer with credit needs no more
#: yet. A receiver that hung up is still seen before the first write after any pause longer than
#: this, and in a stream by the send that fails or the poll that comes within it.
ABSORB_EVERY = 1e-3

#: Most buffers one sendmsg takes (Linux: 1024).
_IOV_MAX = max(os.sysconf("SC_IOV_MAX"), 16) if hasattr(os, "sysconf") else 1024
_POLLRDHUP = getattr(select, "POLLRDHUP", 0)  # Linux: the peer shut down its sending side
#: Longest a blocked send sleeps before it looks again at its deadline and the peer's state.
SEND_CHECK_MS = 100


def send_all(
    sock: socket.socket,
    buffers: list[memoryview],
    deadline: float | None,
    check: Callable[[], None],
    progress: list[int] | None = None,
) -> int:
    """``sendmsg`` every buffer completely on a non-blocking socket, resuming after partial
    sends; returns the bytes sent. While the peer's window is full it waits for room at most
    ``SEND_CHECK_MS`` at a time, calling ``check()`` (which raises once the peer is known lost)
    and raising :class:`_SendTimeout` at ``deadline`` with the count sent so far.
    ``progress[0]``, if given, is kept at the count sent, for a caller interrupted midway."""
    total = sum(len(b) for b in buffers)
    done = 0
    poller: select.poll | None = None
    while True:
        try:
            sent = sock.sendmsg(buffers)
        except BlockingIOError:
            sent = 0
        done += sent
        if progress is not None:
            progress[0] = done
        if done == total:
            return done
        buffers = after(buffers, sent)
        if poller is None:
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
        while True:
            check()
            wait_ms = SEND_CHECK_MS
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _SendTimeout(done)
                wait_ms = max(1, min(wait_ms, int(left * 1000)))
            if poller.poll(wait_ms):
                break


def after(buffers: list[memoryview], sent: int) -> list[memoryview]:
    """What is left of ``buffers`` to send once ``sent`` bytes of them went (less than all)."""
    while sent >= len(buffers[0]):
        sent -= len(buffers[0])
        buffers = buffers[1:]
    return [buffers[0][sent:], *buffers[1:]]


class _SendTimeout(Exception):
    """A send reached its deadline after ``sent`` bytes."""

    def __init__(self, sent: int) -> None:
        super().__init__(sent)
        self.sent = sent


def _bytes_of(array: np.ndarray[Any, Any]) -> memoryview:
    return array.reshape(-1).view(np.uint8).data


# --------------------------------------------------------------------------------------------
# Sender side
# --------------------------------------------------------------------------------------------


class TcpChannel(Channel):
    transport = "tcp"

    def __init__(self, info: PeerInfo) -> None:
        host, port = info.data_endpoint("tcp")
        self._where = host_port(host, port)
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
        # Set while a frame may be part way onto the wire: a write interrupted there (Ctrl-C,
        # anywhere between its first byte and its last) leaves it set, and the next use of the
        # stream closes it instead (_close_open_frame), since no frame can follow half a frame.
        self._frame_open = False
        self._chunk = bytearray(wire.CREDIT.size * 256)
        self._absorbed_at = 0.0  # when write_now last polled (monotonic)
        self._poller = select.poll()
        # POLLRDHUP: the receiver's hang-up is seen in the same poll as the credits before it.
        self._poller.register(sock, select.POLLIN | _POLLRDHUP)
        try:
            _tune(sock)
            sock.sendall(wire.encode_data_hello(self._generation, info.welcome.token))
            deadline = deadline_of(info.timeout)
            # From here on no call blocks in the kernel: a frozen receiver must not hold a write
            # (or close()) past its deadline, so every wait is a bounded poll.
            sock.setblocking(False)
            self.await_credit(
                HELLO_ACK,
                self._generation,
                deadline,
                lambda: f"receiver's data port {self._where} did not acknowledge our token",
                info.check,
            )
        except PeerLostError as exc:
            self.close()
            # Closed before the acknowledgement: the receiver did not admit this connection
            # (before, a bare "Connection reset by peer").
            raise PeerLostError(
                f"{exc}; it was not admitted: a receiver closes data connections past its "
                "max_connections, and those of a session it no longer has (its log says which)"
            ) from None
        except BaseException:
            self.close()
            raise

    # -- credits ---------------------------------------------------------------------------

    def _absorb(self, block_ms: int) -> None:
        """Read whatever credit frames have arrived (waiting up to ``block_ms`` for the first),
        and notice a receiver that hung up behind them."""
        sock = self._sock
        if sock is None:
            raise PeerLostError(f"tcp channel to {self._where} is closed")
        self.raise_if_lost()
        events = self._poller.poll(block_ms)
        if not events:
            return
        # One read per call, as a write's credit check costs no more; once the receiver has hung
        # up it sends nothing more, so reading on to the end of the stream is bounded.
        hung_up = bool(events[0][1] & (_POLLRDHUP | select.POLLHUP | select.POLLERR))
        while True:
            try:
                n = sock.recv_into(self._chunk, len(self._chunk), socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError as exc:
                raise self._lost(f"tcp data connection to {self._where} failed: {exc}") from exc
            if n == 0:
                self._take_credits()  # what came before the hang-up still counts
                raise self._lost(
                    f"receiver at {self._where} closed the data connection (it closed, or "
                    f"{ENDED_BY_RECEIVER})"
                )
            self._inbox += memoryview(self._chunk)[:n]
            if not hung_up:
                break
        self._take_credits()

    def _lost(self, reason: str) -> PeerLostError:
        """The error for a connection found broken, kept as the channel's ``lost``: the sender's
        ``lost()`` reports it from then on, as it does the heartbeats' verdict (before, it said
        None after a write had raised PeerLostError for a receiver's hang-up)."""
        self.mark_lost(reason)
        return PeerLostError(reason)

    def _take_credits(self) -> None:
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
        self,
        tensor_id: int,
        at_least: int,
        deadline: float | None,
        what: Callable[[], str],
        check: Callable[[], None] | None = None,
    ) -> None:
        """Until the receiver has released ``at_least`` of ``tensor_id`` (or acknowledged our
        token: HELLO_ACK); ``check`` (the set-up's check of the receiver) is called between
        the waits of 100 ms."""
        # Polled without sleeping for CREDIT_SPIN first: a credit usually comes back within
        # it, and a thread that sleeps in poll() is woken by the receiver's send, on the
        # receiver's core, where the kernel then tends to run it, beside the consumer it
        # writes to (a 4 KiB stream ran at 30-50 us a message while they shared a core, 10-15
        # apart).
        spin_until = time.monotonic() + CREDIT_SPIN
        while self._released.get(tensor_id, 0) < at_least:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise WireTimeoutError(what())
            if now < spin_until:
                self._absorb(0)
                os.sched_yield()
                continue
            wait_ms = 100 if deadline is None else max(1, min(100, int((deadline - now) * 1000)))
            self._absorb(wait_ms)
            if check is not None:
                check()

    def _close_open_frame(self) -> None:
        """A write was interrupted part way through a frame: close the connection (the
        receiver drops the half frame and never completes its slot)."""
        self.mark_lost(
            f"tcp data connection to {self._where}: a write was interrupted part way; the "
            "connection was closed (the message was not delivered)"
        )
        self._shutdown()
        self._frame_open = False

    def send(
        self,
        buffers: list[memoryview],
        deadline: float | None,
        already: int = 0,
        more: bool = False,
    ) -> None:
        """Send one or more whole frames by ``deadline``. ``already``: that many of their bytes
        went out before (a fast route's ``sendmsg`` that the socket took only part of); then
        ``buffers`` are what is left, and the stream is mid-frame. ``more``: the last frame
        goes on after ``buffers`` (the caller sends the rest, then clears ``_frame_open``)."""
        sock = self._sock
        if sock is None:
            raise PeerLostError(f"tcp channel to {self._where} is closed")
        if not already:
            if self._frame_open:
                self._close_open_frame()
            # One poll per write: picks up returned credits (so the return path never fills)
            # and notices a receiver that closed or restarted before we send into a dead
            # connection.
            self._absorb(0)
        progress = [0]
        self._frame_open = True
        try:
            send_all(sock, buffers, deadline, self.raise_if_lost, progress)
            self._frame_open = more
        except _SendTimeout as exc:
            exc.sent += already
            if exc.sent == 0:
                self._frame_open = False
                raise WireTimeoutError(
                    f"tcp data connection to {self._where}: the receiver took nothing within the "
                    "timeout (is it frozen or overloaded?); nothing was sent"
                ) from None
            # Half a frame is on the wire: the stream cannot carry another one. The receiver
            # drops it as stalled mid-frame and never completes the slot.
            reason = (
                f"tcp data connection to {self._where}: a write timed out after {exc.sent} "
                "bytes; the connection was closed (the message was not delivered)"
            )
            self.mark_lost(reason)
            self._shutdown()
            raise WireTimeoutError(reason) from None
        except PeerLostError:
            self._shutdown()  # the receiver may still read: it must not see half a frame land
            raise
        except OSError as exc:
            raise self._lost(f"tcp data connection to {self._where} failed: {exc}") from exc
        except BaseException:
            # Interrupted (Ctrl-C) once a byte went out: the frame can never be finished, and
            # the next one's bytes would finish its payload, so the receiver would complete a
            # message made of two. Closed: the receiver drops the half frame.
            if already or progress[0]:
                self._close_open_frame()
            else:
                self._frame_open = False
            raise

    def send_staged(
        self, header: memoryview, pieces: Generator[memoryview, None, None], deadline: float | None
    ) -> None:
        """One frame whose payload becomes ready piece by piece (a GPU array staged through
        pinned memory): the header goes with the first piece, as :meth:`send` sends a frame.
        After that the stream is mid-frame, so whatever stops the rest (a timeout, the receiver
        gone, a failed copy, an interrupt) closes the connection: the receiver drops the half
        frame and never completes the slot."""
        try:
            first = next(pieces, None)  # a copy that fails here has sent nothing
            if first is None:
                self.send([header], deadline)
                return
            self.send([header, first], deadline, more=True)  # _frame_open stays set
            try:
                for piece in pieces:
                    sock = self._sock
                    if sock is None:
                        raise PeerLostError(f"tcp channel to {self._where} is closed")
                    send_all(sock, [piece], deadline, self.raise_if_lost)
                self._frame_open = False
            except BaseException as exc:
                why = "timed out" if isinstance(exc, _SendTimeout) else f"{exc!s}".strip()
                reason = (
                    f"tcp data connection to {self._where}: a GPU payload stopped part way "
                    f"({why or type(exc).__name__}); the connection was closed (the message was "
                    "not delivered)"
                )
                self.mark_lost(reason)
                self._shutdown()
                if isinstance(exc, _SendTimeout):
                    raise WireTimeoutError(reason) from None
                if isinstance(exc, OSError):
                    raise PeerLostError(reason) from exc
                raise
        finally:
            pieces.close()  # waits for a copy in flight into the staging buffer

    def write_batch(self, writes: list[tuple[TensorWriter, Any]], deadline: float | None) -> None:
        """The batch's frames in as few ``sendmsg`` calls as the kernel allows: frames are
        gathered until a writer must wait for a credit (the frames before it are sent first, as
        the receiver may be waiting for them to release one), a writer comes again, or
        ``IOV_MAX`` buffers are gathered. A GPU array is sent on its own, staged
        (:meth:`TcpWriter.write`), after the frames gathered before it."""
        pending: list[memoryview] = []
        framed: dict[int, TcpWriter] = {}  # by id, in order

        def flush() -> None:
            if framed:
                self.send(pending, deadline)
                for w in framed.values():
                    w.sent()
                pending.clear()
                framed.clear()

        for w, array in writes:
            assert isinstance(w, TcpWriter)
            if not isinstance(array, np.ndarray):  # in GPU memory
                flush()
                w.write(array, deadline)
                continue
            if id(w) in framed or len(pending) + 2 > _IOV_MAX:
                flush()
            if not w.has_credit():
                flush()
                w.wait_credit(deadline)
            pending += w.frame(_bytes_of(array), array.shape)
            framed[id(w)] = w
        flush()

    def _shutdown(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    # -- Channel ---------------------------------------------------------------------------

    def writer(
        self, entry: TensorEntry, next_seq: int, released: int, slot_seqs: list[int], epoch: int
    ) -> TensorWriter:
        self._released[entry.tensor_id] = max(released, self._released.get(entry.tensor_id, 0))
        return TcpWriter(self, entry, next_seq, self._generation, slot_seqs)

    def check_peer(self) -> None:
        self._absorb(0)

    def goodbye(self, timeout: float) -> bool:
        """Send the goodbye frame behind every write, then wait for the receiver to hang up."""
        sock = self._sock
        if sock is None or self._frame_open:  # no frame can follow half a frame
            return False
        try:
            deadline = time.monotonic() + timeout
            bye = wire.encode_data_header(wire.DataHeader(0, 0, 0, 0, 0, None, bye=True))
            send_all(sock, [memoryview(bye)], deadline, self.raise_if_lost)
            sock.shutdown(socket.SHUT_WR)
            while time.monotonic() < deadline:
                self._absorb(max(1, int((deadline - time.monotonic()) * 1000)))
        except PeerLostError:
            return True  # the receiver hung up: it has read everything up to our goodbye
        except (OSError, _SendTimeout):
            return False
        return False

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class TcpWriter(CreditedWriter):
    _channel: TcpChannel

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
        self._device = entry.device  # a GPU tensor: what acquire() hands out is GPU memory
        self._device_staging: Any = None
        self._deadline: float | None = None  # of the message being produced through acquire()
        self._slots = SlotChooser(slot_seqs)
        self._framed = -1  # the slot of the message frame() made
        # Sender.write's fast route: every static tensor (its bytes go from the caller's array)
        self.writes_now = not self.spec.dynamic and self.spec.max_bytes > 0
        self._buffer_view = exports_buffer(self.spec.dtype)  # else through a uint8 view

    def frame(self, payload: memoryview, shape: tuple[int, ...]) -> list[memoryview]:
        """The next message's header and payload, ready to send (its slot chosen, which
        :meth:`sent` records once they are on their way). Needs a credit."""
        return [self._frame_header(len(payload), shape), payload]

    def _frame_header(self, nbytes: int, shape: tuple[int, ...]) -> memoryview:
        slot = self._slots.choose(self._channel.released(self._tid))
        header = wire.DataHeader(
            self._tid,
            slot,
            self._generation,
            self.next_seq,
            nbytes,
            shape if self.spec.dynamic else None,
        )
        used = wire.pack_data_header(self._header, header)
        self._framed = slot
        return self._header_view[:used]

    def sent(self) -> None:
        """The message :meth:`frame` made has been handed to the kernel."""
        self._slots.wrote(self._framed, self.next_seq)
        self.next_seq += 1

    def _send(self, payload: memoryview, shape: tuple[int, ...], deadline: float | None) -> None:
        self._channel.send(self.frame(payload, shape), deadline)
        self.sent()

    #: a GPU array is sent from pinned host memory, staged a chunk at a time (_send_from_gpu)
    takes_device = True

    def write_now(self, array: np.ndarray[Any, Any], timeout: float | None) -> bool:
        # write()'s path without its general checks (Sender.write made them) and, unless the
        # socket takes only part of the frame, without a deadline: the credit check, a poll
        # (credits in, a receiver that hung up) where the credit is not in hand or the last
        # poll is ABSORB_EVERY old, the header packed from its fields and one sendmsg of it
        # with the caller's bytes.
        channel = self._channel
        sock = channel._sock
        if channel._frame_open:
            return False  # an interrupted frame: the general path closes the connection
        released = channel._released.get(self._tid, 0)
        now = _monotonic()
        if (
            released < self.next_seq - self._depth
            or now - channel._absorbed_at >= ABSORB_EVERY
            or sock is None
            or channel.lost is not None
        ):
            channel._absorbed_at = now
            channel._absorb(0)  # a PeerLostError: the general path meets it again
            released = channel._released.get(self._tid, 0)
            if released < self.next_seq - self._depth:
                return False  # no credit: the general path waits for one
        slot = self._slots.choose(released)
        seq = self.next_seq
        if self._buffer_view:
            payload = array.data.cast("B")
        else:  # bfloat16, float8: numpy exports no buffer of them
            payload = array.reshape(-1).view(np.uint8).data
        total = wire.pack_static_data_header(
            self._header, self._tid, slot, self._generation, seq, len(payload)
        )
        frame = [self._header_view[:total], payload]
        total += len(payload)
        assert sock is not None  # _absorb raises once it is closed
        channel._frame_open = True
        try:
            sent = sock.sendmsg(frame)
        except OSError:  # full (BlockingIOError), or broken: nothing went
            channel._frame_open = False
            return False  # the general path waits for room, or reports why it fails
        if sent == total:
            channel._frame_open = False
        else:  # the socket took part of it: the rest goes as write() sends it
            channel.send(after(frame, sent), deadline_of(timeout), already=sent)
        self._slots.wrote(slot, seq)
        self.next_seq = seq + 1
        return True

    def write(self, array: Any, deadline: float | None) -> None:
        self.wait_credit(deadline)
        if isinstance(array, np.ndarray):
            self._send(_bytes_of(array), array.shape, deadline)
        else:
            self._send_from_gpu(array, array.shape, deadline)

    def _send_from_gpu(self, array: Any, shape: tuple[int, ...], deadline: float | None) -> None:
        """Send a C-contiguous GPU array's bytes while they are copied out: the copy of each
        chunk into pinned memory overlaps the send of the chunk before it, so the copy out
        costs one chunk's copy rather than the whole array's. Needs a credit."""
        if self._pinned is None:
            self._pinned = PinnedBuffer()
        header = self._frame_header(int(array.nbytes), shape)
        self._channel.send_staged(header, self._pinned.chunks(array), deadline)
        self.sent()

    def acquire(self, shape: tuple[int, ...], deadline: float | None) -> Any:
        # Produce-in-place over a network has to stage somewhere: one buffer per tensor, allocated
        # once, reused for every message (in GPU memory for a GPU tensor, as the producer's
        # kernels write there).
        self.wait_credit(deadline)
        self._deadline = deadline
        nbytes = int(np.prod(shape)) * self.spec.dtype.itemsize
        if self._device is not None:
            if self._device_staging is None:
                self._device_staging = device_bytes(self._device, self.spec.max_bytes)
            return self._device_staging[:nbytes].view(self.spec.dtype).reshape(shape)
        if self._staging is None:
            self._staging = np.empty(self.spec.max_bytes, dtype=np.uint8)
        return self._staging[:nbytes].view(self.spec.dtype).reshape(shape)

    def commit(self, shape: tuple[int, ...]) -> None:
        nbytes = int(np.prod(shape)) * self.spec.dtype.itemsize
        if self._device is not None:
            # the chunks' copies queue behind the kernels that filled it (the current stream)
            self._send_from_gpu(self._device_staging[:nbytes], shape, self._deadline)
            return
        assert self._staging is not None
        self._send(self._staging[:nbytes].data, shape, self._deadline)


# --------------------------------------------------------------------------------------------
# Receiver side
# --------------------------------------------------------------------------------------------


class _Ended(Exception):
    """The sender ended the stream at a frame boundary; ``reason`` None for a goodbye frame."""

    def __init__(self, reason: str | None) -> None:
        super().__init__(reason)
        self.reason = reason


class _Connection:
    """One accepted data connection: the frame it is reading, and the credit link back to its
    sender.

    Frames are read by whichever thread holds :attr:`reading`: the connection's serving thread,
    or a consumer waiting for one of its messages (:meth:`poll`), which then completes the
    message itself instead of being woken by the serving thread (on a 2-core host that hand-off
    costs more than a small message). What has been read of the frame in progress lives here, so
    either can pick it up where the other left off."""

    def __init__(
        self, sock: socket.socket, peer: str, backlog: Callable[[_Connection], None]
    ) -> None:
        self.sock = sock
        self.peer = peer
        self._send_lock = threading.Lock()
        self._pending = bytearray()  # credit frames encoded, not yet taken by the socket
        # Credits are cumulative, so while the socket is full only the latest count of each
        # tensor needs to wait: the backlog stays one frame per tensor, however long it lasts.
        self._unsent: dict[int, int] = {}
        self._backlog = backlog  # hands credits the socket could not take to the flusher
        self.stuck_since: float | None = None
        self.deferred_at: float | None = None  # since when credits are held back (defer)
        # -- receiving ---------------------------------------------------------------------
        self.reading = threading.Lock()
        # set once admitted; weak, as the server's own (its threads never keep a receiver alive)
        self._sink_ref: Callable[[], DataSink | None] = lambda: None
        self._session: object = None
        self._reader = wire.HeaderReader()
        # Read ahead: bytes read from the socket and not yet taken are ahead[_start:_end]. They
        # are always taken before pump() returns, so a frame never waits here for more data.
        self._ahead = memoryview(bytearray(READ_AHEAD))
        self._start = self._end = 0
        # The last read took less than it asked for: the socket was empty then, so once what it
        # brought has landed, pump() returns without another read (which would find nothing
        # more, most of the time, at the cost of a system call and, in Python, an exception:
        # 3 us on this project's VM, as much as landing a 4 KiB message). What arrives after
        # it waits for the next poll, or for the serving thread, which polls the socket again.
        self._drained = False
        # After a payload larger than COPY_BELOW the next header is read alone: a stream of
        # large frames then has each payload received straight into its slot, not mostly
        # copied out of what was read ahead with the header before it.
        self._header_alone = False
        self._header: wire.DataHeader | None = None  # whose payload is being read into _dst
        self._dst: memoryview | None = None
        self._got = 0
        self._in_parts = False  # the sink hears of each STAGING_CHUNK_BYTES of this payload
        self.read_at = 0.0  # when bytes last arrived (monotonic): stall detection mid-frame
        self.driven_at = 0.0  # when a consumer last polled (monotonic); 0: none polls
        self.resume = threading.Event()  # set when a polling consumer goes to sleep
        self.failure: BaseException | None = None  # what a consumer's poll ran into
        self.ended = False

    def admitted(self, sink_ref: Callable[[], DataSink | None], session: object) -> None:
        self._sink_ref = sink_ref
        self._session = session

    @property
    def mid_frame(self) -> bool:
        return self._header is not None or not self._reader.between_frames

    def pump(self, wait: bool, bell_every: int = 0) -> int:
        """Read and complete every frame that has arrived; the count completed. Under
        :attr:`reading`. With ``wait`` (the serving thread) a frame begun is read to its end
        in blocking reads (bounded by the socket's receive timeout); without (a consumer) nothing
        blocks, and a frame begun is left for the next call. Raises :class:`_Ended` at the
        stream's end, anything else for a broken one."""
        if self.failure is not None:  # set by a consumer that held the lock before us
            raise self.failure
        sink = live_sink(self._sink_ref)
        session, sock, reader, ahead = self._session, self.sock, self._reader, self._ahead
        done = 0
        while True:
            if self._dst is None:
                if self._start == self._end and (
                    (done and self._drained and reader.between_frames)
                    or not self._fill(
                        wait and self.mid_frame, reader.need if self._header_alone else READ_AHEAD
                    )
                ):
                    return done
                start = self._start
                if self._end - start >= _HEADER_SIZE and reader.between_frames:
                    # The common frame, a static tensor's, whole in what was read ahead: its
                    # header's fields read in place and the message landed in one call (no
                    # header object, one lock).
                    fields = wire.peek_static_header(ahead, start)
                    if fields is not None:
                        begin = start + _HEADER_SIZE
                        end = begin + fields[4]
                        if end <= self._end and sink.land_copy(
                            session,
                            fields[0],
                            fields[1],
                            fields[2],
                            fields[3],
                            ahead[begin:end],
                            bool(bell_every) and (done + 1) % bell_every == 0,
                        ):
                            self._start = end
                            self._header_alone = fields[4] > COPY_BELOW  # as below
                            done += 1
                            continue
                n = min(reader.need, self._end - self._start)
                header = reader.feed(ahead[self._start : self._start + n])
                self._start += n
                if header is None:
                    continue
                if header.bye:
                    raise _Ended(None)  # clean: every frame before the goodbye has landed
                self._dst = sink.begin_write(session, header)
                self._header = header
                self._got = 0
                # A large payload for a GPU slot is read in parts, each copied on to the GPU
                # while the next arrives; any other is read whole.
                self._in_parts = len(self._dst) > STAGING_CHUNK_BYTES and sink.arrived(
                    session, header, 0
                )
            dst, total = self._dst, len(self._dst)
            while self._got < total:
                got = self._got
                stop = min(total, got + STAGING_CHUNK_BYTES) if self._in_parts else total
                if self._start < self._end:  # what was read ahead first
                    n = min(stop - got, self._end - self._start)
                    dst[got : got + n] = ahead[self._start : self._start + n]
                    self._start += n
                    self._got = got + n
                elif stop - got <= COPY_BELOW:
                    if not self._fill(wait, READ_AHEAD):
                        return done
                    continue
                elif wait:
                    if not recv_exact_into(sock, dst[got:stop]):
                        raise ConnectionError("connection closed before the payload")
                    self._got = stop
                    self.read_at = time.monotonic()
                else:
                    some = _recv_some(sock, dst[got:stop])
                    if some is None:
                        return done
                    if some == 0:
                        raise ConnectionError("connection closed before the payload")
                    self._got = got + some
                    self.read_at = time.monotonic()
                if self._in_parts and self._got == stop:
                    assert self._header is not None
                    sink.arrived(session, self._header, stop)
            header, self._header, self._dst = self._header, None, None
            assert header is not None
            self._header_alone = total > COPY_BELOW
            done += 1
            sink.end_write(session, header, bell=bool(bell_every) and done % bell_every == 0)

    def drop_frame(self) -> None:
        """Forget the frame in progress of a connection that ended: its destination is a view
        of the receiver's memory, which could not be unmapped while this held it."""
        self._header = self._dst = None

    def _fill(self, block: bool, most: int) -> bool:
        """Read what has arrived, ``most`` bytes at most, into the read-ahead buffer (which is
        empty); False when nothing has and not ``block``. ``block`` (mid-frame, from the
        serving thread): wait for at least a byte, bounded by the socket's receive timeout."""
        try:
            n = self.sock.recv_into(self._ahead, most, 0 if block else socket.MSG_DONTWAIT)
            self._drained = n < most
        except BlockingIOError:  # nothing there, or SO_RCVTIMEO expired while blocked
            if block:
                raise TimeoutError("peer stalled in the middle of a frame") from None
            return False
        if n == 0:
            if self.mid_frame:
                raise ConnectionError("connection closed in the middle of a frame")
            raise _Ended("closed without a goodbye")
        self._start, self._end = 0, n
        self.read_at = time.monotonic()
        return True

    def poll(self, rest: bool = False) -> bool:
        """From a consumer waiting for one of this connection's messages: complete what has
        arrived; True if anything was. The serving thread stands back meanwhile, and takes over
        (and reports) whatever goes wrong here. ``rest``: the consumer goes to sleep."""
        if rest:
            self.driven_at = 0.0
            self.resume.set()
            return False
        self.driven_at = time.monotonic()
        if (
            self._session is None  # not admitted yet: nothing of it to complete
            or self.ended
            or self.failure is not None
            or not self.reading.acquire(blocking=False)
        ):
            return False
        try:
            done = self.pump(wait=False)
        except Exception as exc:  # the serving thread reports it
            self.failure = exc
            if not isinstance(exc, _Ended):  # an ended stream wakes the serving thread itself
                self.shutdown()
            return False
        except BaseException:  # interrupted mid-frame (Ctrl-C): the stream's framing is lost
            self.failure = ConnectionError("a consumer reading the connection was interrupted")
            self.shutdown()
            raise
        finally:
            self.reading.release()
        if done:
            sink = self._sink_ref()
            if sink is not None:
                sink.ring()  # other consumers may wait for what we completed
        return bool(done)

    def send_credit(self, tensor_id: int, released: int, defer: bool = False) -> None:
        """Never blocks the consumer that released: what the socket cannot take now is sent by
        the server's accept thread as soon as the sender reads again. A deferred credit waits
        for the next one sent, or for this connection's thread (within CREDIT_DEFER_LIMIT):
        a send per release costs a small message's receiver about as much as the message."""
        if defer:  # send_credits' deferral, without its list: the per-message path
            with self._send_lock:
                self._unsent[tensor_id] = released
                if self.deferred_at is None:
                    self.deferred_at = time.monotonic()
            return
        self.send_credits([(tensor_id, released)])

    def send_credits(self, credits: list[tuple[int, int]], defer: bool = False) -> None:
        """Several credits in one ``send`` (a batch release), with any held back."""
        with self._send_lock:
            for tensor_id, released in credits:
                self._unsent[tensor_id] = released
            if defer:
                if self.deferred_at is None:
                    self.deferred_at = time.monotonic()
                return
            behind = self._flush_locked()
        if behind:
            self._backlog(self)

    def flush(self) -> bool:
        """Send what is pending without blocking; True while some of it is still waiting."""
        with self._send_lock:
            return self._flush_locked()

    def _flush_locked(self) -> bool:
        self.deferred_at = None
        if not self._pending and self._unsent:
            for tensor_id, released in self._unsent.items():
                self._pending += wire.encode_credit(tensor_id, released)
            self._unsent.clear()
        while self._pending:
            try:
                n = self.sock.send(self._pending, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if self.stuck_since is None:
                    self.stuck_since = time.monotonic()
                return True
            except OSError:  # the connection is gone; its serving thread reports why
                self._pending.clear()
                self._unsent.clear()
                break
            del self._pending[:n]
            if not self._pending and self._unsent:
                return self._flush_locked()
        self.stuck_since = None
        return False

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    cut = shutdown  # the serving thread then ends the session as a dropped connection


class TcpDataServer(DataServer):
    """Accepts data connections and receives payloads in place, one thread per connection."""

    def __init__(
        self, host: str, sink: DataSink, *, max_connections: int = 1024, frame_timeout: float = 30.0
    ) -> None:
        self._frame_timeout = frame_timeout
        # Weak: serving threads must not keep the receiver alive (see ControlServer).
        self._sink_ref = weakref.ref(sink)
        self._max = max_connections
        try:
            self._listener = listener(host)
        except OSError as exc:
            raise TensorWireError(f"cannot bind the tcp data port on {host}: {exc}") from exc
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._conns: dict[_Connection, threading.Thread] = {}
        self._backlog: set[_Connection] = set()  # connections with credits the socket refused
        self._closed = False
        # close() and a new backlog wake the accept loop
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="tensorwire-tcp-accept", daemon=True
        )
        self._accept_thread.start()

    def details(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port}

    def poller(self, link: CreditLink) -> Poller | None:
        return link.poll if isinstance(link, _Connection) else None

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full wake pipe already says "look again"
            self._wake_w.send(b"x")

    def _note_backlog(self, conn: _Connection) -> None:
        with self._lock:
            self._backlog.add(conn)
        self._wake()

    def _flush_backlog(self, backlog: list[_Connection]) -> None:
        """Send credits that the senders' sockets refused earlier; cut off a sender that has not
        read its credits for CREDIT_SEND_TIMEOUT (it reads them before every write and whenever
        it waits for one, so a healthy sender never gets there)."""
        now = time.monotonic()
        for conn in backlog:
            if not conn.flush():
                with self._lock:
                    self._backlog.discard(conn)
            elif conn.stuck_since is not None and now - conn.stuck_since > CREDIT_SEND_TIMEOUT:
                log.warning("cutting off %s: it has not read its credits", conn.peer)
                conn.shutdown()
                with self._lock:
                    self._backlog.discard(conn)

    def _accept_loop(self) -> None:
        # poll(), not select(): select() cannot watch descriptors numbered 1024 and up.
        while not self._closed:
            poller = select.poll()
            poller.register(self._listener, select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            with self._lock:
                backlog = list(self._backlog)
            for conn in backlog:
                fd = conn.sock.fileno()
                if fd >= 0:
                    poller.register(fd, select.POLLOUT)
            ready = {fd for fd, _ in poller.poll(100 if backlog else None)}
            if self._wake_r.fileno() in ready:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            if backlog:
                self._flush_backlog(backlog)
            if self._listener.fileno() not in ready or self._closed:
                continue
            try:
                sock, addr = self._listener.accept()
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    # Out of descriptors: the connection waits in the listen queue, and poll()
                    # says so at once; before, this loop spun a core until the sender gave up
                    # (it heard "did not acknowledge our token", and nobody heard why).
                    quiet.warning(
                        "out of descriptors",
                        "cannot accept a data connection: %s%s",
                        exc,
                        open_files_hint(),
                    )
                    time.sleep(ACCEPT_RETRY)
                continue
            with self._lock:
                if self._closed or len(self._conns) >= self._max:
                    quiet.warning(
                        "data connections over the limit",
                        "refusing data connection from %s (limit %d)",
                        addr,
                        self._max,
                    )
                    sock.close()
                    continue
                conn = _Connection(sock, f"{addr[0]}:{addr[1]}", self._note_backlog)
                thread = threading.Thread(
                    target=self._serve,
                    args=(conn,),
                    name=f"tensorwire-tcp-{conn.peer}",
                    daemon=True,
                )
                self._conns[conn] = thread
            thread.start()
            # (kept in this loop's locals, the latest connection, with its session, would
            # outlive its end until the next one is accepted)
            del conn, thread

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
            # Before the sender hears it is in: from then on a consumer may read the connection
            # itself (poll), and one that did so before this found no receiver and cut it off.
            conn.admitted(self._sink_ref, session)
            sock.settimeout(None)
            # A peer that stops in the middle of a frame is cut off after frame_timeout.
            set_receive_timeout(sock, self._frame_timeout)
            conn.send_credit(HELLO_ACK, msg.generation)
            self._receive(conn)
        except _Ended as end:
            reason = end.reason
        # The log gets the error's text, not the error: a handler that keeps its records
        # (pytest's, a memory handler) would otherwise keep its traceback, whose frames hold
        # the frame in progress's view of the receiver's memory, which then cannot be unmapped.
        except (LocalProtocolError, TensorWireError) as exc:
            reason = f"protocol error: {exc}"
            quiet.warning(
                "data connections with protocol errors",
                "dropping data connection from %s: %s",
                conn.peer,
                str(exc),
            )
        except TimeoutError as exc:
            reason = f"stalled mid-frame: {exc}"
            quiet.warning(
                "data connections stalled mid-frame",
                "dropping data connection from %s: %s",
                conn.peer,
                str(exc),
            )
        except (OSError, ConnectionError) as exc:
            reason = f"connection error: {exc}"
        finally:
            sink_or_none = self._sink_ref()
            if session is not None and sink_or_none is not None:
                sink_or_none.ring()  # for what landed last, whatever ends the connection
                sink_or_none.disconnected(session, reason)
            del sink_or_none
            with self._lock:
                self._conns.pop(conn, None)
                self._backlog.discard(conn)
            conn.shutdown()
            with conn.reading:  # a consumer polling it is done with the socket
                conn.ended = True
                conn.drop_frame()
                sock.close()

    def _receive(self, conn: _Connection) -> None:
        """Read the connection's frames until it ends (:class:`_Ended`) or breaks. Between
        frames this thread waits for data in ``poll``, outside :attr:`_Connection.reading`; while
        a consumer polls the connection itself, this thread stands back."""
        poller = select.poll()
        poller.register(conn.sock, select.POLLIN | _POLLRDHUP)
        while not self._closed:
            if conn.failure is not None:
                raise conn.failure
            held = conn.deferred_at
            if held is not None and time.monotonic() - held >= CREDIT_DEFER_LIMIT:
                conn.send_credits([])  # the consumer did not release more in time
            driven, now = conn.driven_at, time.monotonic()
            # A sender that stops in the middle of a frame is cut off after frame_timeout,
            # also while a consumer reads the connection (one that never rests, polling in a
            # loop, left it uncut for good: nothing else here looks at the frame's clock).
            if now - conn.read_at > self._frame_timeout and conn.mid_frame:
                raise TimeoutError("peer stalled in the middle of a frame")
            if driven and now - driven < CONSUMER_DRIVES:
                # A consumer reads: competing with it for the socket, the GIL and the cores
                # only slows it. Once it sleeps on the doorbell it says so, and we read again
                # (or send the credits held back, in time).
                held = conn.deferred_at
                conn.resume.wait(
                    CONSUMER_DRIVES if held is None else max(held + CREDIT_DEFER_LIMIT - now, 0)
                )
                conn.resume.clear()
                continue
            # while credits are held back, wake in time to send them
            if not poller.poll(1 if conn.deferred_at is not None else IDLE_CHECK_MS):
                continue  # (a frame stalled is looked for at the top)
            if time.monotonic() - conn.driven_at < CONSUMER_DRIVES:
                continue
            with conn.reading:
                done = conn.pump(wait=True, bell_every=BELL_EVERY)
            if done:
                # Messages that arrived together are completed together and the consumers
                # woken once (a wake-up costs both threads more than the message), at most
                # every BELL_EVERY messages while more keep coming.
                self._sink().ring()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake()
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


def start_server(settings: ServerSettings, sink: DataSink) -> TcpDataServer:
    """The receiving side, as :mod:`tensorwire.transports` starts it."""
    return TcpDataServer(
        settings.host,
        sink,
        max_connections=settings.max_connections,
        frame_timeout=settings.frame_timeout,
    )
