"""The receiving endpoint: register tensors, publish their addresses, hand out landed tensors.

A :class:`Receiver` owns registered regions, a control-plane server (hello, address book, claims)
and the servers of the networked transports. Senders write into its slots one-sidedly; the receiver
learns that a message landed from the slot's sequence number and hands out a zero-copy read-only
view of the slot, which stays valid until :meth:`Receiver.release` returns the slot to the sender.

Each tensor has exactly one writer at a time: the sender that *claims* it (on its first write). A
claim ends with the sender's goodbye, its death (pidfd on this host, the data connection elsewhere)
or the receiver's close; a new sender may then claim the tensor and continues its sequence numbers.

:class:`Receiver` is a facade over one module per concern, sharing one
:class:`~tensorwire.receiver.state.ReceiverState` (identity, lock, closed):

* :mod:`~tensorwire.receiver.tensors`: the registry of tensors and the memory they live in;
* :mod:`~tensorwire.receiver.consumer`: wait, wait_any, release, drain, pending;
* :mod:`~tensorwire.receiver.sessions`: the control plane, one session per sender, and claims;
* :mod:`~tensorwire.receiver.landing`: where networked transports land payloads (the data sink);
* :mod:`~tensorwire.receiver.servers`: the data servers it runs, as the transport registry says.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .. import metrics
from ..auth import normalise_secret
from ..checks import MAX_SECONDS, check_amount, check_count, check_kind
from ..control import ControlServer
from ..cuda import parse_device
from ..curve import CurveKeys
from ..endpoint import (
    ipv6_hint,
    is_loopback_host,
    socket_host,
    split_endpoint,
    unresolvable_host,
)
from ..errors import AuthenticationError, SpecMismatchError, TensorWireError, TransportError
from ..heartbeat import check_seconds
from ..layout import MAX_DEPTH
from ..process import host_identity
from ..rdma import NixlOptions
from ..region import reap_stale_segments, shm_available
from ..resource import Resource
from ..spec import TensorSpec
from ..transports.base import ServerSettings
from .consumer import Consumer
from .info import checked_info
from .landing import Landing
from .servers import DataServers
from .sessions import SessionHandler
from .state import ReceiverState
from .tensors import TensorTable

log = logging.getLogger(__name__)

DEFAULT_BIND = "tcp://127.0.0.1:0"
DEFAULT_REGION_BYTES = 8 << 20


def _parse_bind(bind: str) -> tuple[str, str]:
    split = split_endpoint(bind)
    if split is None:
        raise TensorWireError(
            f"bind address must look like tcp://HOST:PORT (PORT 0 picks a free one), got {bind!r}"
            f"{ipv6_hint(bind)}"
        )
    host = split[0]
    data_host = socket_host(host)
    return host, data_host


class Receiver(Resource):
    """Registers tensors and receives one-sided writes into them.

    ``bind`` is the control-plane endpoint (``tcp://127.0.0.1:0`` picks a free loopback port; give a
    routable address to accept senders from other hosts). ``secret`` turns on HMAC authentication
    of every sender. ``ring`` is the default number of slots per tensor; None (the default) chooses
    by size: 2 (double buffering) from 512 KiB up, more for smaller tensors, 32 at 32 KiB and
    below (at most 1 MiB of slots a tensor), so that the credits in flight cover the time one
    takes to come back
    (:func:`tensorwire.layout.auto_depth`).
    Limits on what a peer can make it do: at most ``max_connections`` data connections, and a
    connection that stops in the middle of a frame is dropped after ``frame_timeout`` seconds (an
    idle one between frames is kept). Frame sizes are bounded by the registered specs. A sender
    silent for ``heartbeat_timeout`` seconds (senders heartbeat every few seconds on their own) is
    declared lost: waiters on its tensors get :class:`~tensorwire.errors.PeerLostError`.
    ``curve_keys`` (:func:`tensorwire.curve.load`) encrypts the control plane with ZeroMQ CURVE.
    A ``bind`` beyond loopback needs a ``secret`` (AuthenticationError otherwise), unless
    ``insecure=True`` accepts unauthenticated senders on a network you trust.
    ``grpc``: serve the gRPC baseline (``grpc``, ``grpc-stream``): ``None`` (the default) when
    grpcio is installed (``tensorwire[grpc]``), ``True`` always (an error without it), ``False``
    never. ``nixl``: serve the ``nixl`` (RDMA) transport. ``None`` (the default) serves it when
    NIXL is installed, starting its agent when the first sender attaches; ``True`` or a
    :class:`~tensorwire.rdma.NixlOptions` start it now (and fail if NIXL is missing); ``False``
    never serves it. ``shm``: keep the regions in shared memory (``/dev/shm``), so that senders
    on this host write them directly (the ``shm`` transport): ``None`` (the default) when
    ``/dev/shm`` is usable, ``True`` always (an error without it), ``False`` never. Without it
    the regions are this process's private memory, on transparent huge pages where the kernel
    allows; every other transport still reaches them, and ``nixl`` writes into them faster (a
    16 MiB write 1.45x on one host, BENCHMARKS.md, "Receiver memory"): the choice for a receiver
    whose senders are on other hosts.
    ``info``: facts about this receiver for its senders to read before they write
    (:meth:`Sender.receiver_info <tensorwire.Sender.receiver_info>`), names to a str, int, float,
    bool or None, at most 64 KiB encoded: a job's size, the settings its servers share. They
    ride in every sender's welcome, so every sender admitted reads them: no secrets there.
    """

    def __init__(
        self,
        bind: str = DEFAULT_BIND,
        *,
        secret: str | bytes | None = None,
        ring: int | None = None,
        region_bytes: int = DEFAULT_REGION_BYTES,
        name: str | None = None,
        grpc: bool | None = None,
        max_connections: int = 1024,
        frame_timeout: float = 30.0,
        heartbeat_timeout: float | None = 30.0,
        curve_keys: CurveKeys | None = None,
        nixl: bool | NixlOptions | None = None,
        shm: bool | None = None,
        insecure: bool = False,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        check_kind("bind", bind, (str,), "a str, tcp://HOST:PORT")
        check_kind("name", name, (str, type(None)), "a str or None")
        for switch, value in (("grpc", grpc), ("shm", shm)):
            check_kind(switch, value, (bool, type(None)), "True, False or None")
        check_kind(
            "nixl", nixl, (bool, NixlOptions, type(None)), "True, False, None or NixlOptions"
        )
        check_kind("insecure", insecure, (bool,), "True or False")
        check_kind(
            "curve_keys", curve_keys, (CurveKeys, type(None)), "tensorwire.curve.load(DIR) or None"
        )
        bind_host, data_host = _parse_bind(bind)
        published = checked_info(info)
        if shm and not shm_available():
            raise TransportError(
                "shm=True, but /dev/shm is missing or not writable here; pass shm=None to fall "
                "back to private memory (senders then come over tcp, nixl or grpc)"
            )
        if ring is not None:
            check_count("ring", ring, 1, MAX_DEPTH)
        check_count("region_bytes", region_bytes, 1)
        # 0 refused every data connection; a frame timeout of 0 or less gave a stalled peer
        # no bound at all (the socket's timeout off) or failed in the accept thread.
        check_count("max_connections", max_connections, 1)
        check_amount("frame_timeout", frame_timeout, positive=True, most=MAX_SECONDS)
        check_seconds("heartbeat_timeout", heartbeat_timeout)
        unresolvable = unresolvable_host(bind_host)
        if unresolvable is not None:
            raise TensorWireError(f"cannot bind {bind}: {unresolvable}")
        if secret is None and not insecure and not is_loopback_host(bind_host):
            raise AuthenticationError(
                f"bind {bind} accepts connections from other hosts, so a secret is required "
                "(secret=...), as the daemons require; pass insecure=True to accept "
                "unauthenticated senders on a network you trust"
            )
        self.name = name or f"receiver-{secrets.token_hex(3)}"
        self.generation: int = secrets.randbits(62) | 1
        self._state = ReceiverState(self.name, self.generation, host_identity())
        self._closed = False
        self._control: ControlServer | None = None
        settings = ServerSettings(
            host=data_host,
            loopback=is_loopback_host(bind_host),
            receiver_name=self.name,
            max_connections=max_connections,
            frame_timeout=frame_timeout,
            options={"nixl": nixl} if isinstance(nixl, NixlOptions) else {},
        )
        try:
            reaped = reap_stale_segments()
            if reaped:
                log.info("reaped %d shared-memory segments of dead receivers", len(reaped))
            # The data servers learn of every region as it is created; they start once the
            # landing they deliver into exists.
            self._servers = DataServers(settings)
            self._table = TensorTable(
                self._state,
                ring_depth=ring,
                region_bytes=region_bytes,
                shared=shm_available() if shm is None else shm,
                on_new_memory=self._servers.add_memory,
            )
            self._sessions = SessionHandler(
                self._state,
                self._table,
                self._servers,
                secret=normalise_secret(secret),
                heartbeat_timeout=heartbeat_timeout,
                info=published,
            )
            self._consumer = Consumer(self._state, self._table)
            self._sessions.on_drop = self._consumer.forget_ended_links
            self._landing = Landing(self._state, self._table, self._sessions)
            self._servers.start_configured({"grpc": grpc, "nixl": nixl}, self._landing)
            self._control = ControlServer(
                bind,
                self._sessions.handle,
                self._sessions.tick,
                name=f"tensorwire-control-{self.name}",
                curve_keys=curve_keys,
            )
        except BaseException:
            self.close()
            raise
        self.address: str = self._control.address
        metrics.watch(self)

    @property
    def info(self) -> dict[str, Any]:
        """What this receiver publishes about itself (``info=``), as its senders read it."""
        return dict(self._sessions.info)

    # ---------------------------------------------------------------------------------------
    # Registration (tensorwire.receiver.tensors)
    # ---------------------------------------------------------------------------------------

    def register(
        self,
        name: str,
        shape: Any,
        dtype: Any,
        *,
        max_bytes: int | None = None,
        ring: int | None = None,
        device: Any = "cpu",
    ) -> TensorSpec:
        """Preallocate slots for tensor ``name`` and publish its address to senders.

        A shape with ``None`` dimensions is dynamic and needs ``max_bytes`` (its capacity).
        ``device``: where the slots are, ``"cpu"`` (host memory) or a GPU (``"cuda"``,
        ``"cuda:1"``, a ``torch.device``; needs cupy, ``tensorwire[gpu]``). A GPU tensor's
        :meth:`wait` hands out a cupy array over the slot (``torch.from_dlpack`` takes it
        without a copy). ``ring``: its number of slots (default: the receiver's choice). Returns
        the registered :class:`TensorSpec`.
        """
        spec = TensorSpec.create(name, shape, dtype, max_bytes)
        self._table.register(spec, ring, parse_device(device))
        return spec

    def register_parts(
        self, name: str, shape: Any, dtype: Any, rows: list[int], *, device: Any = "cpu"
    ) -> list[TensorSpec]:
        """Register a static tensor as parts split along its first axis, stored back to back.

        Part ``k`` is a tensor of its own, named ``f"{name}@{k}"``, with ``rows[k]`` rows and one
        slot: each part may have its own writer (e.g. the parameter server shard that owns those
        rows), and :meth:`array` hands out the whole tensor as one read-only view of the slots the
        parts land in. This is how a model's parameters can *be* registered memory. A scalar
        (shape ``()``) is one part of one row: ``rows=[1]``. ``device`` as for :meth:`register`.
        """
        return self._table.register_parts(name, shape, dtype, rows, parse_device(device))

    def array(self, name: str) -> Any:
        """The whole of a tensor registered with :meth:`register_parts`, as one read-only view
        (a cupy array for a GPU tensor, which must not be written either).

        Its contents are whatever the parts' last messages put there; wait for each part's message
        before reading, and release the parts to let their writers send the next one.
        """
        return self._table.group(name)

    def register_many(
        self, specs: Iterable[TensorSpec | tuple[Any, ...]], *, device: Any = "cpu"
    ) -> list[TensorSpec]:
        """Register several tensors; each item a :class:`TensorSpec`, ``(name, shape, dtype)``
        or ``(name, shape, dtype, max_bytes)``, all on ``device`` (as for :meth:`register`).

        Every item is checked (its spec, a name given twice or registered already) before any
        is registered: a bad item raises :class:`SpecMismatchError` and registers none, as
        does memory that runs out part way (:class:`TransportError`)."""
        checked = [_spec_of(k, item) for k, item in enumerate(specs)]
        return self._table.register_many(checked, parse_device(device))

    @property
    def specs(self) -> dict[str, TensorSpec]:
        return self._table.specs()

    # ---------------------------------------------------------------------------------------
    # Waiting and releasing (tensorwire.receiver.consumer)
    # ---------------------------------------------------------------------------------------

    def wait(self, name: str, timeout: float | None = None) -> Any:
        """Wait for the next message of ``name``; return a read-only zero-copy view of it.

        ``timeout``: None blocks, 0 polls, a positive number is seconds
        (:class:`~tensorwire.errors.WireTimeoutError` when it runs out). The view is the slot
        itself (a :class:`~tensorwire.received.ReceivedArray`): it holds this message until
        :meth:`release` hands the slot back, and from then on the next message may overwrite it
        at any moment; copy what must outlive the release. Several threads may wait on one
        tensor: each message goes to exactly one of them. A GPU tensor's view is a cupy array
        over the slot (it cannot be marked read-only: do not write it).
        """
        return self._consumer.wait(name, timeout)

    def wait_any(self, timeout: float | None = None) -> tuple[str, Any]:
        """Wait for the next message of any tensor; return ``(name, view)``.

        Tensors are served round-robin so one busy sender cannot starve the others. Tensors whose
        slots are all held by the consumer are skipped until released.
        """
        return self._consumer.wait_any(timeout)

    def wait_all(self, names: Iterable[str], timeout: float | None = None) -> dict[str, Any]:
        """Wait until every tensor of ``names`` has its next message; return ``{name: view}``.

        All or nothing: the messages are taken together once all have landed, so when the wait
        raises (:class:`~tensorwire.errors.WireTimeoutError` at ``timeout`` for the whole set,
        :class:`~tensorwire.errors.PeerLostError` for a tensor whose writer was lost) none is
        taken. Each tensor is named once. The views are as :meth:`wait` gives; release them
        with :meth:`release_many`. Cheaper than a :meth:`wait` per tensor: the consumer wakes
        up for the set, not for each message.

        The next messages are not always one step's: a sender's ``write_many`` is one call,
        not one transaction, and a writer that died mid-batch leaves the messages it completed.
        After a :class:`~tensorwire.errors.PeerLostError`, :meth:`drain` what the lost writer
        left, or take the tensors it left a message ahead alone (:meth:`wait`) until they are
        in line, by a step number your messages carry (docs/design.md, "Batches").
        """
        return self._consumer.wait_all(names, timeout)

    def wait_each(
        self, names: Iterable[str], timeout: float | None = None
    ) -> Iterator[tuple[str, Any]]:
        """Yield ``(name, view)`` for the next message of each tensor of ``names``, in the order
        they land (each tensor once), to work on each as soon as it is there.

        ``timeout`` bounds the whole iteration, from the first message asked for. A message
        is taken when it is yielded; what was yielded before an error stays taken (release it).
        """
        return self._consumer.wait_each(names, timeout)

    def release_many(self, names: Iterable[str]) -> None:
        """:meth:`release` each of ``names`` (a name as often as it is given), checking them all
        first: if one holds no message, nothing is released. A networked sender gets all its
        credits of the batch at once."""
        self._consumer.release_many(names)

    def release(self, name: str) -> None:
        """Hand the oldest held slot of ``name`` back to its sender (one credit).

        For a GPU tensor, the work queued on the current CUDA stream (cupy's, or torch's where
        a torch stream of its own is current: :func:`tensorwire.cuda.current_stream`) is waited
        for first, as it may still read the slot; synchronise work on other streams before
        releasing.

        Safe from any thread; with several consumer threads on one tensor, each release hands
        back the oldest message still held, whichever thread took it. Never blocks: a credit the
        network cannot take at once is sent as soon as it can."""
        self._consumer.release(name)

    def drain(self, name: str) -> int:
        """Discard what a lost writer left behind in ``name``: every landed message not yet
        handed out, and the loss notice itself. Returns how many messages were dropped.

        Messages the consumer holds are not touched (release them first); the ring then stands
        empty for the next writer. The current writer is taken as gone, also where this
        receiver has not noticed yet (the application learnt it first, e.g. from its own sender
        to that process): the notice of its loss that this receiver would raise later is not
        raised, unless a message of it landed after the drain."""
        return self._consumer.drain(name)

    def pending(self, name: str) -> int:
        """How many messages of ``name`` have landed but not been handed out yet."""
        return self._consumer.pending(name)

    # ---------------------------------------------------------------------------------------
    # Lifetime
    # ---------------------------------------------------------------------------------------

    def _forked(self) -> None:
        state = self._state
        state.lock = threading.RLock()
        state.closed_because = self._forked_message()
        # close() does nothing here: the regions and sessions are the parent's
        state.closed = self._closed = True

    def close(self) -> None:
        """Stop serving, wake every waiter with ClosedError, unlink every region. Idempotent."""
        # Each part is closed if __init__ got as far as making it.
        state: ReceiverState | None = getattr(self, "_state", None)
        if state is None:
            return
        table: TensorTable | None = getattr(self, "_table", None)
        with state.lock:
            if state.closed:
                return
            state.closed = self._closed = True
            if table is not None:
                table.mark_closed()
                consumer = getattr(self, "_consumer", None)
                if consumer is not None:
                    consumer.let_waiters_leave(5.0)
        if self._control is not None:
            self._control.close()
        servers = getattr(self, "_servers", None)
        if servers is not None:
            servers.close()  # a server holding memory registrations drops them before unmapping
        sessions = getattr(self, "_sessions", None)
        if sessions is not None:
            sessions.close()
        if table is not None:
            table.close()

    def metric_gauges(self) -> Iterator[tuple[str, tuple[str, ...], float]]:
        """Its held slots and connected senders, for :mod:`tensorwire.metrics`."""
        with self._state.lock:
            if self._closed:
                return
            held = [(t.spec.name, t.consumed - t.released) for t in self._table.by_name.values()]
            connected = self._sessions.connected
        for name, n in held:
            yield "slots_held", (name,), float(n)
        yield "peers", ("receiver",), float(connected)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.specs)} tensors"
        return f"<Receiver {self.name} at {getattr(self, 'address', '?')} ({state})>"


def _spec_of(index: int, item: Any) -> TensorSpec:
    """Item ``index`` of :meth:`Receiver.register_many`, as a checked spec."""
    if isinstance(item, TensorSpec):
        return TensorSpec.create(
            item.name, item.shape, item.dtype, item.max_bytes if item.dynamic else None
        )
    if isinstance(item, (tuple, list)) and len(item) in (3, 4):
        return TensorSpec.create(*item)
    raise SpecMismatchError(
        f"register_many: item {index} must be a TensorSpec, (name, shape, dtype) or "
        f"(name, shape, dtype, max_bytes), got {item!r}"
    )
