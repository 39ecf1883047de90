"""The interface every transport implements, on both ends.

Sender side: a :class:`Channel` is one sender's data path to one receiver; it hands out a
:class:`TensorWriter` per tensor it has claimed. A writer knows the ring's remote address and
moves a payload into the next slot, honouring credits.

Receiver side: transports that need a server of their own (TCP, gRPC, NIXL) run a
:class:`DataServer`, which delivers into the receiver through a :class:`DataSink`, implemented by
the receiver: it admits connections by token, says where a payload must land, and completes the
slot afterwards. The shared-memory transport needs no server: the sender writes the receiver's
memory itself. Which transport is carried by which server is declared once, in
:mod:`tensorwire.transports`, for both ends.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from ..cuda import PinnedBuffer
from ..endpoint import is_wildcard_host
from ..errors import LocalProtocolError, PeerLostError, TransportError, WireTimeoutError
from ..layout import RingLayout
from ..memory import Memory, RegionInfo
from ..metrics import Traffic
from ..process import host_identity
from ..spec import TensorSpec
from ..wire import Attach, Attached, DataHeader, Message, Welcome


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One published tensor: the receiver's id for it, its spec and its remote address."""

    tensor_id: int
    spec: TensorSpec
    layout: RingLayout
    #: the CUDA device its slots are on at the receiver (None: host memory)
    device: int | None = None


@dataclass(slots=True)
class PeerInfo:
    """What a channel needs to reach a receiver: from the control plane's hello and lookup."""

    control_address: str
    control_host: str
    welcome: Welcome
    regions: list[RegionInfo]
    timeout: float | None
    #: a control-plane round trip to the receiver, for transports that must exchange details
    request: Callable[[Message, float | None], Message] | None = None
    #: the sender's NixlOptions (None: defaults)
    nixl: Any = None
    #: the sender's SplitCopier for large host copies (None: one thread copies)
    copier: Any = None
    #: raises PeerLostError once the receiver is known gone: its process exited (on this host,
    #: any time), or the heartbeats' verdict while the channel is being set up (afterwards they
    #: mark the channel); a wait for the receiver that calls it ends then, not at its timeout
    check: Callable[[], None] | None = None

    @property
    def same_host(self) -> bool:
        """Whether the receiver runs on this host (its welcome names our host identity)."""
        return self.welcome.host == host_identity()

    def data_endpoint(self, transport: str) -> tuple[str, int]:
        """Host and port of the receiver's data server for ``transport`` (from the welcome;
        asked for with an ``Attach`` where the welcome has none yet: a server the receiver
        starts when its first sender comes, which this request starts).

        A server bound to every interface is reached the way we reached the control plane.
        """
        details = self.welcome.transports.get(transport)
        if not isinstance(details, dict):
            offered = ", ".join(sorted(self.welcome.transports)) or "none"
            raise TransportError(
                f"receiver at {self.control_address} offers no {transport} port (it was made "
                f"without it, or lacks what it needs; it offers: {offered})"
            )
        if not details and self.request is not None:
            reply = self.request(Attach(self.welcome.generation, transport, {}), self.timeout)
            if not isinstance(reply, Attached):
                raise LocalProtocolError(
                    f"expected attached from {self.control_address}, got {reply.TYPE}"
                )
            details = reply.details
        host, port = details.get("host"), details.get("port")
        if host is None or (isinstance(host, str) and is_wildcard_host(host)):
            host = self.control_host
        if not isinstance(host, str) or not isinstance(port, int) or not 0 < port < 65536:
            raise LocalProtocolError(
                f"malformed {transport} details from the receiver: {details!r}"
            )
        return host, port


_UNREPORTED = Traffic()


#: The words every transport's loss says where the receiver ended this sender's session (a
#: revoked claim, a data connection it cut, its notice): the sender then asks the receiver why
#: (:meth:`tensorwire.sender.Sender.write`), which the data plane does not carry
ENDED_BY_RECEIVER = "the receiver ended this sender's session"


