"""The receiving endpoint: register tensors, publish their addresses, hand out landed tensors.

A :class:`Receiver` owns registered regions, a control-plane server (hello, address book, claims)
and the servers of the networked transports. Senders write into its slots one-sidedly; the receiver
learns that a message landed from the slot's sequence number and hands out a zero-copy read-only
view of the slot, which stays valid until :meth:`Receiver.release` returns the slot to the sender.

Each tensor has exactly one writer at a time: the sender that *claims* it (on its first write). A
claim ends with the sender's goodbye, its death (pidfd on this host, the data connection elsewhere)
or the receiver's close; a new sender may then claim the tensor and continues its sequence numbers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from . import wire
from .auth import client_mac, new_nonce, normalise_secret, server_proof, verify
from .control import ControlServer
from .curve import CurveKeys
from .doorbell import barrier_everywhere, deadline_of, ring_bell, wait_for
from .errors import (
    ClosedError,
    LocalProtocolError,
    PeerLostError,
    SpecMismatchError,
    TensorWireError,
    TransportError,
    UnknownTensorError,
)
from .layout import (
    OFF_DOORBELL,
    OFF_GENERATION,
    OFF_MAGIC,
    OFF_RX_WAITING,
    OFF_STATE,
    PAGE,
    REGION_CLOSED,
    REGION_HEADER_SIZE,
    REGION_MAGIC,
    REGION_OPEN,
    RingLayout,
    align,
    plan_parts,
    plan_ring,
    ring_footprint,
)
from .process import ProcessWatch, host_identity
from .rdma import NixlOptions, is_loopback_host
from .region import Region, reap_stale_segments, shm_available
from .resource import Resource
from .ring import RingMemory, SlotChooser
from .spec import TensorSpec
from .transports import SERVERS, TRANSPORTS
from .transports.base import CreditLink, DataServer, ServerSettings

log = logging.getLogger(__name__)

DEFAULT_BIND = "tcp://127.0.0.1:0"
DEFAULT_REGION_BYTES = 8 << 20


@dataclass(eq=False)
class _Session:
    """One sender, from its hello to its goodbye or death."""

    identity: bytes
    client: str
    pid: int
    host: str
    client_nonce: bytes
    server_nonce: bytes = b""
    authenticated: bool = False
    token: bytes = b""
    watch: ProcessWatch | None = None
    link: CreditLink | None = None
    link_server: str = ""  # the key of the data server that link belongs to
    claims: set[int] = field(default_factory=set)
    alive: bool = True
    dropped: str = ""  # why the session ended (once it has)
    last_seen: float = field(default_factory=time.monotonic)  # any message, frame or heartbeat

    def describe(self) -> str:
        return f"sender {self.client!r} (pid {self.pid})"


@dataclass(eq=False)
class _Tensor:
    """Receiver-side state of one registered tensor."""

    tensor_id: int
    spec: TensorSpec
    ring: RingMemory
    views: list[np.ndarray[Any, Any]] | None
    consumed: int = 0  # messages handed out by wait()
    released: int = 0  # messages handed back by release()
    owner: _Session | None = None
    transport: str = ""
    #: the writer stores into our memory and completes slots itself (shm), rather than one of
    #: our own threads doing it for the data it receives
    sender_completes: bool = False
    expected_seq: int = 1  # next sequence number a networked writer must send
    lost: str | None = None  # set when the owner died: the next wait() reports it
    epoch: int = 0  # claims granted so far; the ring's owner word holds the current one
    #: a shared-memory writer that was dropped while its process lived: it may be inside a write
    stale_writer: ProcessWatch | None = None
    #: the session whose payload is landing right now through one of our own threads
    inflight: _Session | None = None

    @property
    def slot_free(self) -> bool:
        """May the consumer take another message (it holds fewer than the ring's depth)?"""
        return self.consumed - self.released < self.ring.depth

    def wire_entry(self) -> list[Any]:
        return [self.tensor_id, self.spec.to_wire(), self.ring.layout.to_wire()]


def _parse_bind(bind: str) -> tuple[str, str]:
    try:
        parts = urlsplit(bind)
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "tcp" or not parts.hostname or port is None:
        raise TensorWireError(
            f"bind address must look like tcp://HOST:PORT (PORT 0 picks a free one), got {bind!r}"
        )
    host = parts.hostname
    data_host = "0.0.0.0" if host in ("*", "0.0.0.0") else host
    return host, data_host


class Receiver(Resource):
    """Registers tensors and receives one-sided writes into them.

    ``bind`` is the control-plane endpoint (``tcp://127.0.0.1:0`` picks a free loopback port; give a
    routable address to accept senders from other hosts). ``secret`` turns on HMAC authentication
    of every sender. ``ring`` is the default number of slots per tensor (2: double buffering).
    Limits on what a peer can make it do: at most ``max_connections`` data connections, and a
    connection that stops in the middle of a frame is dropped after ``frame_timeout`` seconds (an
    idle one between frames is kept). Frame sizes are bounded by the registered specs. A sender
    silent for ``heartbeat_timeout`` seconds (senders heartbeat every few seconds on their own) is
    declared lost: waiters on its tensors get :class:`~tensorwire.errors.PeerLostError`.
    ``curve_keys`` (:func:`tensorwire.curve.load`) encrypts the control plane with ZeroMQ CURVE.
    ``nixl``: serve the ``nixl`` (RDMA) transport. ``None`` (the default) serves it when NIXL is
    installed, starting its agent when the first sender attaches; ``True`` or a
    :class:`~tensorwire.rdma.NixlOptions` start it now (and fail if NIXL is missing); ``False``
    never serves it.
    """

    def __init__(
        self,
        bind: str = DEFAULT_BIND,
        *,
        secret: str | bytes | None = None,
        ring: int = 2,
        region_bytes: int = DEFAULT_REGION_BYTES,
        name: str | None = None,
        grpc: bool = True,
        max_connections: int = 1024,
        frame_timeout: float = 30.0,
        heartbeat_timeout: float | None = 30.0,
        curve_keys: CurveKeys | None = None,
        nixl: bool | NixlOptions | None = None,
    ) -> None:
        bind_host, data_host = _parse_bind(bind)
        if ring < 1:
            raise ValueError(f"ring must be at least 1, got {ring}")
        self._secret = normalise_secret(secret)
        self._ring_depth = ring
        self._heartbeat_timeout = heartbeat_timeout
        self._region_bytes = max(align(region_bytes, PAGE), 2 * PAGE)
        self.name = name or f"receiver-{secrets.token_hex(3)}"
        self.generation: int = secrets.randbits(62) | 1
        self._host = host_identity()
        self._lock = threading.RLock()
        self._closed = False
        self._active = 0  # threads inside wait(); close() lets them leave before unmapping
        self._idle = threading.Condition(self._lock)
        self._regions: list[Region] = []
        self._next_offset = 0
        self._tensors: dict[str, _Tensor] = {}
        self._groups: dict[str, np.ndarray[Any, Any]] = {}  # register_parts: name -> whole view
        self._by_id: dict[int, _Tensor] = {}
        self._order: tuple[_Tensor, ...] = ()
        self._rr = 0
        self._sessions: dict[bytes, _Session] = {}
        self._tokens: dict[bytes, _Session] = {}
        self._control: ControlServer | None = None
        self._servers: dict[str, DataServer] = {}  # the data servers running, by key
        self._on_demand: set[str] = set()  # servers started when the first sender attaches
        self._settings = ServerSettings(
            host=data_host,
            loopback=is_loopback_host(bind_host),
            receiver_name=self.name,
            max_connections=max_connections,
            frame_timeout=frame_timeout,
            options={"nixl": nixl} if isinstance(nixl, NixlOptions) else {},
        )
        # Per server: True (or options) starts it now, False never, None as the server prefers
        # (now, or on demand where its library is installed: decided once, as that does not
        # change while we run).
        wanted: dict[str, Any] = {"grpc": grpc, "nixl": nixl}
        try:
            reaped = reap_stale_segments()
            if reaped:
                log.info("reaped %d shared-memory segments of dead receivers", len(reaped))
            self._shared = shm_available()
            self._bell = self._new_region(self._region_bytes)
            for key, kind in SERVERS.items():
                setting = wanted.get(key)
                if setting is False:
                    continue
                if setting is None and kind.on_demand:
                    if kind.available():
                        self._on_demand.add(key)
                    continue
                self._start_server(key)
            self._control = ControlServer(
                bind,
                self._handle,
                self._tick,
                name=f"tensorwire-control-{self.name}",
                curve_keys=curve_keys,
            )
        except BaseException:
            self.close()
            raise
        self.address: str = self._control.address

    # ---------------------------------------------------------------------------------------
    # Registration
    # ---------------------------------------------------------------------------------------

    def _new_region(self, size: int) -> Region:
        region = Region.create(size, shared=self._shared)
        q = region.words64
        q[OFF_GENERATION // 8] = self.generation
        region.words32[OFF_STATE // 4] = REGION_OPEN
        q[OFF_MAGIC // 8] = REGION_MAGIC
        self._regions.append(region)
        self._next_offset = REGION_HEADER_SIZE
        for server in self._servers.values():
            server.add_region(region.address, region.size)
        return region

    def _start_server(self, key: str) -> DataServer:
        """Start data server ``key`` (registered in :mod:`tensorwire.transports`), with every
        region registered where it needs them."""
        server = SERVERS[key].start(self._settings, self)
        try:
            for region in self._regions:
                server.add_region(region.address, region.size)
        except BaseException:
            server.close()
            raise
        self._servers[key] = server
        return server

    def _server(self, key: str) -> DataServer:
        """The running data server ``key``, started now if it waits for its first sender."""
        server = self._servers.get(key)
        if server is not None:
            return server
        if key not in self._on_demand:
            raise TransportError(f"receiver {self.name} does not serve {key}")
        self._on_demand.discard(key)
        return self._start_server(key)

    def _reserve(self, need: int) -> tuple[Region, int]:
        """``need`` bytes in the last region (or a new one): the region and the base offset."""
        region = self._regions[-1]
        if self._next_offset + need > region.size:
            region = self._new_region(
                max(self._region_bytes, REGION_HEADER_SIZE + align(need, PAGE))
            )
        return region, self._next_offset

    def _add(self, spec: TensorSpec, region: Region, layout: RingLayout) -> _Tensor:
        layout = dataclasses.replace(layout, region=len(self._regions) - 1)
        self._next_offset = max(self._next_offset, align(layout.end, PAGE))
        ring_mem = RingMemory(spec, layout, region, self._bell)
        ring_mem.reset_slots()
        views = None
        if ring_mem.static_views is not None:
            views = []
            for v in ring_mem.static_views:
                ro = v.view()
                ro.flags.writeable = False
                views.append(ro)
        tensor = _Tensor(len(self._by_id) + 1, spec, ring_mem, views)
        self._tensors[spec.name] = tensor
        self._by_id[tensor.tensor_id] = tensor
        self._order = (*self._order, tensor)
        return tensor

    def _check_new(self, name: str) -> None:
        self._check_open()
        if name in self._tensors or name in self._groups:
            raise SpecMismatchError(f"tensor {name!r} is already registered")

    def register(
        self,
        name: str,
        shape: Any,
        dtype: Any,
        *,
        max_bytes: int | None = None,
        ring: int | None = None,
    ) -> TensorSpec:
        """Preallocate slots for tensor ``name`` and publish its address to senders.

        A shape with ``None`` dimensions is dynamic and needs ``max_bytes`` (its capacity).
        Returns the registered :class:`TensorSpec`.
        """
        spec = TensorSpec.create(name, shape, dtype, max_bytes)
        depth = self._ring_depth if ring is None else int(ring)
        if depth < 1:
            raise ValueError(f"ring must be at least 1, got {ring}")
        with self._lock:
            self._check_new(name)
            need = ring_footprint(depth, spec.max_bytes, spec.ndim, spec.dynamic)
            region, base = self._reserve(need)
            self._add(spec, region, plan_ring(base, depth, spec.max_bytes, spec.ndim, spec.dynamic))
        return spec

    def register_parts(
        self, name: str, shape: Any, dtype: Any, rows: list[int]
    ) -> list[TensorSpec]:
        """Register a static tensor as parts split along its first axis, stored back to back.

        Part ``k`` is a tensor of its own, named ``f"{name}@{k}"``, with ``rows[k]`` rows and one
        slot: each part may have its own writer (e.g. the parameter server shard that owns those
        rows), and :meth:`array` hands out the whole tensor as one read-only view of the slots the
        parts land in. This is how a model's parameters can *be* registered memory.
        """
        whole = TensorSpec.create(name, shape, dtype)
        dims = whole.static_shape
        if not dims or sum(rows) != dims[0] or any(r < 0 for r in rows) or not rows:
            raise SpecMismatchError(
                f"tensor {name!r}: parts of {rows} rows do not add up to the first dimension of "
                f"{whole.describe()}"
            )
        row_bytes = whole.max_bytes // dims[0] if dims[0] else 0
        parts = [
            TensorSpec.create(f"{name}@{k}", (r, *dims[1:]), dtype) for k, r in enumerate(rows)
        ]
        with self._lock:
            self._check_new(name)
            for part in parts:
                self._check_new(part.name)
            layouts = plan_parts(0, [r * row_bytes for r in rows], len(dims))
            region, base = self._reserve(layouts[-1].end)
            for part, layout in zip(
                parts, plan_parts(base, [p.max_bytes for p in parts], len(dims)), strict=True
            ):
                self._add(part, region, layout)
            start = self._tensors[parts[0].name].ring.layout.payloads[0]
            full = region.array[start : start + whole.max_bytes].view(whole.dtype).reshape(dims)
            full.flags.writeable = False
            self._groups[name] = full
        return parts

    def array(self, name: str) -> np.ndarray[Any, Any]:
        """The whole of a tensor registered with :meth:`register_parts`, as one read-only view.

        Its contents are whatever the parts' last messages put there; wait for each part's message
        before reading, and release the parts to let their writers send the next one.
        """
        self._check_open()
        try:
            return self._groups[name]
        except KeyError:
            raise UnknownTensorError(f"no tensor {name!r} was registered in parts") from None

    def register_many(self, specs: Iterable[TensorSpec | tuple[Any, ...]]) -> list[TensorSpec]:
        """Register several tensors; each item a :class:`TensorSpec` or ``(name, shape, dtype)``."""
        out = []
        for item in specs:
            if isinstance(item, TensorSpec):
                out.append(
                    self.register(
                        item.name,
                        item.shape,
                        item.dtype,
                        max_bytes=item.max_bytes if item.dynamic else None,
                    )
                )
            else:
                out.append(self.register(*item))
        return out

    @property
    def specs(self) -> dict[str, TensorSpec]:
        with self._lock:
            return {name: t.spec for name, t in self._tensors.items()}

    def _tensor(self, name: str) -> _Tensor:
        self._check_open()
        try:
            return self._tensors[name]
        except KeyError:
            raise UnknownTensorError(
                f"no tensor {name!r} is registered on {self.name}; registered: "
                f"{', '.join(sorted(self._tensors)) or 'none'}"
            ) from None

    # ---------------------------------------------------------------------------------------
    # Waiting and releasing
    # ---------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"receiver {self.name} is closed")

    def _next_slot(self, tensor: _Tensor) -> int | None:
        """The slot holding the tensor's next message, if complete. Raises for a lost owner."""
        slot = tensor.ring.find(tensor.consumed + 1)
        if slot >= 0:
            return slot
        if tensor.lost is not None:
            reason, tensor.lost = tensor.lost, None
            raise PeerLostError(f"tensor {tensor.spec.name!r}: {reason}")
        return None

    def _take(self, tensor: _Tensor, slot: int) -> np.ndarray[Any, Any]:
        """Hand out the next message, found in ``slot`` by :meth:`_next_slot`."""
        tensor.consumed += 1
        if tensor.views is not None:
            return tensor.views[slot]
        view = tensor.ring.view(slot)
        view.flags.writeable = False
        return view

    def _held_check(self, tensor: _Tensor) -> None:
        if not tensor.slot_free:
            raise TensorWireError(
                f"tensor {tensor.spec.name!r}: all {tensor.ring.depth} slots are held by the "
                "consumer; release() one before waiting for the next message"
            )

    def _block(
        self, check: Callable[[], Any], timeout: float | None, what: Callable[[], str], busy: bool
    ) -> Any:
        with self._lock:
            self._check_open()
            self._active += 1
        try:

            def guarded() -> Any:
                if self._closed:
                    raise ClosedError(f"receiver {self.name} was closed while waiting")
                return check()

            return wait_for(
                guarded,
                bell=self._bell.words32,
                bell_index=OFF_DOORBELL // 4,
                bell_address=self._bell.address + OFF_DOORBELL,
                flag=self._bell.words32,
                flag_index=OFF_RX_WAITING // 4,
                deadline=deadline_of(timeout),
                what=what,
                busy=busy,
            )
        finally:
            with self._lock:
                self._active -= 1
                self._idle.notify_all()

    def wait(self, name: str, timeout: float | None = None) -> np.ndarray[Any, Any]:
        """Wait for the next message of ``name``; return a read-only zero-copy view of it.

        ``timeout``: None blocks, 0 polls, a positive number is seconds
        (:class:`~tensorwire.errors.WireTimeoutError` when it runs out). The view stays valid until
        :meth:`release` hands its slot back to the sender. Several threads may wait on one tensor:
        each message goes to exactly one of them.
        """
        tensor = self._tensor(name)
        self._held_check(tensor)

        def ready() -> np.ndarray[Any, Any] | None:
            # Finding the message and taking it are one step under the lock, so two consumer
            # threads are never handed the same message.
            with self._lock:
                if not tensor.slot_free:  # another thread holds the last slot: wait for it
                    return None
                slot = self._next_slot(tensor)
                return None if slot is None else self._take(tensor, slot)

        view: np.ndarray[Any, Any] = self._block(
            ready,
            timeout,
            lambda: (
                f"tensor {name!r}: message {tensor.consumed + 1} did not arrive within "
                f"{timeout} s on {self.name}"
            ),
            busy=tensor.sender_completes,
        )
        return view

    def wait_any(self, timeout: float | None = None) -> tuple[str, np.ndarray[Any, Any]]:
        """Wait for the next message of any tensor; return ``(name, view)``.

        Tensors are served round-robin so one busy sender cannot starve the others. Tensors whose
        slots are all held by the consumer are skipped until released.
        """

        def ready() -> tuple[str, np.ndarray[Any, Any]] | None:
            with self._lock:  # the cursor and the take are shared by every consumer thread
                order = self._order
                n = len(order)
                for k in range(n):
                    tensor = order[(self._rr + k) % n]
                    if tensor.slot_free and (slot := self._next_slot(tensor)) is not None:
                        self._rr = (self._rr + k + 1) % n
                        return tensor.spec.name, self._take(tensor, slot)
                return None

        got: tuple[str, np.ndarray[Any, Any]] = self._block(
            ready,
            timeout,
            lambda: f"no message arrived within {timeout} s on {self.name}",
            busy=any(t.sender_completes for t in self._order),
        )
        return got

    def release(self, name: str) -> None:
        """Hand the oldest held slot of ``name`` back to its sender (one credit).

        Safe from any thread; with several consumer threads on one tensor, each release hands
        back the oldest message still held, whichever thread took it. Never blocks: a credit the
        network cannot take at once is sent as soon as it can."""
        with self._lock:
            tensor = self._tensor(name)
            if tensor.released >= tensor.consumed:
                raise TensorWireError(f"tensor {name!r}: no message is held, nothing to release")
            tensor.released += 1
            tensor.ring.release(tensor.released)
            owner = tensor.owner
            if owner is not None and owner.link is not None and not tensor.sender_completes:
                owner.link.send_credit(tensor.tensor_id, tensor.released)

    def drain(self, name: str) -> int:
        """Discard what a lost writer left behind in ``name``: every landed message not yet
        handed out, and the loss notice itself. Returns how many messages were dropped.

        Messages the consumer holds are not touched (release them first); the ring then stands
        empty for the next writer."""
        with self._lock:
            tensor = self._tensor(name)
            dropped = 0
            tensor.lost = None
            while tensor.slot_free and (slot := tensor.ring.find(tensor.consumed + 1)) >= 0:
                self._take(tensor, slot)
                self.release(name)
                dropped += 1
            return dropped

    def pending(self, name: str) -> int:
        """How many messages of ``name`` have landed but not been handed out yet."""
        tensor = self._tensor(name)
        return max(tensor.ring.last_complete() - tensor.consumed, 0)

    # ---------------------------------------------------------------------------------------
    # Control plane (runs on the control thread)
    # ---------------------------------------------------------------------------------------

    def _handle(self, identity: bytes, msg: wire.Message) -> wire.Message | None:
        with self._lock:
            if self._closed:
                return wire.ErrorReply("closed", "receiver is closing")
            if isinstance(msg, wire.Hello):
                return self._hello(identity, msg)
            session = self._sessions.get(identity)
            if isinstance(msg, wire.Auth):
                return self._auth(session, msg)
            if isinstance(msg, wire.Heartbeat):
                return self._heartbeat(msg)
            if session is None or not session.authenticated:
                return wire.ErrorReply("unauthenticated", "say hello (and authenticate) first")
            generation = getattr(msg, "generation", None)
            if generation != self.generation:
                return wire.ErrorReply(
                    "stale-generation",
                    f"generation {generation} is gone; the receiver restarted as {self.generation}",
                )
            if isinstance(msg, wire.Lookup):
                return self._address_book()
            if isinstance(msg, wire.Claim):
                return self._claim(session, msg)
            if isinstance(msg, wire.Attach):
                return self._attach(session, msg)
            session.last_seen = time.monotonic()
            if isinstance(msg, wire.Goodbye):
                self._drop_session(session, None)
                return wire.Ack(self.generation)
            return wire.ErrorReply("protocol", f"unexpected {msg.TYPE} message")

    def _heartbeat(self, msg: wire.Heartbeat) -> wire.Message:
        # Heartbeats come on the sender's own heartbeat socket, so the token, not the socket
        # identity, says which session is alive (and proves it was authenticated).
        session = self._tokens.get(msg.token)
        if session is None or not session.alive:
            return wire.ErrorReply("unauthenticated", "unknown session token")
        if msg.generation != self.generation:
            return wire.ErrorReply("stale-generation", f"generation {msg.generation} is gone")
        session.last_seen = time.monotonic()
        return wire.Ack(self.generation)

    def _hello(self, identity: bytes, msg: wire.Hello) -> wire.Message:
        old = self._sessions.get(identity)
        if old is not None:
            self._drop_session(old, "said hello again")
        session = _Session(identity, msg.client, msg.pid, msg.host, msg.nonce)
        self._sessions[identity] = session
        if self._secret is not None:
            session.server_nonce = new_nonce()
            return wire.Challenge(session.server_nonce)
        return self._welcome(session)

    def _auth(self, session: _Session | None, msg: wire.Auth) -> wire.Message:
        if session is None or self._secret is None or session.authenticated:
            return wire.ErrorReply("protocol", "unexpected auth message")
        expected = client_mac(self._secret, session.server_nonce, session.client_nonce)
        if not verify(expected, msg.mac):
            self._sessions.pop(session.identity, None)
            log.warning("refused %s: wrong secret", session.describe())
            return wire.ErrorReply("auth", "wrong secret")
        return self._welcome(session)

    def _welcome(self, session: _Session) -> wire.Message:
        session.authenticated = True
        session.token = secrets.token_bytes(wire.TOKEN_BYTES)
        self._tokens[session.token] = session
        if session.host == self._host:
            session.watch = ProcessWatch(session.pid)
        proof = b""
        if self._secret is not None:
            proof = server_proof(self._secret, session.server_nonce, session.client_nonce)
        transports: dict[str, Any] = {}
        for name, transport in TRANSPORTS.items():
            if transport.server is None and self._shared:
                transports[name] = {}  # the sender maps our regions by the address book's names
        for key, server in self._servers.items():
            transports[key] = server.details()
        for key in self._on_demand:
            transports[key] = {}  # its details come when the sender attaches
        log.debug("welcomed %s", session.describe())
        return wire.Welcome(
            self.generation, os.getpid(), self._host, proof, session.token, transports
        )

    def _address_book(self) -> wire.AddressBook:
        regions = [[r.name if r.name is not None else "", r.size] for r in self._regions]
        return wire.AddressBook(self.generation, regions, [t.wire_entry() for t in self._order])

    def _claim(self, session: _Session, msg: wire.Claim) -> wire.Message:
        tensor = self._by_id.get(msg.tensor_id)
        if tensor is None:
            return wire.ErrorReply("unknown-tensor", f"no tensor with id {msg.tensor_id}")
        transport = TRANSPORTS.get(msg.transport)
        if transport is None:
            return wire.ErrorReply("protocol", f"unknown transport {msg.transport!r}")
        owner = tensor.owner
        if owner is session:  # claimed again (a writer rebuilt): same claim, same epoch
            if tensor.inflight is None:
                tensor.expected_seq = max(tensor.ring.last_complete(), tensor.consumed) + 1
            return self._claimed(tensor)
        if owner is not None:
            return wire.ErrorReply(
                "busy", f"tensor {tensor.spec.name!r} is already written by {owner.describe()}"
            )
        if transport.same_host and (not self._shared or session.host != self._host):
            return wire.ErrorReply(
                "protocol", f"{msg.transport} claimed by a sender on another host"
            )
        key = transport.server
        if key is not None:
            if key not in self._servers and key not in self._on_demand:
                return wire.ErrorReply("protocol", f"this receiver does not serve {msg.transport}")
            if session.link is None or session.link_server != key:
                return wire.ErrorReply(
                    "protocol", f"open the {msg.transport} data connection first"
                )
        fenced = self._fenced(tensor)
        if fenced is not None:
            return wire.ErrorReply("fenced", f"tensor {tensor.spec.name!r}: {fenced}")
        tensor.epoch += 1
        tensor.ring.set_owner(tensor.epoch)
        tensor.owner = session
        tensor.transport = msg.transport
        tensor.sender_completes = key is None
        tensor.expected_seq = max(tensor.ring.last_complete(), tensor.consumed) + 1
        tensor.lost = None
        session.claims.add(tensor.tensor_id)
        return self._claimed(tensor)

    def _claimed(self, tensor: _Tensor) -> wire.Claimed:
        return wire.Claimed(
            self.generation,
            tensor.tensor_id,
            tensor.expected_seq,
            tensor.released,
            tensor.ring.slot_seqs(),
            tensor.epoch,
        )

    def _fenced(self, tensor: _Tensor) -> str | None:
        """Why the tensor cannot be claimed yet: its previous writer may still be storing into
        it. None when a new writer may start (and the ring is cleared for it)."""
        inflight = tensor.inflight
        if inflight is not None:
            return f"a message from {inflight.describe()} is still arriving"
        stale = tensor.stale_writer
        if stale is not None:
            # The dropped writer read the owner word before or after we cleared it: if before,
            # its WRITING announcement is visible once every CPU has passed a barrier.
            barrier_everywhere()
            if tensor.ring.writer_inside() and stale.alive():
                return (
                    f"its previous writer (pid {stale.pid}) was dropped in the middle of a write "
                    "and has not finished it (is it stopped?); it can be claimed once that write "
                    "ends or that process exits"
                )
            stale.close()
            tensor.stale_writer = None
        tensor.ring.clear_writer()  # a writer that died inside a write left its mark
        return None

    def _attach(self, session: _Session, msg: wire.Attach) -> wire.Message:
        """A sender joins a transport whose peers must know each other (``nixl``): its server
        takes the sender's details and hands ours back."""
        transport = TRANSPORTS.get(msg.transport)
        key = transport.server if transport is not None else None
        if key is None:
            return wire.ErrorReply("protocol", f"transport {msg.transport!r} has nothing to attach")
        if session.link is not None and session.link_server != key:
            return wire.ErrorReply(
                "protocol", f"{session.describe()} already has a data connection"
            )
        try:
            link, details = self._server(key).attach(session, msg.details)
        except TensorWireError as exc:
            return wire.ErrorReply("protocol", f"{msg.transport}: {exc}")
        session.link, session.link_server = link, key
        session.last_seen = time.monotonic()
        return wire.Attached(self.generation, details)

    def _drop_session(self, session: _Session, reason: str | None) -> None:
        """End a session; ``reason`` is None for a clean goodbye, else why it was lost."""
        if not session.alive:
            return
        session.alive = False
        session.dropped = reason or "said goodbye"
        if self._sessions.get(session.identity) is session:
            del self._sessions[session.identity]
        self._tokens.pop(session.token, None)
        writer_alive = session.watch is not None and session.watch.alive()
        if session.watch is not None:
            session.watch.close()
        if reason is not None and session.link is not None:
            session.link.cut()  # a networked writer learns at once that its session is over
        for server in self._servers.values():
            server.detach(session)
        for tid in session.claims:
            tensor = self._by_id[tid]
            if tensor.owner is session:
                tensor.owner = None
                tensor.ring.set_owner(0)  # fences a shared-memory writer out of the ring
                if reason is not None:
                    tensor.lost = f"{session.describe()} was lost: {reason}"
                    if tensor.sender_completes and writer_alive:
                        if tensor.stale_writer is not None:
                            tensor.stale_writer.close()
                        tensor.stale_writer = ProcessWatch(session.pid)
        session.claims.clear()
        if reason is not None:
            log.warning("%s lost: %s", session.describe(), reason)
            self._wake()

    def _tick(self) -> None:
        now = time.monotonic()
        with self._lock:
            for session in list(self._sessions.values()):
                if session.watch is not None and not session.watch.alive():
                    self._drop_session(session, "process exited")
                elif (
                    self._heartbeat_timeout is not None
                    and session.authenticated
                    and now - session.last_seen > self._heartbeat_timeout
                ):
                    self._drop_session(
                        session, f"silent for {now - session.last_seen:.1f} s (no heartbeat)"
                    )

    def _wake(self) -> None:
        bell = self._bell
        if not bell.closed:
            ring_bell(
                bell.words32,
                OFF_DOORBELL // 4,
                bell.address + OFF_DOORBELL,
                bell.words32,
                OFF_RX_WAITING // 4,
            )

    # ---------------------------------------------------------------------------------------
    # DataSink: what networked transports deliver into (runs on their threads)
    # ---------------------------------------------------------------------------------------

    def admit(self, token: bytes, generation: int, link: CreditLink, transport: str) -> object:
        with self._lock:
            session = self._tokens.get(token)
            if session is None or not session.alive:
                raise LocalProtocolError(f"{transport} connection presented an unknown token")
            if generation != self.generation:
                raise LocalProtocolError(
                    f"{transport} connection for stale generation {generation}"
                )
            if session.link is not None:
                raise LocalProtocolError(f"{session.describe()} already has a data connection")
            session.link = link
            known = TRANSPORTS.get(transport)
            session.link_server = (known.server if known is not None else None) or transport
            return session

    def await_slot(
        self, session: object, header: wire.DataHeader, deadline: float | None
    ) -> wire.DataHeader:
        assert isinstance(session, _Session)
        with self._lock:
            tensor = self._by_id.get(header.tensor_id)
            if tensor is None or tensor.owner is not session or not session.alive:
                return header  # begin_write says what is wrong
            if header.seq != tensor.expected_seq:
                return header
            ring = tensor.ring

        def check_peer() -> None:
            if self._closed:
                raise ClosedError(f"receiver {self.name} is closing")
            if not session.alive:
                raise PeerLostError(f"{session.describe()} was dropped ({session.dropped})")

        # On this server thread, as the shm writer waits in the sender: the ring's credit bell.
        # The consumer is a thread of this process: spinning would only take its core and GIL.
        ring.wait_credit(header.seq, deadline, check_peer, busy=False)
        with self._lock:
            slot = SlotChooser(ring.slot_seqs()).choose(tensor.released)
        return dataclasses.replace(header, slot=slot)

    def begin_write(self, session: object, header: wire.DataHeader) -> memoryview:
        assert isinstance(session, _Session)
        with self._lock:
            dst = self._begin_write(session, header)
            self._by_id[header.tensor_id].inflight = session
            return dst

    def _begin_write(self, session: _Session, header: wire.DataHeader) -> memoryview:
        if not session.alive:
            raise PeerLostError(
                f"{session.describe()} was dropped by the receiver ({session.dropped}); its "
                "claims are revoked"
            )
        tensor = self._by_id.get(header.tensor_id)
        if tensor is None or tensor.owner is not session:
            raise LocalProtocolError(
                f"write to tensor id {header.tensor_id} that this sender has not claimed"
            )
        ring = tensor.ring
        name = tensor.spec.name
        if header.generation != self.generation:
            raise LocalProtocolError(f"tensor {name!r}: write for stale generation")
        if header.seq != tensor.expected_seq:
            raise LocalProtocolError(
                f"tensor {name!r}: expected message {tensor.expected_seq}, got {header.seq}"
            )
        if header.slot >= ring.depth or ring.seq_at(header.slot) > tensor.released:
            raise LocalProtocolError(
                f"tensor {name!r}: message {header.seq} aimed at slot {header.slot}, which is not "
                f"free (depth {ring.depth}, released {tensor.released})"
            )
        if header.seq - tensor.released > ring.depth:
            raise LocalProtocolError(
                f"tensor {name!r}: message {header.seq} overruns the credits "
                f"(released {tensor.released}, depth {ring.depth})"
            )
        if tensor.spec.dynamic:
            if header.shape is None:
                raise LocalProtocolError(f"tensor {name!r} is dynamic but the header has no shape")
            try:
                nbytes = tensor.spec.check_shape(header.shape)
            except SpecMismatchError as exc:
                raise LocalProtocolError(str(exc)) from None
        elif header.shape is not None:
            # A static slot has no room for dims: honouring them would write past its header.
            raise LocalProtocolError(f"tensor {name!r} is static but the header carries a shape")
        else:
            nbytes = tensor.spec.max_bytes
        if header.nbytes != nbytes:
            raise LocalProtocolError(
                f"tensor {name!r}: header says {header.nbytes} bytes, the spec needs {nbytes}"
            )
        return ring.payload_bytes[header.slot][:nbytes].data

    def end_write(self, session: object, header: wire.DataHeader) -> None:
        assert isinstance(session, _Session)
        with self._lock:
            tensor = self._by_id[header.tensor_id]
            tensor.inflight = None
            if tensor.owner is not session:  # dropped while its payload was arriving
                raise PeerLostError(
                    f"{session.describe()} was dropped by the receiver ({session.dropped}) "
                    f"while message {header.seq} of {tensor.spec.name!r} was arriving; it was "
                    "not completed"
                )
            session.last_seen = time.monotonic()
            tensor.ring.publish(header.slot, header.seq, header.nbytes, header.shape)
            tensor.expected_seq = header.seq + 1

    def abort_write(self, session: object, header: wire.DataHeader) -> None:
        with self._lock:
            tensor = self._by_id.get(header.tensor_id)
            if tensor is not None and tensor.inflight is session:
                tensor.inflight = None

    def disconnected(self, session: object, reason: str | None) -> None:
        assert isinstance(session, _Session)
        with self._lock:
            for tensor in self._order:  # its thread has stopped writing: the slot is free again
                if tensor.inflight is session:
                    tensor.inflight = None
            session.link = None
            lost = None if reason is None or self._closed else f"data connection ended ({reason})"
            self._drop_session(session, lost)

    # ---------------------------------------------------------------------------------------
    # Lifetime
    # ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop serving, wake every waiter with ClosedError, unlink every region. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._regions:
                self._bell.words32[OFF_STATE // 4] = REGION_CLOSED
                self._wake()
            deadline = time.monotonic() + 5.0
            while self._active and time.monotonic() < deadline:
                self._idle.wait(0.05)
        if self._control is not None:
            self._control.close()
        for server in self._servers.values():
            server.close()  # a server holding memory registrations drops them before unmapping
        with self._lock:
            for session in list(self._sessions.values()):
                self._drop_session(session, None)
            self._groups.clear()
            for tensor in self._order:
                if tensor.stale_writer is not None:
                    tensor.stale_writer.close()
                    tensor.stale_writer = None
                tensor.views = None
                tensor.ring.static_views = None
                tensor.ring.payload_bytes = []
            self._order = ()
            self._tensors.clear()
            self._by_id.clear()
            for region in self._regions:
                region.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._tensors)} tensors"
        return f"<Receiver {self.name} at {getattr(self, 'address', '?')} ({state})>"
