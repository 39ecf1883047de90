"""The sending endpoint: resolve receivers' addresses, then write tensors one-sidedly into them.

A :class:`Sender` holds one connection (a *peer*) per receiver: a control-plane client that did the
hello (and authentication) and fetched the address book, and a transport channel that moves the
bytes. Writes are checked against the published spec on the sender, before any byte moves, so a bad
write never reaches the receiver's memory. The first write of a tensor claims it (the receiver
allows one writer per tensor at a time).
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from . import metrics, wire
from .auth import client_mac, new_nonce, normalise_secret, server_proof, verify
from .checks import check_kind, whole_number
from .control import ControlClient
from .cuda import cupy as cupy_module
from .doorbell import check_timeout, deadline_of, remaining
from .endpoint import ipv6_hint, split_endpoint
from .errors import (
    AuthenticationError,
    ClosedError,
    LocalProtocolError,
    PeerLostError,
    RemoteProtocolError,
    SpecMismatchError,
    TensorWireError,
    UnknownTensorError,
    WireTimeoutError,
)
from .heartbeat import Heartbeats, check_seconds, peers_of
from .layout import RingLayout
from .memory import RegionInfo
from .process import ProcessWatch, host_identity
from .rdma import NixlOptions
from .received import LentArray, ReceivedArray
from .resource import Resource
from .spec import TensorSpec, names_listed, shown_name
from .split_copy import SplitCopier, check_copy_threads
from .transports import check_name, choose, open_channel
from .transports.base import (
    ENDED_BY_RECEIVER,
    GIVE_WAY_EVERY,
    Channel,
    GiveWay,
    PeerInfo,
    TensorEntry,
    TensorWriter,
)

_DEFAULT: Any = object()


DEFAULT_TIMEOUT = 60.0
#: Seconds between heartbeats; a receiver that misses three in a row is declared lost.
DEFAULT_HEARTBEAT = 5.0
#: How long close() waits for a receiver to confirm that everything sent has landed.
GOODBYE_TIMEOUT = 5.0
#: How long a sender whose session the receiver ended waits for the receiver's reason for it
#: (one round trip to a live receiver; a gone one leaves the loss as the data plane said it)
WHY_TIMEOUT = 0.5
#: How long close() lets a write in another thread finish before it interrupts it.
CLOSE_INTERRUPT = 0.2
#: How many sessions removed without a goodbye a sender remembers, to end each first when it
#: connects to its receiver again (the oldest are forgotten)
LEFT_KEPT = 256
#: How many times a call looks a tensor up again where the receivers' address books changed
#: (another thread's refresh, reconnect, add_peer, remove_peer) before it held its receiver
ROUTE_TRIES = 16
#: Pause between claims of a tensor the receiver fences (its dropped writer is mid-write).
CLAIM_RETRY = 0.05
#: Pause between attaches to a receiver whose data server for the transport is still starting.
SETUP_RETRY = 0.02


class WriteHandle(NamedTuple):
    """What a write did: the tensor, the message's sequence number and its byte count.

    A write is complete when :meth:`Sender.write` returns, on every transport: the source array
    may be reused at once. How far the message got by then is the transport's: ``shm`` has
    completed it in the receiver's slot, ``grpc`` and ``grpc-stream`` have had the receiver's
    answer once it completed it there, ``tcp`` has handed all its bytes to the kernel, and
    ``nixl`` has stored the payload in the receiver's slot and queued the notification that
    completes it (the receiver completes those two when they arrive: a sender killed meanwhile
    loses them, and its receiver says it was lost). There is nothing left to wait for, so the
    handle has no ``wait()``. (A named tuple: immutable, and a third of a frozen dataclass's
    cost to make, once per message.)
    """

    name: str
    seq: int
    nbytes: int


_new_tuple = tuple.__new__  # WriteHandle's fields, without its __new__ (half the cost)


class _Book(NamedTuple):
    """A receiver's address book as fetched: ``number`` orders it among the peer's."""

    number: int
    regions: list[RegionInfo]
    entries: dict[str, TensorEntry]


class _Peer:
    """One receiver as seen from this sender: control client, address book, data channel."""

    def __init__(
        self,
        address: str,
        *,
        transport: str,
        secret: bytes | None,
        timeout: float | None,
        client: str,
        curve_server_key: bytes | None = None,
        nixl: NixlOptions | None = None,
        copier: SplitCopier | None = None,
        welcomed: Callable[[], None] | None = None,
    ) -> None:
        split = split_endpoint(address)
        if split is None or split[1] == 0:
            raise TensorWireError(
                f"receiver address must look like tcp://HOST:PORT, got {address!r}"
                f"{ipv6_hint(address)}"
            )
        host = split[0]
        check_name(transport)
        self.address = address
        self.host = host
        self.requested = transport
        self._secret = secret
        self._timeout = timeout
        self._client = client
        #: held by a call that uses this receiver's session (a write, a claim, a reconnect, a
        #: buffer() block, taking an address book, the ending): one such call at a time, while
        #: calls to the sender's other receivers go on (Sender, "Locks")
        self.lock = threading.RLock()
        #: threads waiting for :attr:`lock` (Sender._hold): a write that holds it waiting for a
        #: credit gives way to them (transports.base.GiveWay)
        self.waiting: set[int] = set()
        self.control: ControlClient | None = None
        self.channel: Channel | None = None
        self.transport = ""
        self.entries: dict[str, TensorEntry] = {}
        self.writers: dict[int, TensorWriter] = {}
        self.generation = 0
        self.token = b""
        # how long the receiver keeps a silent session (None: for ever): the heartbeats come
        # at least three times in that span, whatever the sender's own interval
        self.heartbeat_timeout: float | None = None
        #: what the receiver publishes about itself (Receiver(info=...)), from its welcome
        self.info: dict[str, Any] = {}
        self.curve_server_key = curve_server_key
        self.nixl = nixl
        self.copier = copier
        self.welcomed = welcomed  # called once a session is open (the heartbeats look at once)
        self._lost_counted = False  # this connection's loss is in the metrics
        #: the heartbeats' verdict on a receiver lost while the channel was being set up
        self.setup_lost: str | None = None
        #: why the set-up is given up (its sender was closed, or remove_peer named it,
        #: meanwhile): its waits end
        self.abandoned: str | None = None
        #: the receiver answers ClaimMany (one that predates it is asked one claim at a time)
        self.claims_many = True
        #: the receiver's process, where it is on this host (from its welcome to close)
        self._watch: ProcessWatch | None = None
        #: why the peer has no session: it was lost, and connecting to it again failed (a
        #: write's reconnect); None while it has one
        self.reconnect_failed: str | None = None
        #: the session lost before a reconnect (generation, token), until a new one is open:
        #: ended first by the receiver's next handshake (_end_left_session)
        self.left_behind: tuple[int, bytes] | None = None
        #: address books fetched, and the number of the one taken (fetch_book, take_book)
        self._books_fetched = 0
        self._book_taken = 0

    def others_waiting(self) -> bool:
        """Another thread waits for :attr:`lock`."""
        return bool(self.waiting)

    def note_lost(self) -> None:
        """Count this connection's loss once, however many writes and heartbeats see it."""
        if not self._lost_counted:
            self._lost_counted = True
            metrics.count("tensorwire_peers_lost_total", "sender")

    def open(
        self, connect_timeout: float | None = None, left: tuple[int, bytes] | None = None
    ) -> None:
        """(Re)connect: hello, authenticate, fetch the address book, open the data channel.

        ``connect_timeout`` bounds these steps (default: the sender's timeout). ``left``: the
        generation and token of this sender's earlier session with the receiver, which it left
        without a goodbye: ended first (:meth:`_end_left_session`)."""
        self.close_quietly()
        self.control = ControlClient(self.address, self.curve_server_key)
        self.setup_lost = None
        saved = self._timeout
        if connect_timeout is not None:
            self._timeout = check_timeout(connect_timeout)  # infinity: no bound
        try:
            if left is not None:
                self._end_left_session(*left)
            welcome = self._hello()
            self.generation = welcome.generation
            ms = welcome.heartbeat_timeout_ms
            self.heartbeat_timeout = ms / 1000 if ms > 0 else None
            if not all(isinstance(key, str) for key in welcome.info):
                raise LocalProtocolError(f"receiver at {self.address} sent malformed info")
            self.info = welcome.info
            if welcome.host == host_identity():
                self._watch = ProcessWatch(welcome.pid)
            self.token = welcome.token  # from here on the heartbeats keep the session alive
            # a control socket opened anew (a request went unanswered) goes on with this session
            self.control.resume = self._resume
            if self.welcomed is not None:
                self.welcomed()
            regions = self._lookup()
            info = PeerInfo(
                self.address,
                self.host,
                welcome,
                regions,
                self._timeout,
                self._request,
                self.nixl,
                self.copier,
                self.check_alive,
            )
            self.transport = choose(self.requested, info)
            self.channel = open_channel(self.transport, info)
            self._lost_counted = False
        except BaseException:
            self.close_quietly()
            raise
        finally:
            self._timeout = saved

    def check_alive(self) -> None:
        """Raise PeerLostError once the receiver is known gone: its process exited (on this
        host, any time), or, while the data channel is being set up, the heartbeats' verdict
        (afterwards they mark the channel). Waits that depend on the receiver (a set-up's, a
        goodbye's) end then, not at their timeouts."""
        if self.abandoned is not None:
            raise PeerLostError(self.abandoned)
        if self.setup_lost is not None and self.channel is None:
            raise PeerLostError(self.setup_lost)
        watch = self._watch
        if watch is not None and not watch.alive():
            raise PeerLostError(
                f"receiver at {self.address} (pid {watch.pid}) died"
                + (" while this sender connected" if self.channel is None else "")
            )

    def round_trip_deadline(self, deadline: float | None) -> float | None:
        """The deadline of a round trip to the receiver (a claim, a lookup) made by a call's
        ``deadline``: that, or the sender's timeout from now where there is none or it has
        passed (a write that polls, ``timeout=0``): a round trip never fits in none, and a
        caller polling again and again would never have it made."""
        if deadline is None or deadline <= time.monotonic():
            return deadline_of(self._timeout)
        return deadline

    def check_peer(self) -> None:
        """What a request to the receiver checks while it waits for the answer (a claim, a
        lookup): PeerLostError once the receiver is known gone, by its process (on this host)
        or by the data channel (a hang-up, the heartbeats' verdict). Before, a claim or a
        lookup over a channel that sees no hang-up (gRPC, NIXL) waited out its timeout for a
        receiver on this host whose process had exited."""
        self.check_alive()
        if self.channel is not None:
            self.channel.check_peer()

    def why_ended(self) -> str | None:
        """The receiver's own account of why it ended this session (its heartbeat timeout, the
        process it saw exit, ...), asked with the session's token as a heartbeat is, within
        WHY_TIMEOUT; None where it gives none (gone, closing, or it no longer remembers). The
        data planes carry only that it ended: a revoked claim, a cut connection, a notice."""
        control, token = self.control, self.token
        if control is None or not token:
            return None
        try:
            self.check_alive()
            control.request(wire.Heartbeat(self.generation, token), WHY_TIMEOUT, self.check_alive)
        except PeerLostError as exc:  # the receiver's "closed": what it remembers of the end
            return exc.reason or None
        except TensorWireError:
            return None
        return None  # (the session lives: the loss was this sender's own doing)

    def _request(self, msg: wire.Message, timeout: float | None) -> wire.Message:
        assert self.control is not None
        # A channel's own requests while it is set up end with the receiver's loss, and are
        # asked again while the receiver's server for it is still starting (StartingError).
        return self.control.request_until(
            msg,
            deadline_of(timeout),
            self.check_alive if self.channel is None else None,
            SETUP_RETRY,
        )

    def _hello(self) -> wire.Welcome:
        assert self.control is not None
        nonce = new_nonce()
        hello = wire.Hello(self._client, os.getpid(), host_identity(), nonce)
        # (check_alive: a sender closed meanwhile ends the wait for a receiver that is silent)
        reply = self.control.request(hello, self._timeout, self.check_alive)
        if isinstance(reply, wire.Challenge):
            if self._secret is None:
                raise AuthenticationError(
                    f"receiver at {self.address} requires a shared secret: give this sender "
                    "the receiver's (Sender(secret=...); the daemons take --secret-file or "
                    "TENSORWIRE_SECRET)"
                )
            server_nonce = reply.nonce
            mac = client_mac(self._secret, server_nonce, nonce)
            reply = self.control.request(wire.Auth(mac), self._timeout)
            if not isinstance(reply, wire.Welcome) or not verify(
                server_proof(self._secret, server_nonce, nonce), reply.proof
            ):
                raise AuthenticationError(f"receiver at {self.address} failed to prove the secret")
        elif self._secret is not None:
            raise AuthenticationError(
                f"receiver at {self.address} does not use a secret, but one was given: refusing to "
                "send to an unauthenticated receiver"
            )
        if not isinstance(reply, wire.Welcome):
            raise LocalProtocolError(f"expected welcome from {self.address}, got {reply.TYPE}")
        if len(reply.token) != wire.TOKEN_BYTES:
            raise LocalProtocolError(f"receiver at {self.address} sent a malformed token")
        return reply

    def _end_left_session(self, generation: int, token: bytes) -> None:
        """End this sender's earlier session with the receiver, left without a goodbye
        (``remove_peer(goodbye=False)``, or one the receiver did not take): moved to the new control
        socket by its token, as a session resumes, then said goodbye to, so that the receiver frees
        the tensors it held now. Before, it kept them until its heartbeat timeout (30 s by default),
        and the new session's claims were refused meanwhile, as "already written by" this very
        sender. One already over (dropped, or the receiver restarted) is left be."""
        assert self.control is not None
        try:
            self.control.request(wire.Resume(generation, token), self._timeout, self.check_alive)
            self.control.request(wire.Goodbye(generation), self._timeout, self.check_alive)
        except (PeerLostError, RemoteProtocolError):
            pass  # ("closed", "stale-generation": over already)

    def _resume(self) -> wire.Message:
        return wire.Resume(self.generation, self.token)

    def _lookup(self, timeout: float | None = _DEFAULT) -> list[RegionInfo]:
        """The receiver's address book, within ``timeout`` (default: the sender's timeout),
        taken as this peer's at once. A receiver that dies meanwhile never answers: as for a
        claim, :meth:`check_peer` (its pidfd on this host, the data channel's verdict) ends
        the wait; before, a lookup of a dead receiver waited out its whole timeout."""
        book = self.fetch_book(timeout, self.check_peer)
        self.take_book(book)
        return book.regions

    def fetch_book(self, timeout: float | None, check: Callable[[], None]) -> _Book:
        """The receiver's address book, within ``timeout`` (``_DEFAULT``: the sender's
        timeout), ``check`` called while it waits; not yet this peer's (:meth:`take_book`).
        Numbered in the order the receiver answered, under the control socket's turn: a
        thread that takes a book after another's takes the newer one."""
        control = self.control
        assert control is not None
        t = self._timeout if timeout is _DEFAULT else timeout
        deadline = deadline_of(t)
        with control.turn(deadline, check, wire.Lookup.TYPE, t):
            book = control.request(
                wire.Lookup(self.generation, compact=True), remaining(deadline), check
            )
            self._books_fetched += 1
            number = self._books_fetched
        if not isinstance(book, wire.AddressBook):
            raise LocalProtocolError(f"expected an address book, got {book.TYPE}")
        try:
            regions = [RegionInfo.from_wire(entry) for entry in book.regions]
            sizes = [r.size for r in regions]
            entries = {}
            for tid, spec_d, layout_w in book.tensors:
                spec = TensorSpec.create(
                    spec_d["name"],
                    spec_d["shape"],
                    spec_d["dtype"],
                    spec_d["max_bytes"] if None in spec_d["shape"] else None,
                )
                layout = RingLayout.from_wire(layout_w, sizes)
                if layout.capacity < spec.max_bytes:
                    raise LocalProtocolError(f"tensor {spec.name!r}: slot smaller than its spec")
                if regions[layout.region].on_device:
                    raise LocalProtocolError(f"tensor {spec.name!r}: its words are in GPU memory")
                payloads = regions[layout.payloads_in]
                device = payloads.device if payloads.on_device else None
                entries[spec.name] = TensorEntry(int(tid), spec, layout, device)
        except (TypeError, ValueError, KeyError) as exc:
            raise LocalProtocolError(f"malformed address book from {self.address}: {exc}") from exc
        return _Book(number, regions, entries)

    def take_book(self, book: _Book) -> None:
        """``book`` (:meth:`fetch_book`) is this peer's, unless a newer one is already (under
        the peer's lock: the channel's regions are the writes')."""
        if book.number > self._book_taken:
            self._book_taken = book.number
            self.entries = book.entries
            if self.channel is not None:
                self.channel.update_regions(book.regions)

    def refresh(self, timeout: float | None = _DEFAULT) -> None:
        self._lookup(timeout)  # (take_book gives the channel the regions)

    def writer(self, entry: TensorEntry, deadline: float | None = None) -> TensorWriter:
        """The tensor's writer, claiming the tensor first if we have not. While the receiver
        fences the tensor (its dropped previous writer may still be storing into it) the claim
        is retried until ``deadline`` (default: the sender's timeout). A deadline already
        reached (a write that polls, ``timeout=0``) gives the claim the sender's timeout: a
        round trip never fits in none, and a caller polling again and again would never
        have its claim made."""
        w = self.writers.get(entry.tensor_id)
        if w is None:
            assert self.control is not None and self.channel is not None
            deadline = self.round_trip_deadline(deadline)
            claim = wire.Claim(self.generation, entry.tensor_id, self.transport, placed=True)
            # A receiver that dies meanwhile never answers: check_peer (its pidfd on this
            # host, the data channel's verdict) ends the wait instead of the write's whole
            # timeout.
            claimed = self.control.request_until(claim, deadline, self.check_peer, CLAIM_RETRY)
            if not isinstance(claimed, wire.Claimed):
                raise LocalProtocolError(f"expected claimed, got {claimed.TYPE}")
            w = self._claimed(
                entry,
                claimed.next_seq,
                claimed.released,
                claimed.slots,
                claimed.epoch,
                claimed.layout,
                deadline=deadline,
            )
        return w

    def _claimed(
        self,
        entry: TensorEntry,
        next_seq: object,
        released: object,
        slots: object,
        epoch: object,
        layout: object = None,
        *,
        deadline: float | None = None,
    ) -> TensorWriter:
        """The writer of a claim the receiver granted (where its ring stands, as it said; and
        where it lies, where the receiver moved it since our address book was made)."""
        assert self.channel is not None
        if not (
            isinstance(next_seq, int)
            and isinstance(released, int)
            and isinstance(epoch, int)
            and isinstance(slots, list)
        ) or any(isinstance(x, bool) for x in (next_seq, released, epoch)):
            raise LocalProtocolError(f"claim of {entry.spec.name!r}: malformed answer")
        if layout:
            entry = self._placed(entry, layout, deadline)
        seqs = [int(x) for x in slots if isinstance(x, int)]
        if len(seqs) != entry.layout.depth:
            raise LocalProtocolError(f"claim of {entry.spec.name!r}: malformed slot list")
        w = self.channel.writer(entry, next_seq, released, seqs, epoch)
        w.traffic = metrics.traffic("sent", entry.spec.name, self.transport)
        self.writers[entry.tensor_id] = w
        return w

    def _placed(self, entry: TensorEntry, layout: object, deadline: float | None) -> TensorEntry:
        """``entry`` as the receiver places it now, its ring at ``layout`` (a claim's answer):
        the receiver moved the ring away from a `nixl` writer it dropped, which may
        still store into the old one (design.md, "One writer per tensor"). An address book
        older than the move is fetched again, by the claim's ``deadline`` (the sender's
        timeout where there is none, or it passed)."""
        name = entry.spec.name
        current = self.entries.get(name, entry)
        if current.layout.to_wire(compact=True) != layout:
            self.refresh(remaining(self.round_trip_deadline(deadline)))
            current = self.entries.get(name, entry)
            if current.layout.to_wire(compact=True) != layout:
                raise LocalProtocolError(
                    f"claim of {name!r}: the receiver's address book does not place it where "
                    "the claim's answer does"
                )
        if current.tensor_id != entry.tensor_id or current.spec != entry.spec:
            raise LocalProtocolError(f"claim of {name!r}: the tensor changed at the receiver")
        return current

    def claim_many(self, entries: list[TensorEntry], deadline: float | None) -> None:
        """Claim the tensors of ``entries`` this sender has no writer of, in one round trip per
        ``wire.MAX_CLAIMS`` (a batch's first writes claimed them one round trip each: 75 ms for
        200 tensors on one host). Each granted claim gets its writer; a refused one (busy,
        fenced, ...) is left to :meth:`writer`, whose own claim asks again or says why. A
        receiver that predates the message is asked one tensor at a time from then on."""
        todo = list({e.tensor_id: e for e in entries if e.tensor_id not in self.writers}.values())
        if len(todo) < 2 or not self.claims_many:
            return
        assert self.control is not None and self.channel is not None
        deadline = self.round_trip_deadline(deadline)
        for start in range(0, len(todo), wire.MAX_CLAIMS):
            chunk = {e.tensor_id: e for e in todo[start : start + wire.MAX_CLAIMS]}
            request = wire.ClaimMany(self.generation, list(chunk), self.transport, placed=True)
            try:
                reply = self.control.request_until(request, deadline, self.check_peer, CLAIM_RETRY)
            except RemoteProtocolError as exc:
                if exc.code == "protocol" and wire.ClaimMany.TYPE in str(exc):
                    self.claims_many = False  # "unknown control message type 'claim-many'"
                    return
                raise
            if not isinstance(reply, wire.ClaimedMany) or len(reply.claims) != len(chunk):
                raise LocalProtocolError(f"expected {len(chunk)} claims, got {reply.TYPE}")
            for item in reply.claims:
                tid = item[0] if isinstance(item, list) and item else None
                entry = chunk.get(tid) if isinstance(tid, int) else None
                if entry is None:
                    raise LocalProtocolError(
                        f"a claim-many answer names no tensor asked: {item!r:.80}"
                    )
                if len(item) in (5, 6):  # (6: with where the ring lies now, once moved)
                    self._claimed(entry, *item[1:], deadline=deadline)
                elif len(item) != 3:
                    raise LocalProtocolError(f"malformed claim-many answer: {item!r:.80}")

    def goodbye(self) -> bool:
        """End the session, within GOODBYE_TIMEOUT for the data plane's goodbye and the control
        plane's together; at once where the receiver is known gone. True where the receiver
        took the goodbye (the session ended cleanly)."""
        channel, control = self.channel, self.control
        if control is None or channel is None:
            return False
        deadline = time.monotonic() + GOODBYE_TIMEOUT

        def check() -> None:
            if not channel.ended_here:  # (else lost by our own doing: the receiver may live)
                channel.raise_if_lost()
            self.check_alive()

        try:
            check()
            if not channel.ended_here:
                channel.check_peer()
            if not channel.goodbye(GOODBYE_TIMEOUT):
                check()  # (the data plane's goodbye may have found the receiver gone)
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                control.request(wire.Goodbye(self.generation), left, check)
        except TensorWireError:
            return False  # the receiver is gone or not answering: nothing to say goodbye to
        return True

    def close_quietly(self) -> None:
        channel, self.channel = self.channel, None
        control, self.control = self.control, None
        watch, self._watch = self._watch, None
        self.writers = {}
        self.token = b""  # no session: the heartbeats pass this peer by until its next welcome
        if channel is not None:
            channel.close()
        if control is not None:
            control.close()
        if watch is not None:
            watch.close()