class GiveWay(Exception):
    """A wait for a slot, before that message moved (a write's, a ``buffer()`` block's before
    it opens, any of a batch's, those before it written), stepped aside: the sender asked it
    to (:attr:`Channel.give_way`), and another of its threads waits for the receiver meanwhile
    (a write of another tensor, a refresh). The sender lets that call go first and tries
    again. Without it a write waiting for a credit held every other call to its receiver, and
    a consumer that took tensors in a set order waited until a timeout for a write that could
    not start (test_threads.py, -k "gives_way or in_turn")."""


#: How often at most a wait for a slot that may give way looks whether another thread waits
#: for its receiver (seconds): the longest such a thread waits for it.
GIVE_WAY_EVERY = 0.02


def wait_giving_way(
    wait: Callable[[float | None], None],
    deadline: float | None,
    give_way: Callable[[], bool] | None,
) -> None:
    """``wait(deadline)``, a wait for a credit that raises WireTimeoutError at its deadline;
    where ``give_way`` is given, in turns of GIVE_WAY_EVERY, after each of which GiveWay is
    raised if ``give_way()`` says another thread waits for the receiver."""
    if give_way is None:
        wait(deadline)
        return
    while True:
        until = time.monotonic() + GIVE_WAY_EVERY
        if deadline is not None and deadline <= until:
            wait(deadline)
            return
        try:
            wait(until)
            return
        except WireTimeoutError:
            if give_way():
                raise GiveWay from None


class TensorWriter(ABC):
    """Writes successive messages of one tensor into the receiver's ring."""

    spec: TensorSpec
    next_seq: int  # sequence number the next message will carry
    #: ``write`` takes GPU (cupy) arrays itself; otherwise the sender hands it a host copy
    takes_device: ClassVar[bool] = False
    #: where its messages and credit waits are counted (the sender sets it on every writer it
    #: makes; a writer made outside a sender counts into this, which nothing reports)
    traffic: Traffic = _UNREPORTED

    @abstractmethod
    def write(self, array: Any, deadline: float | None) -> None:
        """Move ``array`` (already checked against the spec; a numpy array, or a cupy one when
        the writer ``takes_device``) into the next slot and complete it."""

    @abstractmethod
    def acquire(self, shape: tuple[int, ...], deadline: float | None) -> np.ndarray[Any, Any]:
        """Wait for a credit and return a writable array to fill for the next message."""

    @abstractmethod
    def commit(self, shape: tuple[int, ...]) -> None:
        """Complete the message filled through :meth:`acquire`."""

    def slot_free(self) -> bool:
        """Has the next message a free slot now, as far as this writer knows (nothing taken in,
        no wait)? gRPC's writers learn it only inside their call: True."""
        return True

    def await_slot(self, deadline: float | None) -> None:  # noqa: B027 - grpc: at the receiver
        """Wait until the next message has a free slot, taking nothing (a buffer() block, a
        batch, before any of their messages moves): where the channel asks it to, the wait
        gives way to another thread's call (GiveWay). gRPC's writers wait inside their call,
        at the receiver, and do not here."""

    def abort(self) -> None:  # noqa: B027 - most writers hold nothing between acquire and commit
        """Give up the message acquired through :meth:`acquire` (it is not sent)."""

    #: :meth:`write_now` can write (the sender keeps such a writer in its fast routes)
    writes_now: bool = False
    #: the class of GPU array :meth:`write_now` takes (cupy's ndarray); None: host arrays
    now_class: Any = None

    def write_now(self, array: Any, timeout: float | None) -> bool:
        """The fast path of ``Sender.write``: write ``array`` (a C-contiguous array of the
        spec's dtype and static shape, checked by the caller: a host array, or one of
        :attr:`now_class` where that is set) if that can be done at once.
        False: nothing was done (no credit, a claim revoked, a full socket, no fast path here);
        the caller then takes the general path, :meth:`write`, which waits or raises as it
        should. May raise PeerLostError, before anything is written. ``timeout`` (the write's,
        not yet a deadline) bounds only the rest of a message begun that cannot go at once (a
        ``tcp`` frame the socket took part of), which must be finished or the link cut."""
        return False

    _pinned: PinnedBuffer | None = None

    def on_host(self, array: Any) -> np.ndarray[Any, Any]:
        """``array`` in host memory, for a writer that sends from there (tcp, grpc): a GPU
        array is copied into a pinned staging buffer this writer keeps."""
        if isinstance(array, np.ndarray):
            return array
        if self._pinned is None:
            self._pinned = PinnedBuffer()
        return self._pinned.host_copy(array)


