"""The gRPC baseline transports, behind the same interface as ``shm`` and ``tcp``.

``grpc`` moves tensors the way TensorFlow's gRPC runtime and many frameworks do: every write is one
unary ``Write`` call carrying a protobuf ``TensorProto`` (dtype, shape, ``tensor_content`` bytes).
The sender copies the array into ``bytes`` and protobuf serialises it; the receiver's gRPC thread
deserialises a fresh message and copies its content into the registered slot, which then completes
exactly as with the other transports (sequence number, doorbell, credits).

``grpc-stream`` gives gRPC its best shot: no protobuf, the payload client-streamed as raw 1 MiB
``bytes`` chunks (grpcio accepts only ``bytes``, so each chunk is one copy) that the receiver copies
into the slot as they arrive. A message of up to ``ONE_CALL_BYTES`` goes as one unary call of raw
bytes (token, header, payload) instead: grpcio's client-streamed call starts a thread per call to
read the request's chunks, and took twice a unary call's time for small messages (a 4 KiB round
trip of 2256 us against ``grpc``'s 1379 us; a hand-written grpcio echo of 4 KiB took 577 us a
unary call and 352 us over a bidirectional stream kept open).

Both keep the tensorwire contracts: the receiver checks every header against the spec before a
byte lands, and a stream cut short never completes its slot. Credits cost no call of their own:
a write whose ring is full waits *in the receiver's server thread* until the consumer releases a
slot (bounded by the call's deadline), which is how a gRPC service applies back-pressure, so
every message is exactly one call, as in TensorFlow's runtime. The receiver picks the slot.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, NoReturn

# gRPC's C core logs every GOAWAY of a closing peer at INFO on stderr; keep its chatter to errors
# unless the user asked for more.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc
import numpy as np

from .. import metrics, wire
from ..endpoint import host_port
from ..errors import (
    LocalProtocolError,
    PeerLostError,
    RemoteProtocolError,
    TensorWireError,
    TransportError,
    WireTimeoutError,
)
from ..quietlog import QuietLog
from . import tensor_service_pb2 as pb
from . import tensor_service_pb2_grpc as pb_grpc
from .base import (
    ENDED_BY_RECEIVER,
    PROBE_EVERY,
    Channel,
    DataServer,
    DataSink,
    PeerInfo,
    ServerSettings,
    TensorEntry,
    TensorWriter,
)

log = logging.getLogger(__name__)
#: warnings about what a peer can send: rate-limited per reason, each counted in the metrics
quiet = QuietLog(log)

#: gRPC's default 4 MiB message cap would refuse large tensors: lift it on both ends.
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]
STREAM_METHOD = "/tensorwire.RawStream/Write"
#: grpc-stream's message of at most ONE_CALL_BYTES: one unary call of raw bytes
ONE_CALL_METHOD = "/tensorwire.RawStream/WriteOne"
CHUNK = 1 << 20
#: The largest grpc-stream payload sent as one unary call: at 512 KiB it ran 1.8x the streamed
#: call's throughput, at 1 MiB about 5% below it (`tensorwire bench --sizes 512KiB,1MiB
#: --transports grpc-stream`, interleaved runs on the 2-core VM)
ONE_CALL_BYTES = CHUNK // 2
#: The most tensor bytes one unary ``Write`` carries: protobuf serialises no message of 2 GiB or
#: more, and the request's other fields (token, ids, dtype, up to 16 dimensions) take well
#: under a KiB. grpc-stream has no such limit (its chunks are 1 MiB each).
PROTO_CONTENT_LIMIT = (1 << 31) - 1 - 1024
#: A queued write gives up this long before the caller's deadline, so that its answer (no free
#: slot: WireTimeoutError naming the ring) reaches the caller before gRPC's DEADLINE_EXCEEDED.
DEADLINE_MARGIN = 0.05
#: A write's call waits this much past the write's own deadline for the receiver's answer, and
#: the receiver's wait for a slot ends that much earlier than the call's deadline it sees (at the
#: write's deadline). gRPC's deadline is the caller's alone: a caller that gave up at it could
#: not know whether the message had landed, and one that had (its handler scheduled late, a
#: slot freed meanwhile) left the sender's count a message behind the receiver's ("expected
#: message 4, got 3" on the next write: test_conformance -k full_ring, under load). The caller
#: now hears what happened unless the receiver stalls this long.
ANSWER_GRACE = 0.5
#: How long :meth:`GrpcChannel.probe_peer`'s call over an idle connection may take: a refused
#: connection fails it at once; one that is not answered (a receiver unreachable, or frozen)
#: says nothing, and is left to the heartbeats.
PROBE_TIMEOUT = 5.0
SERVER_THREADS = 32
CLOSE_TIMEOUT = 0.5
LOSS_CHECK = 0.1  # how often a call in flight looks whether the receiver was declared lost


#: a call for a handler thread: its future, the function and its arguments
_Work = tuple[futures.Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class _HandlerThreads(futures.Executor):
    """grpcio's handler threads for a data server: up to ``most`` daemon threads, started as
    work comes and none is idle (as ``ThreadPoolExecutor`` does).

    Not a ``ThreadPoolExecutor``: its workers stop, and it refuses work, as soon as the
    interpreter begins to exit, before any :mod:`atexit` hook runs. A receiver left open at exit
    is closed by such a hook (:mod:`tensorwire.resource`), and its data server must still answer
    the goodbyes of the senders closed with it; with the stdlib pool grpcio's serving thread died
    on the refused work and the close waited for it forever.
    """

    def __init__(self, most: int, prefix: str) -> None:
        self._most = most
        self._prefix = prefix
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._shut = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future[Any]:
        future: futures.Future[Any] = futures.Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("the grpc data server is closed")
            self._work.put((future, fn, args, kwargs))
            if not self._idle.acquire(timeout=0) and len(self._threads) < self._most:
                thread = threading.Thread(
                    target=self._serve, name=f"{self._prefix}_{len(self._threads)}", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError:
                    # The interpreter is exiting (Python 3.12 on starts no thread once its
                    # atexit hooks run): the work waits for a thread already started, freed by
                    # the server's stop if not before. Raised, it ended grpcio's serving
                    # thread, and the receiver's close at exit waited for it forever (1 exit in
                    # 6 to 25 on 3.12, test_resources.py -k leaves_both_ends_open).
                    return future
                self._threads.append(thread)
        return future

    def _serve(self) -> None:
        while (item := self._work.get()) is not None:
            future, fn, args, kwargs = item
            del item
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:
                    future.set_exception(exc)
                    del exc  # no traceback (and the frames it holds) kept by this thread
                else:
                    future.set_result(result)
                    del result
            del future, fn, args, kwargs
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            threads = list(self._threads)
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                thread.join()


#: a gRPC data server's answer to a call whose session token it does not hold (one it never
#: issued, or one of a session that ended longer ago than its last ENDED_KEPT)
UNKNOWN_SESSION = "unknown or closed session token"
#: the tokens of ended sessions a gRPC data server remembers (16 bytes each, and a dict entry)
ENDED_KEPT = 1024


def _rpc_error(
    exc: grpc.RpcError, where: str, channel: GrpcChannel | None = None
) -> TensorWireError:
    code = exc.code() if hasattr(exc, "code") else None
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return WireTimeoutError(f"grpc call to {where} timed out")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # a write queued for a slot until its deadline
        return WireTimeoutError(f"receiver at {where}: {detail}")
    if code == grpc.StatusCode.FAILED_PRECONDITION and detail == UNKNOWN_SESSION:
        # Our session is not there: the receiver dropped it and forgot it, or a receiver
        # restarted at this address took our gRPC data port (an ephemeral port can come back
        # at once). Its receiver is gone for this session, as a reset connection says over
        # tcp; before, a RemoteProtocolError said our write was refused (a suite run: a
        # receiver restarted at its address, `test_faults.py -k new_generation`).
        lost = PeerLostError(
            f"receiver at {where} does not know this sender's session ({ENDED_BY_RECEIVER}, "
            "or another receiver now listens there)"
        )
    elif code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
        return RemoteProtocolError(f"receiver at {where} refused the write: {detail}")
    else:
        lost = PeerLostError(f"grpc connection to {where} failed: {code} {detail}")
    if channel is not None:
        channel.lost = str(lost)  # once the receiver is known gone, it stays gone
    return lost


# --------------------------------------------------------------------------------------------
# Receiver side
# --------------------------------------------------------------------------------------------


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)  # raises inside grpcio
    raise AssertionError("unreachable: ServicerContext.abort returned")


class _SessionLink:
    """The credit link of one gRPC session. Credits need no message: a queued write watches the
    ring's released count itself. What is left is ending the session, and with it the streamed
    messages still arriving."""

    def __init__(self, forget: Callable[[_SessionLink], None]) -> None:
        self.closed = False
        self._lock = threading.Lock()
        self._streams: set[grpc.ServicerContext] = set()  # grpc-stream calls in flight
        #: the data server's forgetting of this session, once it ended
        self._forget = forget

    def send_credit(self, tensor_id: int, released: int, defer: bool = False) -> None:
        pass  # a write waiting for this slot sees the ring's released word change

    def send_credits(self, credits: list[tuple[int, int]], defer: bool = False) -> None:
        pass

    def enter(self, context: grpc.ServicerContext) -> bool:
        """A streamed message of this session begins to arrive; False if the session ended."""
        with self._lock:
            if self.closed:
                return False
            self._streams.add(context)
            return True

    def leave(self, context: grpc.ServicerContext) -> None:
        with self._lock:
            self._streams.discard(context)

    def close(self, but: grpc.ServicerContext | None = None) -> None:
        """End the session: its next call is answered ABORTED (peer lost), and each streamed
        message still arriving (but ``but``, the call that ends it) is cancelled. Its handler
        waits for the stream's next chunk, which a sender stopped midway (frozen, its network
        stalled) never sends: it held the write in flight, which fences the tensor, and a new
        writer's claim was refused until the stalled sender ran again. A cancelled call's wait
        raises at once, and the write is let go (never completed)."""
        with self._lock:
            self.closed = True
            streams = [c for c in self._streams if c is not but]
        for context in streams:
            context.cancel()
        self._forget(self)

    cut = close


def _deadline(context: grpc.ServicerContext) -> float | None:
    """Where a queued write stops waiting: a little before the write's deadline (the call's,
    less the caller's ANSWER_GRACE), if any."""
    left = context.time_remaining()
    if left is None or left > 1e8:  # no deadline
        return None
    return time.monotonic() + max(left - ANSWER_GRACE - DEADLINE_MARGIN, 0.0)