def _by_peer(
    planned: list[tuple[_Peer, TensorEntry, Any]], indices: Sequence[int]
) -> list[list[int]]:
    """The items ``indices`` (not none) of a batch, grouped by receiver, in order."""
    first = planned[indices[0]][0]
    if all(planned[k][0] is first for k in indices):
        return [list(indices)]
    by_peer: dict[int, list[int]] = {}
    for k in indices:
        by_peer.setdefault(id(planned[k][0]), []).append(k)
    return list(by_peer.values())


def _let_waiting_go(p: _Peer) -> None:
    """After a write gave way (GiveWay) and let ``p``'s lock go: until the threads that were
    waiting for it have taken it (GIVE_WAY_EVERY at most), so that the write, trying again, does
    not take it straight back."""
    waiting = set(p.waiting)
    until = time.monotonic() + GIVE_WAY_EVERY
    while waiting & p.waiting and time.monotonic() < until:
        time.sleep(1e-4)


def _books_kept_changing(what: str, doing: str) -> TensorWireError:
    """A call's route went stale ``ROUTE_TRIES`` times over (another thread's refreshes,
    reconnects, receivers added and removed): it gives up, saying so."""
    return TensorWireError(
        f"{what}: the receivers' address books changed {ROUTE_TRIES} times while this sender "
        f"{doing}"
    )