class Channel(ABC):
    """One sender's data path to one receiver."""

    transport: ClassVar[str]
    #: why the receiver is known to be gone (then every operation raises PeerLostError)
    lost: str | None = None
    #: set by the sender around a wait for a slot that may step aside (a write's, a block's
    #: before it opens, a batch's first) while it holds the receiver: says whether another
    #: thread waits for the receiver, so that the wait gives way to it (GiveWay); None: the
    #: wait is the call's alone
    give_way: Callable[[], bool] | None = None
    #: this side ended the session (a call interrupted in flight, whose outcome is unknown),
    #: while the receiver may well live: a goodbye is still owed to it, which releases the
    #: session's tensors for the next one (the sender's reconnect, or another sender)
    ended_here: bool = False

    def mark_lost(self, reason: str) -> None:
        """Called from the sender's heartbeat thread when the receiver stopped answering."""
        if self.lost is None:
            self.lost = reason

    def raise_if_lost(self) -> None:
        """Raise :class:`~tensorwire.errors.PeerLostError` once the receiver is known gone."""
        if self.lost is not None:
            raise PeerLostError(self.lost)

    @abstractmethod
    def writer(
        self, entry: TensorEntry, next_seq: int, released: int, slot_seqs: list[int], epoch: int
    ) -> TensorWriter:
        """A writer for a tensor this sender has claimed. The ring stands at ``next_seq`` with
        ``released`` messages released; ``slot_seqs`` is the message each slot holds; ``epoch``
        names the claim (a writer that writes the receiver's memory itself checks it, see
        :meth:`~tensorwire.ring.RingMemory.enter_write`)."""

    def write_batch(self, writes: list[tuple[TensorWriter, Any]], deadline: float | None) -> None:
        """Write several messages in order (each array already checked, on the host unless its
        writer ``takes_device``), all by ``deadline``. Transports that can move a batch for
        less than one write each (one doorbell, one syscall) override this."""
        for w, array in writes:
            w.write(array, deadline)

    def update_regions(self, regions: list[RegionInfo]) -> None:  # noqa: B027
        """The receiver registered more tensors (maybe in new regions)."""

    def tick(self) -> None:  # noqa: B027 - most channels do everything within their calls
        """From the sender's heartbeat thread, once an interval: work a channel owes even
        while its writers are idle (``shm``: ending writes whose GPU-made completion stores
        have landed since their writer's last call)."""

    def goodbye(self, timeout: float) -> bool:
        """End the session on the data plane, after every byte already sent has landed.

        Returns True when the transport said goodbye itself (so the control plane need not); a
        transport whose writes are complete when ``write`` returns has nothing to drain.
        """
        return False

    @abstractmethod
    def check_peer(self) -> None:
        """Raise :class:`~tensorwire.errors.PeerLostError` if the receiver is known to be gone."""

    def probe_peer(self) -> None:
        """:meth:`check_peer`, for a caller that asks with no write in hand whether the
        receiver is gone (``Sender.lost``): a channel whose data plane sees no hang-up by
        itself may send a small message that fails where the receiver died (rate-limited).
        Never waits."""
        self.check_peer()

    @abstractmethod
    def close(self) -> None:
        """Release everything the channel holds. Idempotent."""


def live_sink(ref: Callable[[], DataSink | None]) -> DataSink:
    """The receiver behind a transport server's weak reference, or ConnectionError once it is
    gone (servers hold receivers weakly, so that their threads never keep one alive)."""
    sink = ref()
    if sink is None:
        raise ConnectionError("receiver is gone")
    return sink


class CreditedChannel(Protocol):
    """Sender side of a networked transport: credits arrive as messages it must take in."""

    give_way: Callable[[], bool] | None

    def released(self, tensor_id: int) -> int:
        """Messages of ``tensor_id`` the receiver has released so far (as far as we know)."""

    def await_credit(
        self, tensor_id: int, at_least: int, deadline: float | None, what: Callable[[], str]
    ) -> None:
        """Take in credits until ``at_least`` are released; WireTimeoutError(what()) at the
        deadline."""