def _still_awaited(context: grpc.ServicerContext) -> None:
    """Just before a message is completed: refuse it where its caller stopped waiting (its
    call cancelled or past its deadline), which then reports it unwritten."""
    if not context.is_active():
        _abort(context, grpc.StatusCode.DEADLINE_EXCEEDED, "the caller stopped waiting")


class GrpcDataServer(pb_grpc.TensorServiceServicer, DataServer):
    """A gRPC server delivering ``grpc`` and ``grpc-stream`` writes into the receiver."""

    def __init__(self, host: str, sink: DataSink) -> None:
        import weakref

        self._sink_ref = weakref.ref(sink)
        self._sessions: dict[bytes, tuple[object, _SessionLink]] = {}
        #: the tokens of sessions that ended here (:meth:`_forget`), oldest first
        self._ended: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = _HandlerThreads(SERVER_THREADS, "tensorwire-grpc")
        self._server = grpc.server(self._pool, options=GRPC_OPTIONS)
        pb_grpc.add_TensorServiceServicer_to_server(self, self._server)
        self._server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "tensorwire.RawStream",
                    {
                        "Write": grpc.stream_unary_rpc_method_handler(self._write_stream),
                        "WriteOne": grpc.unary_unary_rpc_method_handler(self._write_one),
                    },
                ),
            )
        )
        self.host = host
        self.port: int = self._server.add_insecure_port(host_port(host, 0))
        if not self.port:
            self._pool.shutdown(wait=False)
            raise TensorWireError(f"cannot bind the grpc data port on {host}")
        self._server.start()

    def details(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port}

    def attach(self, session: object, details: dict[str, Any]) -> tuple[None, dict[str, Any]]:
        """Started on demand, this server is in the welcome without its port: a sender asks
        for it here (its ``Open`` call makes the session's link)."""
        return None, self.details()

    def _sink(self, context: grpc.ServicerContext) -> DataSink:
        sink = self._sink_ref()
        if sink is None:
            _abort(context, grpc.StatusCode.UNAVAILABLE, "receiver is gone")
        return sink

    def _session(self, token: bytes, context: grpc.ServicerContext) -> tuple[object, _SessionLink]:
        key = bytes(token)
        with self._lock:
            entry = self._sessions.get(key)
            ended = entry is None and key in self._ended
        if ended or (entry is not None and entry[1].closed):
            _abort(context, grpc.StatusCode.ABORTED, ENDED_BY_RECEIVER)
        if entry is None:
            metrics.count("tensorwire_bad_input_total", "grpc_calls_with_unknown_tokens")
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, UNKNOWN_SESSION)
        return entry

    def _refuse(self, token: bytes, exc: Exception, context: grpc.ServicerContext) -> NoReturn:
        """A protocol violation ends the session, as a dropped TCP connection would."""
        with self._lock:
            entry = self._sessions.pop(bytes(token), None)
            if entry is not None:
                self._remember_ended(bytes(token))
        sink = self._sink_ref()
        if entry is not None and sink is not None:
            entry[1].close(but=context)  # (answered here, below)
            sink.disconnected(entry[0], f"protocol error: {exc}")
        quiet.warning("grpc writes refused", "refusing a grpc write: %s", exc)
        lost = isinstance(exc, PeerLostError)  # the receiver dropped the session: not a bad write
        code = grpc.StatusCode.ABORTED if lost else grpc.StatusCode.FAILED_PRECONDITION
        _abort(context, code, str(exc))

    # -- the service -------------------------------------------------------------------------

    def Open(self, request: Any, context: grpc.ServicerContext) -> Any:
        key = bytes(request.token)
        link = _SessionLink(lambda ended: self._forget(key, ended))
        try:
            session = self._sink(context).admit(request.token, request.generation, link, "grpc")
        except TensorWireError as exc:
            metrics.count("tensorwire_bad_input_total", "grpc_opens_refused")
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        with self._lock:
            self._sessions[key] = (session, link)
        if link.closed:  # dropped as it was admitted: nothing will forget it later
            self._forget(key, link)
        return pb.OpenReply(generation=request.generation)

    def _forget(self, key: bytes, link: _SessionLink) -> None:
        """Let go of the session of token ``key`` once its link ended (the receiver dropped
        it, or it said goodbye). Before, a session the receiver dropped stayed here until its
        sender's goodbye, which a killed sender never says: its Session, with what it held, was
        kept for good, one per killed gRPC sender (5 of 5 in a run by hand)."""
        with self._lock:
            entry = self._sessions.get(key)
            if entry is not None and entry[1] is link:
                del self._sessions[key]
                self._remember_ended(key)

    def _remember_ended(self, key: bytes) -> None:
        """(Under the lock.) Keep the token of a session that ended here (the last ENDED_KEPT),
        so that its sender's next call is told that the session ended (ABORTED), not counted
        as a call with a forged token; one older than those is answered as unknown, which the
        sender reads as its session's end too."""
        self._ended[key] = None
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def _begin(
        self, sink: DataSink, session: object, token: bytes, header: wire.DataHeader, context: Any
    ) -> tuple[wire.DataHeader, memoryview]:
        """Wait for a free slot (the credit), then check the header as every transport does."""
        try:
            header = sink.await_slot(session, header, _deadline(context))
            return header, sink.begin_write(session, header)
        except WireTimeoutError as exc:  # the ring stayed full: the write was not made
            _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except TensorWireError as exc:
            self._refuse(token, exc, context)

    def Write(self, request: Any, context: grpc.ServicerContext) -> Any:
        session, _ = self._session(request.token, context)
        content = request.tensor_content
        header = wire.DataHeader(
            request.tensor_id,
            0,  # the slot is ours to pick, once one is free
            request.generation,
            request.seq,
            len(content),
            tuple(request.shape) if request.dynamic else None,
        )
        sink = self._sink(context)
        header, dst = self._begin(sink, session, request.token, header, context)
        try:
            dst[:] = content  # the deserialised message's bytes, copied into the registered slot
            _still_awaited(context)
            sink.end_write(session, header)
        except TensorWireError as exc:
            self._refuse(request.token, exc, context)
        finally:
            sink.abort_write(session, header)  # no-op once completed
            del dst
        return pb.WriteReply()

    def Close(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._lock:
            entry = self._sessions.pop(bytes(request.token), None)
        sink = self._sink_ref()
        if entry is not None:
            entry[1].close()
            if sink is not None:
                sink.disconnected(entry[0], None)
        return pb.CloseReply()

    def _write_stream(self, chunks: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        return self._write(next(chunks, None), chunks, context)

    def _write(
        self,
        first: bytes | None,
        chunks: Iterator[bytes | memoryview],
        context: grpc.ServicerContext,
    ) -> bytes:
        """One grpc-stream message: ``first`` the token and the header, ``chunks`` the payload."""
        if first is None or len(first) < wire.TOKEN_BYTES + wire.DATA_HEADER.size:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "stream must start with a header")
        token = first[: wire.TOKEN_BYTES]
        session, link = self._session(token, context)
        if not link.enter(context):
            _abort(context, grpc.StatusCode.ABORTED, ENDED_BY_RECEIVER)
        try:
            return self._take_stream(chunks, context, first, token, session, link)
        finally:
            link.leave(context)

    def _write_one(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """A grpc-stream message of up to ONE_CALL_BYTES, in one call: the token and the header
        (with its shape words, for a dynamic tensor), then the payload, taken as a stream of
        that one chunk."""
        view = memoryview(request)
        end = wire.TOKEN_BYTES + wire.DATA_HEADER.size
        if len(view) >= end:
            # the header's length: its fixed part says how many shape words follow (a header
            # that does not decode is refused by the stream's own reading of it)
            probe = wire.HeaderReader()
            try:
                if probe.feed(view[wire.TOKEN_BYTES : end]) is None:
                    end += probe.need
            except TensorWireError:
                pass
        rest = view[end:]
        return self._write(bytes(view[:end]), iter((rest,) if len(rest) else ()), context)

    def _take_stream(
        self,
        chunks: Iterator[bytes | memoryview],
        context: grpc.ServicerContext,
        first: bytes,
        token: bytes,
        session: object,
        link: _SessionLink,
    ) -> bytes:
        """One streamed message into its slot: the header in ``first``, the payload in the
        chunks after it (a call the session's end cancels: see :meth:`_SessionLink.close`)."""
        sink = self._sink(context)
        try:
            reader = wire.HeaderReader()
            raw = first[wire.TOKEN_BYTES :]
            header = reader.feed(raw[: reader.need])
            if header is None:
                header = reader.feed(raw[wire.DATA_HEADER.size :])
            if header is None or header.bye:
                raise LocalProtocolError("malformed stream header")
        except TensorWireError as exc:
            self._refuse(token, exc, context)
        header, dst = self._begin(sink, session, token, header, context)
        try:
            got = 0
            for chunk in chunks:
                if got + len(chunk) > len(dst):
                    self._refuse(
                        token, LocalProtocolError("stream longer than its header"), context
                    )
                if link.closed:  # the receiver dropped the session: not one more byte lands
                    self._refuse(token, PeerLostError(ENDED_BY_RECEIVER), context)
                dst[got : got + len(chunk)] = chunk
                got += len(chunk)
            if got != len(dst):  # cut short: the slot is never completed
                raise LocalProtocolError("stream shorter than its header")
            _still_awaited(context)
            sink.end_write(session, header)
        except TensorWireError as exc:
            self._refuse(token, exc, context)
        finally:
            # However the stream ended (the client vanished, grpcio raised), this thread writes
            # no more into the slot: another writer may have it. Nor may a traceback that grpcio
            # keeps hold the slot's memory (it would keep the region mapped after close).
            sink.abort_write(session, header)
            del dst
        return b""

    def close(self) -> None:
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for _, link in sessions:
            link.close()
        self._server.stop(grace=None).wait()
        self._pool.shutdown(wait=True)


# --------------------------------------------------------------------------------------------
# Sender side
# --------------------------------------------------------------------------------------------


class GrpcChannel(Channel):
    """Sender side of ``grpc`` (unary TensorProto per write)."""

    transport = "grpc"

    def __init__(self, info: PeerInfo) -> None:
        host, port = info.data_endpoint("grpc")
        self.where = host_port(host, port)
        self.token = info.welcome.token
        self.generation = info.welcome.generation
        self._timeout = info.timeout
        self._next_probe = 0.0  # when probe_peer may call over an idle connection next
        # a receiver on this host is seen gone by its process (the sender's pidfd), which says
        # more than a connection refused: probe_peer leaves it to that
        self._same_host = info.same_host
        self._watching = False  # whether probe_peer subscribed to the connection's state
        self._watch_lock = threading.Lock()  # a subscription and the channel's close, apart
        self._channel_closed = False  # by close() or a verdict (mark_lost): calls end
        self._connectivity: grpc.ChannelConnectivity | None = None  # as gRPC last said
        self._channel = grpc.insecure_channel(self.where, options=GRPC_OPTIONS)
        self.stub = pb_grpc.TensorServiceStub(self._channel)
        self.stream = self._channel.stream_unary(STREAM_METHOD)
        self.one_call = self._channel.unary_unary(ONE_CALL_METHOD)
        self._setup_check = info.check  # the sender's check of the receiver, during Open
        try:
            self.call(
                self.stub.Open,
                pb.OpenRequest(token=self.token, generation=self.generation),
                info.timeout,
            )
        except BaseException:
            self._channel.close()
            raise
        finally:
            self._setup_check = None

    def writer(
        self, entry: TensorEntry, next_seq: int, released: int, slot_seqs: list[int], epoch: int
    ) -> TensorWriter:
        return GrpcWriter(self, entry, next_seq)

    def call(self, method: Any, request: Any, timeout: float | None, *, small: bool = False) -> Any:
        """Run an RPC, but give up as soon as the receiver is declared lost (a stopped
        receiver would otherwise hold the call until its deadline).

        A ``small`` write's call (up to ONE_CALL_BYTES) is gRPC's plain blocking call, as a
        user of gRPC makes it: grpcio waits for it on the calling thread. Its future, waited
        on in turns to look at the verdict, cost about 140 us more a call (a hand-off to
        gRPC's polling thread and back: 564-605 against 423-443 us for a 4 KiB call,
        interleaved, in one process), which the baseline paid on every message. The verdict
        ends such a call by closing the channel (:meth:`mark_lost`), which cancels it. A
        larger one may be stuck in HTTP/2 flow control towards a stopped receiver, where
        grpcio's close waits for it: it keeps the future, cancelled at the verdict; so does
        Open, while the sender sets up, to run the sender's own check of the receiver."""
        if not small or self._setup_check is not None:
            return self._call_checking(method, request, timeout)
        if self.lost is not None:
            raise PeerLostError(self.lost)
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as exc:
            if self.lost is not None:  # cancelled by the verdict's close (or the sender's)
                raise PeerLostError(self.lost) from None
            raise _rpc_error(exc, self.where, self) from exc
        except ValueError:  # "Cannot invoke RPC on closed channel!": the verdict came first
            if self.lost is not None:
                raise PeerLostError(self.lost) from None
            raise
        except BaseException as exc:
            # Interrupted (a KeyboardInterrupt) with the call in flight: grpcio cancels it,
            # but the receiver may have completed it already (a write held for a slot lands
            # once one frees, if the cancel comes second). Its outcome is unknown, and the
            # writer's sequence numbers with it: the session ends (the next write raises
            # PeerLostError, which reconnect=True acts on), as at a sender's death mid-write.
            # Before, the next write reused the number of the one that had landed, and the
            # receiver dropped the session as a protocol error ("expected message 3, got 2").
            self._interrupted(exc)
            raise

    def _call_checking(self, method: Any, request: Any, timeout: float | None) -> Any:
        """:meth:`call` of a large write, or of Open during set-up: the call's future, waited
        on in turns of LOSS_CHECK, between which the verdict (and, during set-up, the sender's
        check of the receiver) are looked at; the verdict cancels the future."""
        try:
            future = method.future(request, timeout=timeout)
        except grpc.RpcError as exc:  # refused before it started (a request it cannot send)
            raise _rpc_error(exc, self.where, self) from exc
        while True:
            try:
                return future.result(timeout=LOSS_CHECK)
            except grpc.FutureTimeoutError:
                if self.lost is not None:
                    future.cancel()
                    raise PeerLostError(self.lost) from None
                if self._setup_check is not None:
                    try:
                        self._setup_check()
                    except PeerLostError:
                        future.cancel()
                        raise
            except grpc.RpcError as exc:
                if self.lost is not None:  # (cancelled by the verdict's close, or ours)
                    raise PeerLostError(self.lost) from None
                raise _rpc_error(exc, self.where, self) from exc
            except BaseException as exc:
                future.cancel()  # (as in call)
                self._interrupted(exc)
                raise

    def _interrupted(self, exc: BaseException) -> None:
        """A call interrupted in flight ends the session: see :meth:`call`."""
        if self.lost is None:  # (a receiver already known gone is owed no goodbye)
            self.ended_here = True
            self.mark_lost(
                f"a call to {self.where} was interrupted in flight ({type(exc).__name__}): "
                "whether it landed is unknown, so this session ends"
            )

    def mark_lost(self, reason: str) -> None:
        """The receiver is gone (the heartbeats' verdict, or the sender closed during a
        write): ends the small calls in flight, which block in gRPC (:meth:`call`), by closing
        the channel, on a thread of its own (grpcio's close can wait for a large call stuck
        towards a stopped receiver; the caller here is the heartbeat thread). Not where the
        session ended by our own doing (an interrupted call): the receiver may live, and is
        owed a goodbye."""
        super().mark_lost(reason)
        if not self.ended_here and not self._channel_closed:
            threading.Thread(
                target=self._close_channel, name="tensorwire-grpc-close", daemon=True
            ).start()

    def _close_channel(self) -> None:
        with self._watch_lock:  # (not while probe_peer subscribes to it)
            if self._channel_closed:
                return
            self._channel_closed = True
        self._channel.close()  # (and every subscription to its connectivity with it)

    def check_peer(self) -> None:
        self.raise_if_lost()

    def probe_peer(self) -> None:
        """:meth:`check_peer`, then a look at the channel's connection. gRPC reads a connection
        the receiver's kernel closed (its process killed, on another host) as idle, and says
        nothing until a call; from the first probe on, gRPC's watch of the connection tells us
        of each change (:meth:`_saw_connectivity`), and the first probe, and each while the
        connection is idle (PROBE_EVERY at most), makes a call that changes nothing (a
        ``Close`` of no session, which every receiver answers as done): the call connects
        again, and one that fails as unavailable (refused: nothing listens there any more)
        marks the receiver lost, as a write's failed call would. Without it an idle sender
        knew of such a receiver only once three heartbeats went unanswered: a parameter server
        waited that long (20 s with the daemons' 5 s, measured) for a worker killed on another
        host before its first push. A receiver that is stopped keeps its connection (and its
        kernel accepts new ones): no verdict, as before. The watch is one thread of gRPC's,
        which wakes 5 times a second while the channel is open; a sender never probed has
        none. (Not gRPC's own ``try_to_connect``: the watch then looked at the channel once
        more after it was closed, and raised in its thread.) A receiver on this host is left to
        its process's pidfd, which says more."""
        self.check_peer()
        if self._same_host:
            return
        first = not self._watching
        if first:  # (and a call now: the watch says how the connection stands only later)
            with self._watch_lock:
                if self._channel_closed or self._watching:
                    return
                self._watching = True
                self._channel.subscribe(self._saw_connectivity, try_to_connect=False)
        now = time.monotonic()
        idle = self._connectivity is grpc.ChannelConnectivity.IDLE
        if not (first or idle) or now < self._next_probe:
            return
        self._next_probe = now + PROBE_EVERY
        try:
            call = self.stub.Close.future(pb.CloseRequest(token=b""), timeout=PROBE_TIMEOUT)
        except (grpc.RpcError, ValueError):  # closed meanwhile: nothing to look at
            return
        call.add_done_callback(self._probed)

    def _saw_connectivity(self, state: grpc.ChannelConnectivity) -> None:
        """gRPC's watch of the channel's connection (on a thread of gRPC's)."""
        self._connectivity = state

    def _probed(self, call: Any) -> None:
        """The end of :meth:`probe_peer`'s call (on a thread of gRPC's): unavailable is the
        receiver's loss; anything else (done, timed out, cancelled at close) says nothing."""
        if call.cancelled():
            return
        exc = call.exception()
        if isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE:
            # (the verdict, without our mark_lost's close of the channel: this runs on a
            # thread of gRPC's; a call in flight to a receiver that refuses fails by itself)
            Channel.mark_lost(
                self,
                f"grpc connection to {self.where} failed: the connection ended and a new one "
                f"could not be made ({exc.details()})",
            )

    def goodbye(self, timeout: float) -> bool:
        # Writes return only once the data is in the slot, so nothing is in flight: the Close is
        # kept short, as a receiver that went away makes it wait it out. Unanswered (the
        # receiver gone, or stopped: its gRPC server answers nothing meanwhile), the session
        # may live on there with its claims, so False: the control plane's goodbye follows,
        # and reaches a stopped receiver when it runs again. Before, True: the same sender's
        # next session had its claims refused until the receiver's heartbeat timeout (a chaos
        # run: a server exited on "refused claim" when a frozen worker joined again). A Close
        # refused outright (nothing listens there any more: the receiver closed or died) marks
        # the receiver lost, as a write's would, so that no control-plane goodbye waits its
        # whole timeout for a receiver known gone (before, each such close took 5 s).
        try:
            self.stub.Close(pb.CloseRequest(token=self.token), timeout=min(timeout, CLOSE_TIMEOUT))
        except grpc.RpcError as exc:
            _rpc_error(exc, self.where, self)  # (sets self.lost, unless the call timed out)
            return False
        except ValueError:  # the channel was closed: a verdict came meanwhile
            return False
        return True

    def close(self) -> None:
        self.lost = f"grpc channel to {self.where} is closed"  # (as the other transports say)
        self._close_channel()


class GrpcStreamChannel(GrpcChannel):
    """Sender side of ``grpc-stream`` (raw bytes, client-streamed in 1 MiB chunks; one unary
    call of them up to ``ONE_CALL_BYTES``)."""

    transport = "grpc-stream"

    def writer(
        self, entry: TensorEntry, next_seq: int, released: int, slot_seqs: list[int], epoch: int
    ) -> TensorWriter:
        return GrpcStreamWriter(self, entry, next_seq)


class GrpcWriter(TensorWriter):
    """One call per message; a full ring holds the call at the receiver (no credit traffic)."""

    def __init__(self, channel: GrpcChannel, entry: TensorEntry, next_seq: int) -> None:
        self.spec = entry.spec
        self.next_seq = next_seq
        self._channel = channel
        self._tid = entry.tensor_id
        self._staging: np.ndarray[Any, Any] | None = None
        self._deadline: float | None = None  # of the message being produced through acquire()

    def _timeout(self, deadline: float | None) -> float | None:
        """The call's timeout: the write's, and ANSWER_GRACE for the receiver's answer."""
        return None if deadline is None else max(deadline - time.monotonic(), 0.001) + ANSWER_GRACE

    #: the most bytes one message may carry (None: no limit of the transport's own)
    content_limit: int | None = PROTO_CONTENT_LIMIT

    def _check_fits(self, nbytes: int) -> None:
        """Refuse, before a byte is copied, a message larger than one protobuf can be (grpcio
        said only "Exception serializing request!", after copying it all): the session goes on."""
        if self.content_limit is not None and nbytes > self.content_limit:
            raise TransportError(
                f"tensor {self.spec.name!r}: a message of {nbytes} bytes is more than one grpc "
                f"call carries ({self.content_limit} bytes: protobuf's 2 GiB limit); it was not "
                "sent. Write it over grpc-stream, tcp or shm, or in parts (register_parts)"
            )

    def _send(self, array: np.ndarray[Any, Any], deadline: float | None) -> None:
        self._channel.check_peer()
        self._check_fits(array.nbytes)
        seq = self.next_seq
        msg = pb.TensorProto(
            token=self._channel.token,
            generation=self._channel.generation,
            tensor_id=self._tid,
            seq=seq,
            dtype=array.dtype.str,
            shape=array.shape,
            dynamic=self.spec.dynamic,
            tensor_content=array.tobytes(),
        )
        self._channel.call(
            self._channel.stub.Write,
            msg,
            self._timeout(deadline),
            small=array.nbytes <= ONE_CALL_BYTES,
        )
        self.next_seq = seq + 1

    def write(self, array: np.ndarray[Any, Any], deadline: float | None) -> None:
        self._send(array, deadline)

    def acquire(self, shape: tuple[int, ...], deadline: float | None) -> np.ndarray[Any, Any]:
        self._deadline = deadline
        nbytes = int(np.prod(shape)) * self.spec.dtype.itemsize
        self._check_fits(nbytes)
        if self._staging is None:
            self._staging = np.empty(self.spec.max_bytes, dtype=np.uint8)
        return self._staging[:nbytes].view(self.spec.dtype).reshape(shape)

    def commit(self, shape: tuple[int, ...]) -> None:
        assert self._staging is not None
        nbytes = int(np.prod(shape)) * self.spec.dtype.itemsize
        self._send(self._staging[:nbytes].view(self.spec.dtype).reshape(shape), self._deadline)


class GrpcStreamWriter(GrpcWriter):
    content_limit = None  # 1 MiB chunks

    def _send(self, array: np.ndarray[Any, Any], deadline: float | None) -> None:
        self._channel.check_peer()
        seq = self.next_seq
        payload = array.reshape(-1).view(np.uint8).data
        header = wire.encode_data_header(
            wire.DataHeader(
                self._tid,
                0,  # the receiver picks the slot
                self._channel.generation,
                seq,
                len(payload),
                array.shape if self.spec.dynamic else None,
            )
        )

        if len(payload) <= ONE_CALL_BYTES:  # one call (module docstring); bytes, for grpcio
            request = b"".join((self._channel.token, header, payload))
            self._channel.call(self._channel.one_call, request, self._timeout(deadline), small=True)
        else:

            def chunks() -> Iterator[bytes]:
                yield self._channel.token + header
                for off in range(0, len(payload), CHUNK):
                    yield bytes(payload[off : off + CHUNK])  # grpcio takes only bytes: one copy

            self._channel.call(self._channel.stream, chunks(), self._timeout(deadline))
        self.next_seq = seq + 1


def start_server(settings: ServerSettings, sink: DataSink) -> GrpcDataServer:
    """The receiving side of both baselines, as :mod:`tensorwire.transports` starts it."""
    return GrpcDataServer(settings.host, sink)