class _OnASenderToo:
    """``Sender.connect`` as a descriptor: on the class, the classmethod it wraps (a new sender,
    connected); on a sender (``tx.connect(address)``, as a socket is connected), that sender
    connects to one more receiver and returns itself (:meth:`Sender._connect_this`). Before,
    the classmethod ran there too: it made another sender, connected it and handed it back,
    and a caller who kept the first one (``tx = Sender(); tx.connect(address)``) wrote through
    a sender connected to nothing ("no receiver publishes tensor ...; published: none"),
    while the other one's threads and sockets lived on until it was collected."""

    def __init__(self, on_class: classmethod[Any, Any, Any]) -> None:
        self._on_class = on_class
        self.__doc__ = on_class.__doc__

    def __get__(self, obj: Sender | None, owner: type[Sender]) -> Any:
        if obj is None:
            return self._on_class.__get__(None, owner)
        return functools.partial(Sender._connect_this, obj)


class Sender(Resource):
    """Writes tensors into one or more receivers.

    ``transport``: ``"auto"`` (shared memory when the receiver is on this host, else TCP),
    ``"shm"``, ``"tcp"``, ``"nixl"`` (RDMA through NIXL, set up by ``nixl``, a
    :class:`~tensorwire.rdma.NixlOptions`) or the gRPC baselines ``"grpc"`` and
    ``"grpc-stream"``. ``timeout`` bounds every wait (connect, credits) unless a call says
    otherwise: None blocks, 0 polls, a positive number is seconds. Writes of a sender whose
    timeout is 0 poll for a free slot, while the round trips a receiver must answer (connecting,
    a tensor's first claim, :meth:`ping`) wait up to 60 s (``DEFAULT_TIMEOUT``). With
    ``reconnect=True`` a write that finds its receiver restarted re-resolves the address book
    once and retries.
    A background thread heartbeats every receiver every ``heartbeat`` seconds (None: never); a
    receiver that misses three in a row is declared lost. ``curve_server_key`` (the job's CURVE
    public key) encrypts the control plane towards receivers that serve it with CURVE.
    ``copy_threads``: how many threads copy one large ``shm`` write (from 16 MiB; parts of at
    least 8 MiB), the caller's among them. More than 1 can pay only where cores are free and one
    thread does not reach the memory's bandwidth; on the 2-core VM of BENCHMARKS.md it did not
    (the receiving process holds the other core). The sender starts the others once and stops
    them at :meth:`close`.

    Safe to call from several threads: calls to different receivers run at once, and those to
    one receiver take turns, each waiting for the other within its own timeout (a write
    waiting for a credit holds up only its own receiver's other calls); :meth:`ping` waits for
    no other call.
    """

    def __init__(
        self,
        *,
        transport: str = "auto",
        secret: str | bytes | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        reconnect: bool = False,
        name: str | None = None,
        heartbeat: float | None = DEFAULT_HEARTBEAT,
        curve_server_key: bytes | None = None,
        nixl: NixlOptions | None = None,
        copy_threads: int = 1,
    ) -> None:
        check_kind("reconnect", reconnect, (bool,), "True or False")
        check_kind("name", name, (str, type(None)), "a str or None")
        check_kind(
            "curve_server_key",
            curve_server_key,
            (bytes, type(None)),
            "bytes (tensorwire.curve.load(DIR).public) or None",
        )
        check_kind("nixl", nixl, (NixlOptions, type(None)), "NixlOptions or None")
        self._curve = curve_server_key
        self._nixl = nixl
        check_copy_threads(copy_threads)
        check_seconds("heartbeat", heartbeat)
        self._transport = check_name(transport)
        self._secret = normalise_secret(secret)
        self.timeout = check_timeout(timeout)
        # What a round trip the receiver must answer (the handshake, a tensor's claim, a ping)
        # waits: the sender's timeout, but a sender whose writes poll (0) cannot do one in
        # no time (before, its every claim timed out "within 0 s", and it never wrote).
        self._round_trip = DEFAULT_TIMEOUT if self.timeout == 0 else self.timeout
        self.reconnect = reconnect
        self.name = name or f"sender-{os.getpid()}-{secrets.token_hex(3)}"
        self._peers: dict[str, _Peer] = {}
        self._joining: dict[str, _Peer] = {}  # peers whose connection is being set up
        # (name, peer) -> where it goes; cleared whenever an address book changes.
        self._routes: dict[tuple[str, str | None], tuple[_Peer, TensorEntry]] = {}
        # name (peer=None), or (name, peer) -> (writer, shape, dtype, GPU array class or None,
        # its peer's lock): write()'s fast routes, for writers that can write at once
        # (TensorWriter.write_now), of host arrays or of the GPU arrays the writer names;
        # cleared with the routes, and at close.
        self._fast: dict[
            str | tuple[str, str],
            tuple[TensorWriter, tuple[Any, ...], np.dtype[Any], Any, threading.RLock],
        ] = {}
        #: writers (by id) with a buffer() block open, and the thread of each block: another
        #: message of their tensor from that thread before the block ends is refused (it took
        #: the block's slot or staging buffer, and a message was lost); another thread's waits
        #: for the block (which holds its receiver's lock)
        self._producing: dict[int, int] = {}
        #: sessions being ended (remove_peer), by address, each set once ended: a new session
        #: to the address waits for it (the old one's goodbye, or its note in ``_left``)
        self._endings: dict[str, threading.Event] = {}
        #: sessions removed without a goodbye (generation, token), by address: a new session to
        #: the address ends its old one first (_Peer._end_left_session)
        self._left: dict[str, tuple[int, bytes]] = {}
        self._left_lock = threading.Lock()  # (goodbye threads note theirs outside the lock)
        # Two kinds of lock. ``_lock`` guards the sender's own tables (peers, routes, fast
        # routes, handshakes under way) and is held for their look-ups and changes only, never
        # across a wait on a receiver. Each peer's ``lock`` (_Peer.lock) is held by the call
        # that uses the receiver's session (a write, its claim and reconnect, a buffer() block,
        # taking an address book, the goodbye): a write blocked on one receiver (no credit, a
        # full socket) holds up no call to the others, and a call waiting for a slot before
        # any of its messages moved steps aside for another thread's call to its own
        # (GiveWay). A thread may take ``_lock`` while it holds a peer's lock, never a peer's
        # lock while it holds ``_lock``; and it waits for a peer's lock within its call's
        # deadline (_hold).
        self._lock = threading.RLock()
        #: bumped (under ``_lock``) whenever the routes are forgotten, before the peer's lock
        #: of a change is let go: a route found at an epoch is still good where the epoch is
        #: the same once its peer's lock is held
        self._routes_epoch = 0
        #: told whenever a handshake of add_peer ends (a second add_peer of its address waits)
        self._joined = threading.Condition(self._lock)
        self._closed = False
        self._forked_away = False  # this is a forked child's copy (Resource._forked)
        self._heartbeat = heartbeat
        self._heartbeats: Heartbeats | None = None
        self._copier = SplitCopier(copy_threads, self.name) if copy_threads > 1 else None
        metrics.watch(self)

    @classmethod
    def connect(
        cls,
        address: str,
        *,
        transport: str = "auto",
        secret: str | bytes | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        reconnect: bool = False,
        name: str | None = None,
        heartbeat: float | None = DEFAULT_HEARTBEAT,
        curve_server_key: bytes | None = None,
        nixl: NixlOptions | None = None,
        copy_threads: int = 1,
        connect_timeout: float | None = None,
    ) -> Sender:
        """Create a sender connected to the receiver at ``address`` (more with
        :meth:`add_peer`); ``connect_timeout`` as there."""
        sender = cls(
            transport=transport,
            secret=secret,
            timeout=timeout,
            reconnect=reconnect,
            name=name,
            heartbeat=heartbeat,
            curve_server_key=curve_server_key,
            nixl=nixl,
            copy_threads=copy_threads,
        )
        try:
            sender.add_peer(address, connect_timeout=connect_timeout)
        except BaseException:
            sender.close()
            raise
        return sender

    if not TYPE_CHECKING:  # (checkers see the classmethod; a call on a sender returns it too)
        connect = _OnASenderToo(connect)

    def _connect_this(
        self,
        address: str,
        *,
        transport: str | None = None,
        connect_timeout: float | None = None,
        **made_with: Any,
    ) -> Sender:
        """``tx.connect(address)`` on a sender: :meth:`add_peer`, then this sender. The
        options a sender is made with cannot change here: naming one is refused, before
        anything connects."""
        if made_with:
            raise TypeError(
                f"connect() on a sender connects it to one more receiver (as add_peer does): "
                f"{', '.join(sorted(made_with))} cannot change here; give "
                f"{'it' if len(made_with) == 1 else 'them'} as the sender is made "
                "(tw.Sender(...), or tw.Sender.connect(address, ...), which makes one)"
            )
        self.add_peer(address, transport=transport, connect_timeout=connect_timeout)
        return self

    def add_peer(
        self, address: str, *, transport: str | None = None, connect_timeout: float | None = None
    ) -> None:
        """Connect to one more receiver (its tensors become writable by name).

        ``connect_timeout`` bounds the handshake alone (default: the sender's timeout, or 60 s
        where that is 0). Other threads' writes to the receivers already connected go on while
        it runs; a second call for the same address meanwhile returns with the first's session
        (or, where that fails, tries its own); :meth:`close` ends it with ClosedError."""
        if not isinstance(address, str):  # a list of receivers, say: one call each
            raise TypeError(
                f"address must be one receiver's 'tcp://HOST:PORT', got {type(address).__name__}"
                ": connect to one, then add_peer() each of the others"
            )
        if connect_timeout == 0:
            raise ValueError(
                "connect_timeout must be positive seconds or None: a handshake cannot be done "
                "in no time (a timeout of 0 is for writes that poll)"
            )
        check_timeout(connect_timeout)
        with self._lock:
            while True:
                self._check_open()
                ending = self._endings.get(address)
                if ending is not None:
                    if not ending.is_set():
                        # The old session ends (the receiver takes its goodbye, or it is noted
                        # for this handshake to end) before the receiver hears of the new one,
                        # which could not claim the tensors the old one holds. Bounded: an
                        # ending waits CLOSE_INTERRUPT for a write under way, and a goodbye
                        # takes GOODBYE_TIMEOUT. (Before, only a goodbye on a thread of its
                        # own was waited for: a handshake while a removal waited for its
                        # receiver's lock had its claims refused, "already written by" this
                        # very sender.)
                        self._lock.release()
                        try:
                            ending.wait()
                        finally:
                            self._lock.acquire()
                        continue
                    del self._endings[address]
                if address in self._peers:
                    return
                if address not in self._joining:
                    break
                # Another thread is connecting to it: its session serves this call too (where
                # it fails, this call tries on its own). Bounded by that one's handshake.
                self._joined.wait()
            if self._heartbeats is None and self._heartbeat:
                self._heartbeats = Heartbeats(
                    peers_of(self), self._heartbeat, name=f"tensorwire-heartbeat-{self.name}"
                )
            peer = _Peer(
                address,
                transport=transport or self._transport,
                secret=self._secret,
                timeout=self._round_trip,
                client=self.name,
                curve_server_key=self._curve,
                nixl=self._nixl,
                copier=self._copier,
                welcomed=None if self._heartbeats is None else self._heartbeats.poke,
            )
            # Heartbeated from the welcome on: opening a data channel can take longer than the
            # receiver waits for a silent session (creating NIXL agents on a GPU host: >1 s).
            self._joining[address] = peer
            with self._left_lock:
                left = self._left.pop(address, None)
        # The handshake runs outside the lock: it touches only the new peer, and takes up to
        # connect_timeout (a receiver that does not answer) or 0.1 s and more (NIXL agents and
        # their metadata). Under the lock, as before, every other thread's write to the
        # receivers already connected waited for it, and close() too.
        try:
            peer.open(connect_timeout, left)
        except BaseException:
            with self._lock:
                if left is not None:  # (maybe not ended: the next session to it tries again)
                    with self._left_lock:
                        self._left.setdefault(address, left)
                del self._joining[address]
                self._joined.notify_all()
                closed = self._closed
            if closed:
                raise ClosedError(
                    f"sender {self.name} was closed while it connected to {address}"
                ) from None
            raise
        with self._lock:
            del self._joining[address]
            self._joined.notify_all()
            closed, removed = self._closed, peer.abandoned
            if not closed and removed is None:
                self._peers[address] = peer
                # A name resolved before may now be published twice: resolved again, it is
                # refused as ambiguous, as it would be by a sender that connected to both at
                # once (before, writes without peer= went on to the receiver found first)
                self._forget_routes()
                metrics.count("tensorwire_peers_connected_total", "sender")
                return
        # Closed, or the receiver removed, as the handshake ended: the session it opened ends
        # here, as close() and remove_peer() end the others (a goodbye, bounded by
        # GOODBYE_TIMEOUT; the set-up's abandon no longer holds).
        peer.abandoned = None
        peer.goodbye()
        peer.close_quietly()
        if closed:
            raise ClosedError(f"sender {self.name} was closed while it connected to {address}")
        raise PeerLostError(removed)

    def remove_peer(self, address: str, *, goodbye: bool = True, wait: bool = True) -> None:
        """Disconnect from one receiver, saying goodbye if it is still there (up to 5 s for its
        answer). ``goodbye=False``: close at once, without it, as a caller that knows the receiver
        cannot answer and will not run again (a process it found frozen, while it stops) would; the
        receiver then sees the session end as a loss, not as a clean goodbye, and keeps the tensors
        it wrote claimed until its heartbeat timeout, or until this sender connects to it again
        (:meth:`add_peer` ends the old session first). ``wait=False``: say the goodbye on a thread
        of its own and return at once, for a caller whose other receivers must not wait for one that
        may be frozen: the goodbye reaches it, and ends the session cleanly, when it runs again. A
        new session to that address (:meth:`add_peer`) begins once the goodbye has ended, and
        :meth:`close` waits for such goodbyes still under way. A handshake with it under way
        (:meth:`add_peer` in another thread) is given up: that call raises PeerLostError, and the
        receiver is not a peer. A write to it in progress in another thread (blocked on a receiver
        that does not take its bytes, or waiting for a credit) is ended with PeerLostError, as
        :meth:`close` ends one, and it is not connected to again (``reconnect=True``)."""
        with self._lock:
            self._check_open()
            p = self._peers.pop(address, None)
            self._forget_routes()
            joining = self._joining.get(address)
            if joining is not None:  # (before, this waited for the handshake, then removed it)
                joining.abandoned = (
                    f"receiver at {address} was removed (remove_peer) while this sender "
                    "connected to it"
                )
            if p is None:
                return
            why = f"receiver at {address} was removed (remove_peer) during the write"
            # (those ended already go: one kept for each address ever removed grew with every
            # restarted worker a parameter server lost)
            for said in [a for a, e in self._endings.items() if e.is_set()]:
                del self._endings[said]
            ended = self._endings[address] = threading.Event()
            if goodbye and not wait:
                thread = threading.Thread(
                    target=self._end_peer,
                    args=(p, True, why, ended),
                    name=f"tensorwire-goodbye-{self.name}",
                    daemon=True,
                )
                try:
                    thread.start()
                except RuntimeError:  # no new threads (interpreter shutdown): said here
                    pass
                else:
                    return
        self._end_peer(p, goodbye, why, ended)

    def _end_peer(
        self, p: _Peer, goodbye: bool, why: str, ended: threading.Event | None = None
    ) -> None:
        """End the session of ``p``, no longer among the peers: a goodbye where ``goodbye`` (a
        session left without one is kept for the next handshake with its receiver to end),
        then its sockets closed. Under the peer's lock, so that no write is under way on the
        channel it closes; a write in another thread that holds it past ``CLOSE_INTERRUPT``
        (no credit, a full socket) is ended with PeerLostError (``why``) rather than waited
        for, and its receiver is not connected to again. ``ended`` is set once it is over."""
        try:
            if not p.lock.acquire(timeout=CLOSE_INTERRUPT):
                self._interrupt(p, why)
                p.lock.acquire()  # (the write sees the mark within the transports' 0.1 s)
            try:
                if not (goodbye and p.goodbye()):
                    self._note_left(p)
                p.close_quietly()
            finally:
                p.lock.release()
        finally:
            if ended is not None:
                ended.set()

    def _note_left(self, p: _Peer) -> None:
        """``p``'s session ends without a goodbye (none asked, or the receiver did not take
        it): kept for a new session to its address to end first (_Peer._end_left_session).
        A few bytes each, the oldest forgotten past LEFT_KEPT: the receiver drops it at its
        heartbeat timeout anyway."""
        if not p.token:
            return  # (no session)
        with self._left_lock:
            self._left[p.address] = (p.generation, p.token)
            while len(self._left) > LEFT_KEPT:
                del self._left[next(iter(self._left))]

    @property
    def peers(self) -> list[str]:
        return list(self._peers)

    def lost(self, peer: str | None = None) -> str | None:
        """Why ``peer`` (the only peer when omitted) is known to be gone: its process exited
        (on this host), it left its heartbeats unanswered, or it ended the session; None while
        it may still live. Never waits: what the heartbeats and the writes have seen so far, a
        look at the data channel (a tcp connection the receiver hung up) where no other call
        to the receiver holds it, and a look at the process where it is on this host."""
        p = self._peer(peer)
        channel = p.channel
        if channel is not None and channel.lost is not None:
            return channel.lost
        failed = p.reconnect_failed
        if failed is not None and channel is None:
            return failed
        try:
            p.check_alive()
        except PeerLostError as exc:
            return str(exc)
        if channel is None or not p.lock.acquire(False):
            return None
        # The data channel's own look at its receiver, unless a call holds the channel (it
        # meets the loss itself), after the look at its process (which says more where it
        # can): over tcp a receiver's hang-up is seen at once, as when its process was killed
        # on another host and its kernel closed the connection; over nixl a ping refused
        # (Channel.probe_peer, once a second at most). Before, lost() said nothing
        # until three heartbeats went unanswered (15 s at the default 5 s), and a parameter
        # server waited that long for a worker killed on another host before its first push.
        try:
            # (not one removed meanwhile, and closed since: its ending held this lock)
            if self._peers.get(p.address) is p and p.channel is channel:
                channel.probe_peer()
        except PeerLostError as exc:
            return channel.lost or str(exc)
        finally:
            p.lock.release()
        return None

    def transport_of(self, peer: str | None = None) -> str:
        """The transport actually used to reach ``peer`` (the only peer when omitted)."""
        return self._peer(peer).transport

    def tensors(self, peer: str | None = None) -> dict[str, TensorSpec]:
        """The tensors published by ``peer`` (by every connected receiver when omitted)."""
        peers = [self._peer(peer)] if peer is not None else list(self._peers.values())
        out: dict[str, TensorSpec] = {}
        for p in peers:
            out.update({name: e.spec for name, e in p.entries.items()})
        return out

    def refresh(self, peer: str | None = None, *, timeout: float | None = _DEFAULT) -> None:
        """Fetch the address book again from ``peer`` (every receiver when omitted): to see
        tensors registered since we connected. ``timeout`` bounds each receiver's answer (default:
        the sender's timeout; None: no bound); one that does not answer in time raises
        :class:`WireTimeoutError`. Other threads' writes go on while it waits, as for
        :meth:`ping`; taking a book waits for a call to its receiver under way in another
        thread (a write waiting for a credit), within ``timeout`` too, after the books of the
        receivers no call holds are taken."""
        if timeout is not _DEFAULT:
            timeout = check_timeout(timeout)
        with self._lock:
            peers = [self._peer(peer)] if peer is not None else list(self._peers.values())
        held: list[tuple[_Peer, ControlClient, _Book]] = []  # (taken last)
        for p in peers:
            # The round trip outside the lock (as ping's): other threads' writes go on
            # meanwhile, and close() or remove_peer() end it.
            with self._lock:
                self._check_open()
                control = p.control
            if control is None:
                continue  # (its reconnection failed: a write says so, and connects again)
            look = self._look_during(p, control, "refresh")
            try:
                book = p.fetch_book(timeout, look)
            except ClosedError:  # its control socket, closed by another thread meanwhile
                if self._peers.get(p.address) is p and p.control not in (control, None):
                    continue  # connected anew meanwhile (a write's reconnect): a book anew
                look()
                raise
            if p.lock.acquire(False):
                self._take_book(p, control, book)
            else:
                held.append((p, control, book))
        for p, control, book in held:
            # (by the sender's timeout where this call has none)
            self._hold(p, None if timeout in (_DEFAULT, None) else deadline_of(timeout), "refresh")
            self._take_book(p, control, book)

    def spec(self, name: str, *, peer: str | None = None) -> TensorSpec:
        return self._resolve(name, peer, connect=False)[1].spec

    def receiver_info(self, peer: str | None = None) -> dict[str, Any]:
        """What ``peer`` (the only receiver when omitted) publishes about itself
        (``Receiver(info=...)``), as its welcome said: read again at each reconnect; ``{}``
        from a receiver that publishes nothing."""
        return dict(self._peer(peer).info)

    # ---------------------------------------------------------------------------------------

    def _forget_routes(self) -> None:
        """An address book or a connection changed: resolve every name again (under the
        sender's lock, and under the lock of the peer that changed, where one did)."""
        self._routes.clear()
        self._fast.clear()
        self._routes_epoch += 1

    def _hold(self, p: _Peer, deadline: float | None, call: str = "write") -> None:
        """Take ``p``'s lock (the caller lets it go), waiting for a call to the receiver under
        way in another thread by ``deadline``; one already passed (a write that polls) waits
        up to the sender's timeout, as a round trip does. WireTimeoutError after that: the
        other call holds the receiver that long (a write waiting for a credit)."""
        lock = p.lock
        if lock.acquire(False):
            return
        deadline = p.round_trip_deadline(deadline)
        me = threading.get_ident()
        p.waiting.add(me)  # (a set's add and discard are atomic: no lock needed)
        try:
            wait = -1 if deadline is None else max(deadline - time.monotonic(), 0)
            if lock.acquire(timeout=wait):
                return
        finally:
            p.waiting.discard(me)
        raise WireTimeoutError(
            f"{call} to the receiver at {p.address}: another thread's call to it (an open "
            "buffer() block, a batch part way, a message under way) held it until this "
            "call's timeout"
        )

    def _check_open(self) -> None:
        if self._closed:
            if self._forked_away:
                raise ClosedError(self._forked_message())
            raise ClosedError(f"sender {self.name} is closed")

    def _forked(self) -> None:
        self._lock = threading.RLock()
        self._joined = threading.Condition(self._lock)
        self._joining = {}
        self._left = {}  # (the parent's sessions' tokens)
        self._endings = {}  # (set by the parent's threads, which are not here)
        self._left_lock = threading.Lock()
        self._forked_away = True
        self._closed = True  # close() does nothing here: a goodbye would end the parent's session
        self._routes = {}
        self._fast = {}  # write()'s fast routes skip the check of being open

    def _peer(self, address: str | None) -> _Peer:
        self._check_open()
        if address is None:
            peers = list(self._peers.values())  # (one read: ping() looks without the lock)
            if len(peers) != 1:
                raise TensorWireError(f"sender has {len(peers)} peers; name one with peer=")
            return peers[0]
        try:
            return self._peers[address]
        except KeyError:
            raise TensorWireError(f"not connected to {address}; connected: {self.peers}") from None

    def _resolve(
        self, name: str, peer: str | None, deadline: float | None = None, *, connect: bool = True
    ) -> tuple[_Peer, TensorEntry, int]:
        """The receiver that publishes ``name`` (``peer``, or the only one that does), its
        entry, and the routes' epoch it was found at; the address books are fetched again once
        where none does (it may have been registered since), by ``deadline`` (a write's), or
        within the sender's timeout where there is none or it has passed (as a claim: a round
        trip never fits in none). Before, always within the sender's timeout: a write given
        1 s to a receiver that no longer answered took 30 s. A receiver left without a session
        (lost, and connecting to it again failed) is connected to again here, unless
        ``connect`` is false (a look at its spec): before, every later write to it failed on
        an assertion. The sender's lock is held for the look-ups only: a fetch or a
        reconnect is made under its peer's lock alone, so the caller must hold no other
        peer's lock than ``peer``'s."""
        refreshed = False
        for _ in range(ROUTE_TRIES):
            with self._lock:
                self._check_open()
                epoch = self._routes_epoch
                route = self._routes.get((name, peer))
                if route is not None:
                    return route[0], route[1], epoch
                candidates = [self._peer(peer)] if peer is not None else list(self._peers.values())
                found = [(p, p.entries[name]) for p in candidates if name in p.entries]
                if len(found) > 1:
                    raise TensorWireError(
                        f"tensor {name!r} is published by several receivers "
                        f"({', '.join(p.address for p, _ in found)}); choose one with peer="
                    )
                if found:
                    p, entry = found[0]
                    if p.control is not None:
                        self._routes[(name, peer)] = found[0]
                        return p, entry, epoch
                    if not connect:  # (never a route: it would skip the reconnect below)
                        return p, entry, epoch
                    if not self.reconnect:
                        raise PeerLostError(
                            p.reconnect_failed or f"receiver at {p.address} has no session"
                        )
                elif refreshed:
                    known = {n for p in candidates for n in p.entries}
                    raise UnknownTensorError(
                        f"no receiver publishes tensor {shown_name(name)}; published: "
                        f"{names_listed(name, known)}"
                    )
            if found:  # its receiver, without a session: connected to again
                self._hold(p, deadline)
                try:
                    if p.control is None:
                        self._reopen_peer(p)  # (raises as it fails again)
                finally:
                    p.lock.release()
                continue
            refreshed = True  # the receiver may have registered it since we looked
            for p in candidates:
                self._look_up_again(p, name, deadline)
        raise _books_kept_changing(f"tensor {name!r}", "looked it up")

    def _look_up_again(self, p: _Peer, name: str, deadline: float | None) -> None:
        """Fetch ``p``'s address book again, as ``_resolve`` of ``name`` found it nowhere, by
        ``deadline`` (the sender's timeout where there is none or it passed). The round trip
        is made outside the locks; the book is taken under ``p``'s, but for a receiver that
        another thread's call holds (a write waiting for a credit) and whose book has not the
        name: this look-up does not wait for it. A receiver found lost is connected to again
        with ``reconnect``."""
        control = p.control
        if control is None:
            return  # no session (its reconnect failed): its book as it was
        round_trip = p.round_trip_deadline(deadline)
        try:
            book = p.fetch_book(remaining(round_trip), self._look_during(p, control, "look-up"))
        except (ClosedError, PeerLostError) as exc:
            if self._closed or self._peers.get(p.address) is not p or p.control is not control:
                return  # closed, removed or connected again by another thread meanwhile
            if isinstance(exc, ClosedError):
                raise
            p.note_lost()  # as a write that meets the loss
            if not self.reconnect:
                raise self._explained(exc, p) from None
            self._hold(p, round_trip, "look-up")
            try:
                if p.control is control:
                    self._reopen_peer(p)
            finally:
                p.lock.release()
            return
        if name in book.entries:
            self._hold(p, round_trip, "look-up")
        elif not p.lock.acquire(False):
            return
        self._take_book(p, control, book)

    def _take_book(self, p: _Peer, control: ControlClient, book: _Book) -> None:
        """``book`` becomes ``p``'s where its session is still the one ``control`` asked (the
        caller holds ``p``'s lock, let go here), the routes forgotten before it is."""
        try:
            if p.control is control:
                p.take_book(book)
                with self._lock:
                    self._forget_routes()
        finally:
            p.lock.release()

    def _deadline(self, timeout: float | None) -> float | None:
        return deadline_of(self.timeout if timeout is _DEFAULT else timeout)

    def write(
        self,
        name: str,
        array: Any,
        *,
        timeout: float | None = _DEFAULT,
        allow_copy: bool = False,
        peer: str | None = None,
    ) -> WriteHandle:
        """Write ``array`` one-sidedly into the next slot of tensor ``name``.

        The array must match the published dtype and shape exactly (a dynamic dimension may take
        any size within the capacity) and be C-contiguous, unless ``allow_copy=True``. Blocks while
        every slot is held by the receiver, up to ``timeout`` (0: raises WireTimeoutError at
        once; a tensor's first write still makes its claim, one round trip bounded by the
        sender's timeout).

        On return ``array`` may be reused, with one exception: a GPU array written over ``shm``
        into GPU slots on its own GPU (with ``TENSORWIRE_GPU_STREAM_STORES=0``, one of 32 MiB or
        more: :mod:`tensorwire.cuda_stores`) is copied asynchronously on the current CUDA stream
        (cupy's, or torch's where a torch stream of its own is current:
        :func:`tensorwire.cuda.current_stream`), and the message completes once the copy has
        landed. Work queued on that stream after this call sees the copy done, as with any
        asynchronous CUDA copy; another stream or the host must synchronise that stream before
        changing the array.
        """
        # The per-message path: every step below costs about what a small message's copy does,
        # so it takes the lock without ``with`` (half the cost) and makes the handle without
        # NamedTuple's argument parsing.
        # (a write naming its receiver has a fast route too: a receiver of many, say a
        # parameter server's workers, which publish the same names, is always named)
        key = name if peer is None else (name, peer)
        fast = self._fast.get(key)
        if (
            fast is not None
            and (
                array.__class__ is np.ndarray
                or array.__class__ is ReceivedArray
                or array.__class__ is fast[3]  # a GPU array of the class its writer takes
            )
            and array.shape == fast[1]
            and array.dtype == fast[2]
            and array.flags.c_contiguous
            # any other timeout (negative, NaN, a string, a bool) is refused below, by name
            and (
                timeout is _DEFAULT
                or timeout is None
                or ((timeout.__class__ is float or timeout.__class__ is int) and timeout >= 0)
            )
        ):
            # The fast route of a tensor written before: its checks above are the spec's
            # (a static tensor of this dtype and shape), and no deadline is needed
            # unless the writer must wait, which the general path below does (or, over
            # tcp, finish a frame the socket took part of: write_now makes that one); so
            # does a receiver another thread's call holds. Under the receiver's lock the
            # route is still the tensor's (routes are forgotten under it where they change).
            lock = fast[4]
            if lock.acquire(False):  # (not blocking=False: a keyword costs 0.2 us more)
                try:
                    if self._fast.get(key) is fast:
                        w = fast[0]
                        try:
                            done = w.write_now(
                                array, self.timeout if timeout is _DEFAULT else timeout
                            )
                        except PeerLostError:
                            done = False  # the general path meets it again, and handles it
                        if done:
                            counts = w.traffic
                            counts.messages += 1
                            nbytes = array.nbytes
                            counts.bytes += nbytes
                            return _new_tuple(WriteHandle, (name, w.next_seq - 1, nbytes))
                finally:
                    lock.release()
        deadline = self._deadline(timeout)
        tries = 0
        gave_way_to: _Peer | None = None
        while tries < ROUTE_TRIES:
            tries += 1
            if gave_way_to is not None:
                _let_waiting_go(gave_way_to)
                gave_way_to = None
            # The route cache read inline (the general path of every dynamic or GPU message,
            # and of nixl's larger ones): the epoch first, so that a route forgotten after it
            # is read fails the look under the receiver's lock below; a closed sender has none.
            epoch = self._routes_epoch
            route = self._routes.get((name, peer))
            if route is None:
                p, entry, epoch = self._resolve(name, peer, deadline)
            else:
                p, entry = route
            arr = entry.spec.check_array(array, allow_copy=allow_copy)
            lock = p.lock
            if not lock.acquire(False):
                self._hold(p, deadline)
            try:
                if epoch != self._routes_epoch:
                    continue  # its receiver's book or session changed meanwhile: again
                try:
                    w = p.writers.get(entry.tensor_id) or p.writer(entry, deadline)
                    if self._producing:
                        self._refuse_if_producing(w, name)
                    # its wait for a credit steps aside for another thread's call to this
                    # receiver (a write of another tensor, whose consumer may be next)
                    source = arr if w.takes_device else w.on_host(arr)
                    if self._giving_way(p, w.write, source, deadline):
                        tries -= 1  # (not a change of route)
                        gave_way_to = p
                        continue
                    if w.writes_now and fast is None:
                        with self._lock:
                            if epoch == self._routes_epoch:
                                self._fast[key] = (
                                    w,
                                    entry.spec.static_shape,
                                    entry.spec.dtype,
                                    w.now_class,
                                    lock,
                                )
                except PeerLostError as exc:
                    p.note_lost()
                    if not self.reconnect:
                        raise self._explained(exc, p) from None
                    p, entry = self._reopen(p, name)
                    arr = entry.spec.check_array(arr)
                    w = p.writer(entry, deadline)
                    w.write(arr if w.takes_device else w.on_host(arr), deadline)
                nbytes = arr.nbytes
                counts = w.traffic  # inline, not a method call
                counts.messages += 1
                counts.bytes += nbytes
                return _new_tuple(WriteHandle, (name, w.next_seq - 1, nbytes))
            finally:
                lock.release()
        raise _books_kept_changing(f"tensor {name!r}", "wrote it")

    def _explained(self, exc: PeerLostError, p: _Peer) -> PeerLostError:
        """``exc``, with why the receiver ended the session where it did (the loss names only
        what the writer saw: a revoked claim, a cut connection; the receiver is asked), and
        why an idle sender that sends no heartbeats loses its receiver."""
        text, why = str(exc), exc.reason  # (a refusal's text holds its reason already)
        if ENDED_BY_RECEIVER in text and why is None:
            why = p.why_ended()
            if why is not None:
                text = f"{text}. The receiver says: {why}"
        if self._heartbeat is None and p.heartbeat_timeout is not None:
            text = (
                f"{text}; this sender sends no heartbeats (heartbeat=None), and the receiver "
                f"ends a session silent for {p.heartbeat_timeout:g} s: give heartbeat= a "
                "number of seconds to keep an idle sender's sessions"
            )
        if text == str(exc):
            return exc
        return PeerLostError(text, tensor=exc.tensor, reason=why)

    def _reopen(self, p: _Peer, name: str) -> tuple[_Peer, TensorEntry]:
        """After a PeerLostError with ``reconnect``: reconnect to ``p`` and resolve ``name``
        at the restarted receiver (under ``p``'s lock)."""
        self._reopen_peer(p)
        return self._found_at(p, name)

    def _found_at(self, p: _Peer, name: str) -> tuple[_Peer, TensorEntry]:
        """``name``'s entry at ``p``, whose lock the caller holds (after its reconnect)."""
        q, entry, _ = self._resolve(name, p.address)
        if q is not p:  # (removed meanwhile, and added again by another thread)
            raise PeerLostError(
                f"receiver at {p.address} was removed (remove_peer) during the write"
            )
        return p, entry

    def _reopen_peer(self, p: _Peer) -> None:
        """After a PeerLostError with ``reconnect``: reconnect to ``p`` (its address book
        fetched afresh), under its lock; the routes are forgotten before it is let go."""
        if p.abandoned is not None:  # removed, or the sender closed, during the write
            raise PeerLostError(p.abandoned)
        try:
            said = False
            if p.channel is not None and p.channel.ended_here:
                # the receiver lives and still holds the session we ended: its tensors would
                # refuse the new session's claims ("already written by sender ...") until its
                # heartbeat timeout
                said = p.goodbye()
            if p.token and not said:
                # The receiver may still hold the session lost here (one frozen past this
                # sender's heartbeat verdict, not past its own timeout): the new session ends it
                # first. Before, over shm, the new session's claims were refused until then.
                p.left_behind = (p.generation, p.token)
            try:
                p.open(left=p.left_behind)
            except BaseException as exc:
                # The peer stays, without a session: the next write connects again (the
                # receiver may be back by then), and lost() and ping() say why it has none.
                p.reconnect_failed = (
                    f"receiver at {p.address} was lost, and connecting to it again failed: {exc}"
                )
                raise
            p.reconnect_failed = None
            p.left_behind = None
        finally:
            with self._lock:
                self._forget_routes()

    def write_many(
        self,
        items: Mapping[str, Any] | Iterable[tuple[str, Any] | tuple[str, Any, str | None]],
        *,
        timeout: float | None = _DEFAULT,
        allow_copy: bool = False,
        peer: str | None = None,
    ) -> list[WriteHandle]:
        """Write several tensors as one operation: ``{name: array}``, or ``(name, array)`` and
        ``(name, array, peer)`` items (``peer`` names the receiver of that item; the keyword
        gives the default).

        Every array is checked against its spec before any byte moves: one bad item raises
        :class:`~tensorwire.errors.SpecMismatchError` (or UnknownTensorError) and nothing is
        written. Then the messages are written in order, grouped by receiver, each group with
        the cost of one: ``shm`` rings the receiver's doorbell once for the group, ``tcp`` sends
        the group's headers and payloads in one ``sendmsg``, ``nixl`` waits for the WRITEs of
        up to 32 small payloads together and sends their headers in one notification.
        ``timeout`` bounds the whole call. A message waiting for its slot steps aside while
        another thread waits for the same receiver (the messages before it written; the rest
        follow once that thread's call is done). If a write fails (a receiver lost, no credit in
        time), the messages before it were written; with ``reconnect=True`` a lost receiver is
        reconnected and its whole group written again. Returns a handle per item, in order.
        """
        # The per-message path of training steps: a batch's cost per item is what this loop
        # and _write_group spend on it, so both stay lean (the route cache read inline, one
        # receiver without grouping, handles without NamedTuple's argument parsing).
        pairs = items.items() if isinstance(items, Mapping) else items
        self._check_open()
        deadline = self._deadline(timeout)
        routes = self._routes
        # (the routes read below are this epoch's, or it changed: each group's receiver,
        # once held, looks again, and the groups not written yet are planned again)
        epoch = self._routes_epoch
        planned: list[tuple[_Peer, TensorEntry, Any]] = []
        named: dict[int, str | None] = {}  # the items that name their receiver, by index
        for item in pairs:
            if not isinstance(item, (tuple, list)) or not 2 <= len(item) <= 3:
                # (an array of three or four elements would otherwise unpack as one)
                raise TypeError(
                    "write_many takes a mapping of names to arrays, or (name, array) or "
                    f"(name, array, peer) items; got an item of type {type(item).__name__}"
                    + (f" of {len(item)}" if isinstance(item, (tuple, list)) else "")
                )
            name = item[0]
            if len(item) > 2:
                where = named[len(planned)] = item[2]
            else:
                where = peer
            route = routes.get((name, where))
            p, entry = route if route is not None else self._resolve(name, where, deadline)[:2]
            if self._producing:  # before any item is written
                open_writer = p.writers.get(entry.tensor_id)
                if open_writer is not None:
                    self._refuse_if_producing(open_writer, name)
            planned.append((p, entry, entry.spec.check_array(item[1], allow_copy=allow_copy)))
        if not planned:
            return []
        groups = _by_peer(planned, range(len(planned)))
        handles: list[WriteHandle] = [None] * len(planned)  # type: ignore[list-item]
        for _ in range(ROUTE_TRIES):
            for g, indices in enumerate(groups):  # (g: where it stopped, below)
                receiver = planned[indices[0]][0]
                self._hold(receiver, deadline)
                held = True
                try:
                    if epoch != self._routes_epoch:
                        break  # a book or a session changed meanwhile: the rest planned again
                    todo, reopened = indices, False
                    while todo:
                        try:
                            todo = self._write_group(planned, todo, handles, deadline)
                        except PeerLostError as exc:
                            if reopened:
                                raise
                            receiver.note_lost()
                            if not self.reconnect:
                                raise self._explained(exc, receiver) from None
                            self._reopen_peer(receiver)
                            for k in indices:
                                _, entry, arr = planned[k]
                                p, entry = self._found_at(receiver, entry.spec.name)
                                planned[k] = (p, entry, entry.spec.check_array(arr))
                            todo, reopened = indices, True  # its whole group written again
                            continue
                        if todo:
                            # It gave way, a message waiting for its slot (the first, or part
                            # way, those before it written): another thread's call to the
                            # receiver goes first, then the rest of the group.
                            held = False
                            self._step_aside(receiver, deadline)
                            held = True
                            if epoch != self._routes_epoch:
                                groups[g] = todo  # (planned again below, as the groups after)
                                break
                    if todo:
                        break
                finally:
                    if held:
                        receiver.lock.release()
            else:
                return handles
            epoch = self._routes_epoch
            rest = [k for indices in groups[g:] for k in indices]
            for k in rest:
                _, entry, arr = planned[k]
                p, entry, _ = self._resolve(entry.spec.name, named.get(k, peer), deadline)
                planned[k] = (p, entry, entry.spec.check_array(arr))
            groups = _by_peer(planned, rest)
        raise _books_kept_changing("a batch", "wrote it")

    def _step_aside(self, p: _Peer, deadline: float | None) -> None:
        """(Holding ``p``'s lock, after a call gave way) let it go until the threads waiting
        for it have had it, then take it again; raises with the lock not held where
        ``deadline`` passes first."""
        p.lock.release()
        _let_waiting_go(p)
        self._hold(p, deadline)

    def _write_group(
        self,
        planned: list[tuple[_Peer, TensorEntry, Any]],
        indices: list[int],
        handles: list[WriteHandle],
        deadline: float | None,
    ) -> list[int]:
        """Write the items ``indices`` of ``planned`` (all to one receiver, under its lock) as
        one batch; the items not written where it gave way (GiveWay): a message waiting for a
        slot, the ones before it written, stepped aside as another thread waited for the
        receiver (the caller lets that thread go first, then writes the rest). Empty: all
        written."""
        p = planned[indices[0]][0]
        writers = p.writers
        writes = []
        claimed_together = False
        for k in indices:
            _, entry, arr = planned[k]
            w = writers.get(entry.tensor_id)
            if w is None:
                # a first write: the batch's first writes claim together, once (and only
                # then: a batch of tensors written before pays nothing for it); one refused
                # there is claimed alone, below
                if not claimed_together:
                    claimed_together = True
                    p.claim_many([planned[j][1] for j in indices], deadline)
                w = writers.get(entry.tensor_id) or p.writer(entry, deadline)
            writes.append((w, arr if w.takes_device else w.on_host(arr)))
        # Each message's sequence number: its writer's next one, after the writer's earlier
        # items of this batch (a tensor may appear more than once).
        seqs = [w.next_seq for w, _ in writes]
        if len({id(w) for w, _ in writes}) != len(writes):
            taken: dict[int, int] = {}
            for k, (w, _) in enumerate(writes):
                earlier = taken.get(id(w), 0)
                seqs[k] += earlier
                taken[id(w)] = earlier + 1
        channel = p.channel
        assert channel is not None
        done = len(writes)
        channel.give_way = p.others_waiting
        try:
            channel.write_batch(writes, deadline)
        except GiveWay:
            # Every transport's batch writes in order, and a message waits for its slot only
            # once those before it are out (published, sent, notified): they are the ones whose
            # writer has moved past them.
            done = 0
            while done < len(writes) and writes[done][0].next_seq > seqs[done]:
                done += 1
        finally:
            channel.give_way = None
        new = _new_tuple
        for k, (w, arr), seq in zip(indices[:done], writes[:done], seqs[:done], strict=True):
            nbytes = arr.nbytes
            counts = w.traffic  # inline, not a method call
            counts.messages += 1
            counts.bytes += nbytes
            handles[k] = new(WriteHandle, (planned[k][1].spec.name, seq, nbytes))
        return indices[done:]

    @contextlib.contextmanager
    def buffer(
        self,
        name: str,
        *,
        shape: tuple[int, ...] | None = None,
        timeout: float | None = _DEFAULT,
        peer: str | None = None,
    ) -> Iterator[np.ndarray[Any, Any]]:
        """Produce a message in place: yields a writable array for the next slot of ``name``.

        Over ``shm`` the array *is* the receiver's slot, so filling it
        (``np.matmul(a, b, out=...)``) writes the receiver's memory with no copy at all; over a
        network it is a reused staging buffer. The message is completed when the block exits
        normally; if the block raises, it is not sent. ``shape`` is needed for dynamic tensors.
        For a tensor the receiver holds on a GPU the array is a cupy array on that GPU (over
        ``shm``, the receiver's slot itself); the work queued on the current CUDA stream is
        waited for before the message is completed.

        The array is lent for the block only: a host array is read-only once the block ends.
        Views made of it inside the block are not, and must not be kept either: over ``shm``
        a write through them after the block would change a message already sent.
        """
        deadline = self._deadline(timeout)
        asked = shape
        tries = 0
        while tries < ROUTE_TRIES:
            tries += 1
            p, entry, epoch = self._resolve(name, peer, deadline)
            spec = entry.spec
            shape = asked
            if shape is None:
                if spec.dynamic:
                    raise SpecMismatchError(
                        f"tensor {name!r} has a dynamic shape {spec.describe()}: give this "
                        "message's, buffer(name, shape=...)"
                    )
                shape = spec.static_shape
            try:
                shape = tuple(whole_number(d) for d in shape)
            except TypeError:
                raise SpecMismatchError(
                    f"tensor {name!r}: a buffer's shape takes whole numbers, got {shape!r}"
                ) from None
            spec.check_shape(shape)
            # The receiver's lock, held to the block's end: another thread's calls to it wait
            # for the block (a write to the tensor would take the block's slot), those to the
            # sender's other receivers go on.
            self._hold(p, deadline, "buffer")
            if epoch != self._routes_epoch:
                p.lock.release()  # (its book or session changed meanwhile: looked up again)
                continue
            # Its slot waited for before the block opens, giving way meanwhile to another
            # thread's call to the receiver (as a write does); then the lock is kept.
            try:
                writer = p.writer(entry, deadline)
                self._refuse_if_producing(writer, name)
                gave_way = not writer.slot_free() and self._await_slot(p, writer, deadline)
            except BaseException:
                p.lock.release()
                raise
            if not gave_way:
                break
            p.lock.release()
            tries -= 1  # (not a change of route)
            _let_waiting_go(p)
        else:
            raise _books_kept_changing(f"tensor {name!r}", "looked it up")
        try:
            w = p.writer(entry, deadline)
            self._refuse_if_producing(w, name)
            self._producing[id(w)] = threading.get_ident()
            # its fast routes (by the tensor's name, and with its receiver's address) would
            # write into the slot the block fills: dropped, and made again by the first write
            # after the block
            with self._lock:
                for key in (name, (name, p.address)):
                    routed = self._fast.get(key)
                    if routed is not None and routed[0] is w:
                        del self._fast[key]
            try:
                if entry.device is not None and not w.takes_device:
                    # Produced on the GPU, sent from host memory: a GPU staging array, copied
                    # out (through pinned memory) when the block ends.
                    cp = cupy_module()
                    with cp.cuda.Device(entry.device):
                        staging = cp.empty(shape, spec.dtype)
                    yield staging
                    w.write(w.on_host(staging), deadline)
                    w.traffic.messages += 1
                    w.traffic.bytes += staging.nbytes
                    return
                out = w.acquire(shape, deadline)
                # A view of its own, made read-only when the block ends: over shm the array is
                # the receiver's slot, and a write through a reference kept past the block
                # would change a message already completed (a later one, once the slot is
                # reused). cupy arrays have no such flag. (A LentArray: its DLPack export
                # names bfloat16 and float8, for a torch user producing into it.)
                host = isinstance(out, np.ndarray)
                lent = out.view(LentArray) if host else out
                try:
                    yield lent
                except BaseException:
                    w.abort()
                    raise
                finally:
                    if host:
                        lent.flags.writeable = False
                w.commit(shape)
                w.traffic.messages += 1
                w.traffic.bytes += out.nbytes
            finally:
                del self._producing[id(w)]
        finally:
            p.lock.release()

    @staticmethod
    def _giving_way(p: _Peer, call: Callable[..., object], *args: Any) -> bool:
        """``call(*args)`` under ``p``'s lock, whose wait for a slot (before any of its
        messages moves) gives way to another thread's call to ``p``: True where it gave way
        (the caller lets the lock go, and tries again)."""
        channel = p.channel
        if channel is not None:
            channel.give_way = p.others_waiting
        try:
            call(*args)
        except GiveWay:
            return True
        finally:
            if channel is not None:
                channel.give_way = None
        return False

    def _await_slot(self, p: _Peer, w: TensorWriter, deadline: float | None) -> bool:
        """Wait under ``p``'s lock for a free slot for ``w``'s next message (a ``buffer()``
        block's, before it opens), giving way to another thread's call to ``p``: True where it
        did."""
        return self._giving_way(p, w.await_slot, deadline)

    @staticmethod
    def _interrupt(p: _Peer, why: str) -> None:
        """End a write to ``p`` blocked in another thread, which holds the peer's lock (no
        credit, a socket full): its channel is marked lost, which its waits look at every
        0.1 s, and a reconnect of it is refused (``why``, both)."""
        p.abandoned = why
        if p.channel is not None:
            p.channel.mark_lost(why)

    def _refuse_if_producing(self, w: TensorWriter, name: str) -> None:
        """Refuse a message of ``w``'s tensor from a thread in a buffer() block of it (another
        thread's waits for the block: it holds the receiver's lock)."""
        if self._producing.get(id(w)) == threading.get_ident():
            raise TensorWireError(
                f"tensor {name!r} has a buffer() block open in this sender: end the block "
                "(its message) before another message of the tensor"
            )

    def ping(
        self,
        peer: str | None = None,
        timeout: float | None = _DEFAULT,
        *,
        check: Callable[[], None] | None = None,
    ) -> None:
        """A control-plane heartbeat round trip (raises if the receiver does not answer).

        A receiver found dead meanwhile (its process, on this host; the data channel's check of
        its peer: a hang-up, the heartbeats' verdict) raises PeerLostError at once, not after
        ``timeout``.
        ``check``, if given, is called about every 0.1 s while the ping waits, and what it
        raises ends the wait (a caller's own news that makes the answer moot). Other threads'
        writes go on while it waits, and it does not wait for theirs (one blocked on a credit,
        to this receiver or another); :meth:`close` ends it with ClosedError, and
        :meth:`remove_peer` of its receiver with PeerLostError."""
        # No lock at all, not even for the peer's look-up: a ping is what a watchdog thread
        # asks while a write to the receiver waits for a credit it may never get (holding the
        # receiver's lock up to its timeout). What it reads is set under the locks by other
        # threads, a reconnect's at most half: a ping then meets the session that ended, as
        # it would.
        p = self._peer(peer)
        control, generation, token = p.control, p.generation, p.token
        if control is None or not token:
            raise PeerLostError(p.reconnect_failed or f"receiver at {p.address} has no session")
        # The round trip outside the locks: other threads' writes, to this receiver
        # (but for a claim, which waits for the control socket's turn) and to the others, go on
        # meanwhile; close() and remove_peer() end it. Before, a ping of a frozen receiver held
        # every write of the sender up to its timeout, and close() too.
        look = self._look_during(p, control, "ping", check)
        t = self._round_trip if timeout is _DEFAULT else timeout
        try:
            control.request(wire.Heartbeat(generation, token), t, check=look)
        except ClosedError:  # its control socket, closed by another thread meanwhile
            look()
            raise

    def _look_during(
        self,
        p: _Peer,
        control: ControlClient,
        call: str,
        check: Callable[[], None] | None = None,
    ) -> Callable[[], None]:
        """What a round trip to ``p`` made outside the locks (``call``: a ping, a
        refresh) looks at while it waits, on its ``control`` socket: the sender closed
        (ClosedError), the receiver removed, its session ended, or it is known gone
        (PeerLostError); then the caller's own ``check``. The data channel's own look at the
        receiver (a tcp hang-up) is made where no other thread holds the receiver's lock (the
        channel is the writes'); else the verdict it holds already."""

        def look() -> None:
            if self._closed:
                raise ClosedError(
                    f"sender {self.name} was closed while it waited for its {call} of {p.address}"
                )
            if self._peers.get(p.address) is not p:
                raise PeerLostError(
                    f"receiver at {p.address} was removed (remove_peer) while this sender "
                    f"waited for its {call}"
                )
            if p.control is not control:
                raise PeerLostError(
                    f"the session with the receiver at {p.address} ended while this sender "
                    f"waited for its {call}"
                )
            p.check_alive()
            channel = p.channel
            if channel is not None:
                if p.lock.acquire(False):
                    try:
                        if p.channel is channel:
                            channel.check_peer()
                    finally:
                        p.lock.release()
                else:
                    channel.raise_if_lost()
            if check is not None:
                check()

        return look

    # ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Say goodbye to every receiver and release every socket and mapping. Idempotent.

        A write still in progress in another thread (blocked on a receiver that does not take
        its bytes, or waiting for a credit) is ended with PeerLostError, within
        ``CLOSE_INTERRUPT`` seconds plus the transports' check interval (0.1 s): closing never
        waits behind a stuck write. A handshake under way (:meth:`add_peer` in another thread)
        is given up, and its call raises ClosedError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._forget_routes()
            peers, self._peers = list(self._peers.values()), {}
            for joining in self._joining.values():  # (their add_peer ends with ClosedError)
                joining.abandoned = f"sender {self.name} was closed while it connected"
        if self._heartbeats is not None:
            self._heartbeats.close()
        # Every receiver's goodbye at once, each on its own channel and control socket: the
        # close then waits GOODBYE_TIMEOUT however many receivers do not answer, not that long
        # for each of them (a parameter server whose workers froze); and CLOSE_INTERRUPT
        # however many writes are stuck.
        why = f"sender {self.name} was closed during the write"
        farewells = []
        for p in peers[1:]:
            thread = threading.Thread(
                target=self._end_peer,
                args=(p, True, why),
                name=f"tensorwire-goodbye-{self.name}",
                daemon=True,
            )
            try:
                thread.start()
            except RuntimeError:  # no new threads (interpreter shutdown, Python 3.12+): in turn
                self._end_peer(p, True, why)
            else:
                farewells.append(thread)
        if peers:
            self._end_peer(peers[0], True, why)
        for thread in farewells:
            thread.join()  # bounded: a goodbye takes GOODBYE_TIMEOUT at most
        for ending in list(self._endings.values()):  # (remove_peer's, on threads of their own)
            ending.wait()
        if self._copier is not None:
            self._copier.close()

    def metric_gauges(self) -> Iterator[tuple[str, tuple[str, ...], float]]:
        """Its connected receivers, for :mod:`tensorwire.metrics`."""
        yield "peers", ("sender",), float(len(self._peers))

    def __repr__(self) -> str:
        return f"<Sender {self.name} peers={self.peers}{' closed' if self._closed else ''}>"