class CreditedWriter(TensorWriter):
    """A writer over a :class:`CreditedChannel`: a slot is free once the receiver's credit for
    the message that held it has come back."""

    _channel: CreditedChannel
    _tid: int  # the tensor's id at the receiver
    _depth: int  # slots in its ring

    def has_credit(self) -> bool:
        """May the next message be sent without waiting for a credit?"""
        return self._channel.released(self._tid) >= self.next_seq - self._depth

    def slot_free(self) -> bool:
        return self._channel.released(self._tid) >= self.next_seq - self._depth

    def await_slot(self, deadline: float | None) -> None:
        self.wait_credit(deadline)

    def wait_credit(self, deadline: float | None) -> None:
        """Block until the next message has a free slot (a wait is counted in ``traffic``)."""
        channel, tensor_id, next_seq, depth = self._channel, self._tid, self.next_seq, self._depth
        need = next_seq - depth
        if channel.released(tensor_id) < need:
            started = time.perf_counter()

            def what() -> str:
                return (
                    f"tensor {self.spec.name!r}: no free slot for message {next_seq}: the "
                    f"receiver has released {channel.released(tensor_id)} of {next_seq - 1} "
                    f"(ring depth {depth})"
                )

            wait_giving_way(
                lambda until: channel.await_credit(tensor_id, need, until, what),
                deadline,
                channel.give_way,
            )
            self.traffic.waited(time.perf_counter() - started)


#: How long a data server's thread leaves its messages to a consumer that has polled for them
#: itself (DataServer.poller), after its last poll, unless the consumer says it went to sleep
#: (seconds). Messages that nobody waits for are completed this much later at most. Not
#: shorter: on a 4 KiB nixl ping-pong between two processes on 2 cores, threads that took over
#: 100 µs after a consumer's last poll took cores from the writers (round trip 180 against
#: 94 µs). Not longer than CREDIT_DEFER_LIMIT: the tcp thread sends held-back credits.
CONSUMER_DRIVES = 1e-3
#: How often at most :meth:`Channel.probe_peer` sends or asks anything of a receiver (a nixl
#: ping, a gRPC call over an idle connection): ``Sender.lost()`` may be asked in a loop.
PROBE_EVERY = 1.0


class Poller(Protocol):
    """What a consumer waiting for a message calls while it spins (:meth:`DataServer.poller`)."""

    def __call__(self, rest: bool = False) -> bool:
        """Complete what has arrived; True if anything was. ``rest=True``: the consumer stops
        polling (it goes to sleep on the doorbell): the server's thread takes over at once."""


#: Longest a credit that a link holds back (``defer``) waits before it is sent anyway.
CREDIT_DEFER_LIMIT = 1e-3


class CreditLink(Protocol):
    """Receiver side: how a released slot's credit reaches a networked sender."""

    def send_credit(self, tensor_id: int, released: int, defer: bool = False) -> None:
        """Tell the sender that ``released`` messages of ``tensor_id`` are released. Never
        blocks the consumer: what cannot be sent now is sent as soon as it can. ``defer``: the
        consumer is about to release more, so the link may hold the credit back to send it
        with the next ones, or at the latest after :data:`CREDIT_DEFER_LIMIT` seconds (or when
        :meth:`send_credits` is called, with no credits, to send what is held)."""

    def send_credits(self, credits: list[tuple[int, int]], defer: bool = False) -> None:
        """Several ``(tensor_id, released)`` credits at once (a batch release), in as few
        messages as the transport allows, with anything held back; never blocks either."""

    def cut(self) -> None:
        """The receiver dropped the session: end its data path, so that the sender's next write
        fails with PeerLostError instead of landing."""


class DataSink(Protocol):
    """Receiver side: what a transport server delivers into (implemented by
    :mod:`tensorwire.receiver.landing`)."""

    def admit(self, token: bytes, generation: int, link: CreditLink, transport: str) -> object:
        """Check a data connection's token; return the session it belongs to, or raise."""

    def await_slot(self, session: object, header: DataHeader, deadline: float | None) -> DataHeader:
        """For writes that queue at the receiver (the gRPC baseline): wait until message
        ``header.seq`` has a free slot (WireTimeoutError at ``deadline``); return the header
        aimed at that slot."""

    def begin_write(self, session: object, header: DataHeader) -> memoryview:
        """Validate a header; return the exact bytes of the slot its payload must land in."""

    def land_copy(
        self,
        session: object,
        tensor_id: int,
        slot: int,
        generation: int,
        seq: int,
        payload: memoryview,
        bell: bool = True,
    ) -> bool:
        """A static tensor's whole frame, received into a buffer of the transport (a small
        ``tcp`` payload read ahead with its header): check the header's fields as
        :meth:`begin_write` checks a header, copy ``payload`` into the slot and complete it,
        as :meth:`end_write` does, in one call. False, with nothing done, where the slot cannot
        take the copy this way (GPU memory): the caller then goes the general way."""

    def arrived(self, session: object, header: DataHeader, nbytes: int) -> bool:
        """The first ``nbytes`` of the payload :meth:`begin_write` was asked for are there (a
        large payload, read in parts). True if the sink wants to hear of each further part: a
        GPU slot, whose bytes arrive in host staging, copies each part on while the next one is
        received. Called first with 0, to ask."""

    def end_write(self, session: object, header: DataHeader, bell: bool = True) -> None:
        """The payload is in the bytes :meth:`begin_write` gave: complete the slot, and ring the
        consumers' doorbell unless ``bell`` is False (the caller then calls :meth:`ring` soon,
        e.g. once for several messages that arrived together)."""

    def ring(self) -> None:
        """Ring the consumers' doorbell (after completions with ``bell=False``)."""

    def landed(self, session: object, header: DataHeader) -> None:
        """A one-sided write (NIXL) put the payload straight into the slot ``header`` aims at:
        check the header as :meth:`begin_write` does, then complete the slot."""

    def landed_fields(
        self, session: object, tensor_id: int, slot: int, generation: int, seq: int, nbytes: int
    ) -> None:
        """:meth:`landed` of a static tensor's header, from its fields (each ``nixl`` write's
        notification, read without building a header)."""

    def abort_write(self, session: object, header: DataHeader) -> None:
        """The payload will not be completed, and the caller has stopped writing into the slot
        (a stream cut short): the slot may serve another writer."""

    def disconnected(self, session: object, reason: str | None) -> None:
        """The session's data connection ended: cleanly after a goodbye (``reason`` None) or
        not."""


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """What a receiver tells the data servers it starts."""

    host: str  # the interface to bind ("0.0.0.0": every one)
    loopback: bool  # the receiver binds to loopback only
    receiver_name: str
    max_connections: int = 1024
    frame_timeout: float = 30.0
    #: per server key, its own options (``"nixl"``: a NixlOptions)
    options: Mapping[str, Any] = field(default_factory=dict)


class DataServer:
    """A receiver's server for networked transports. The defaults suit a server that needs
    neither registered memory nor an attach step (TCP, gRPC)."""

    def details(self) -> dict[str, Any]:
        """What the welcome publishes about it (host and port, or nothing)."""
        return {}

    def add_memory(self, memory: Memory) -> None:
        """The receiver registered a new span of memory: register it where the transport needs
        to (its library's memory registration)."""

    def attach(
        self, session: object, details: dict[str, Any]
    ) -> tuple[CreditLink | None, dict[str, Any]]:
        """A sender joins through the control plane (``Attach``): its link, and our details.
        No link: the attach only asked for the details (of a server started on demand, whose
        data connection then makes the link, as the welcome's details would have)."""
        raise LocalProtocolError("this transport has nothing to attach")

    def detach(self, session: object) -> None:
        """The session ended, for whatever reason: forget what the server holds for it."""

    def poller(self, link: CreditLink) -> Poller | None:
        """What a consumer waiting for a message of ``link``'s sender calls while it spins, so
        that the message is completed by the thread that wants it instead of being handed over
        by a wake-up from the server's thread (the hand-off costs more than a small message
        itself); the call returns True if it delivered anything, and is made with ``rest=True``
        when the consumer goes to sleep instead. None: the consumer just waits to be woken."""
        return None

    def close(self) -> None:
        """Stop serving; every thread ends. Idempotent."""
