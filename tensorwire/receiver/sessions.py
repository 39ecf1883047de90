"""The receiver's control plane: one session per sender, from its hello to its goodbye or death.

Runs on the control-plane thread (:class:`~tensorwire.control.ControlServer`). A sender says
hello, proves it knows the secret (when there is one) and is welcomed with a token and each
transport's details; it reads the address book, *claims* a tensor before writing it (one writer
per tensor at a time, each claim with a new epoch that fences out the writer before it), attaches
to transports whose peers must know each other, heartbeats, and says goodbye. A session ends with
that goodbye, the sender's death (pidfd on this host, the data connection or silence elsewhere)
or the receiver's close; its claims end with it, and the consumer learns of a loss at its next
wait.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import metrics, wire
from ..auth import client_mac, new_nonce, server_proof, verify
from ..control import STALL
from ..doorbell import barrier_everywhere
from ..errors import PeerLostError, TensorWireError
from ..process import ProcessWatch
from ..quietlog import QuietLog
from ..transports import TRANSPORTS
from ..transports.base import CreditLink
from .servers import DataServers
from .state import ReceiverState
from .tensors import Loss, RegisteredTensor, TensorTable

#: dropped sessions whose end is remembered, for what their connection and their heartbeats
#: ask next (each two entries, by identity and by token, of a line: a few hundred bytes)
DROPPED_KEPT = 1024

log = logging.getLogger(__name__)
quiet = QuietLog(log)  # refusals anyone can provoke: rate-limited per reason


@dataclass(eq=False)
class Session:
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
    #: since when another session's claim waits to learn whether this one, on another host,
    #: lives (None: no claim waits): see SessionHandler._unsure_of
    contested_since: float | None = None

    def describe(self) -> str:
        return f"sender {self.client!r} (pid {self.pid})"

    def dropped_error(self, doing: str = "") -> PeerLostError:
        """What a write of this session meets once the receiver has ended it; ``doing`` says
        what was under way then."""
        return PeerLostError(
            f"{self.describe()} was dropped by the receiver ({self.dropped}){doing}; its claims "
            "are revoked"
        )


class SessionHandler:
    def __init__(
        self,
        state: ReceiverState,
        table: TensorTable,
        servers: DataServers,
        *,
        secret: bytes | None,
        heartbeat_timeout: float | None,
        info: dict[str, Any] | None = None,
    ) -> None:
        self._state = state
        self.info = info or {}  # published in every welcome (Receiver(info=...))
        self._table = table
        self._servers = servers
        self._secret = secret
        self._heartbeat_timeout = heartbeat_timeout
        self._sessions: dict[bytes, Session] = {}  # by control-socket identity
        self._tokens: dict[bytes, Session] = {}  # by the token its data connections present
        #: why each of the latest sessions we dropped (lost, not said goodbye) ended, by
        #: control-socket identity, until that connection says hello again: what its requests
        #: are told (PeerLostError at the sender), not "say hello first", which reads as a
        #: wrong secret and is raised as AuthenticationError
        self._dropped: OrderedDict[bytes, str] = OrderedDict()
        self._ticked = time.monotonic()  # the latest tick
        #: called (under the state's lock) once a session ended: the consumer lets go of the
        #: credits it held back for that session's link (Consumer.forget_ended_links)
        self.on_drop: Callable[[], None] | None = None

    def by_token(self, token: bytes) -> Session | None:
        return self._tokens.get(token)

    @property
    def connected(self) -> int:
        """Senders welcomed and not dropped since."""
        return len(self._tokens)

    # -- the protocol --------------------------------------------------------------------------

    def handle(self, identity: bytes, msg: wire.Message) -> wire.Message | None:
        state = self._state
        with state.lock:
            if state.closed:
                return wire.ErrorReply("closed", "receiver is closing")
            if isinstance(msg, wire.Hello):
                return self._hello(identity, msg)
            session = self._sessions.get(identity)
            if isinstance(msg, wire.Auth):
                return self._auth(session, msg)
            if isinstance(msg, wire.Heartbeat):
                return self._heartbeat(msg)
            if isinstance(msg, wire.Resume):
                return self._resume(identity, msg)
            generation = getattr(msg, "generation", None)
            if session is None or not session.authenticated:
                if generation is not None and generation != state.generation:
                    # A sender of this address's previous receiver (it restarted, and knows
                    # none of its sessions): the receiver it spoke to is gone, which the sender
                    # takes as a loss (PeerLostError) and acts on, where "unauthenticated"
                    # read as a wrong secret. The new generation is not told before a hello.
                    return wire.ErrorReply(
                        "stale-generation",
                        f"generation {generation} is gone; the receiver restarted",
                    )
                dropped = self._dropped.get(identity) if session is None else None
                if dropped is not None:
                    return wire.ErrorReply("closed", f"{dropped}; its claims are revoked")
                return wire.ErrorReply("unauthenticated", "say hello (and authenticate) first")
            if generation != state.generation:
                return wire.ErrorReply(
                    "stale-generation",
                    f"generation {generation} is gone; the receiver restarted as "
                    f"{state.generation}",
                )
            if isinstance(msg, wire.Lookup):
                return self._address_book(msg.compact)
            if isinstance(msg, wire.Claim):
                return self._claim(session, msg)
            if isinstance(msg, wire.ClaimMany):
                return self._claim_many(session, msg)
            if isinstance(msg, wire.Attach):
                return self._attach(session, msg)
            session.last_seen = time.monotonic()
            if isinstance(msg, wire.Goodbye):
                self.drop(session, None)
                return wire.Ack(state.generation)
            return wire.ErrorReply("protocol", f"unexpected {msg.TYPE} message")

    def _live(
        self, msg: wire.Heartbeat | wire.Resume, unknown: wire.ErrorReply
    ) -> Session | wire.ErrorReply:
        """The live session ``msg``'s token names, in this generation; else the refusal
        (``unknown`` for a token of no live session)."""
        session = self._tokens.get(msg.token)
        if session is None or not session.alive:
            # A session we dropped: its sender is told why (its heartbeats, which come on a
            # socket of their own, read "unknown session token" before: a sender resumed
            # from a freeze learned neither that it was dropped nor for what)
            dropped = self._dropped.get(msg.token)
            if dropped is not None:
                return wire.ErrorReply("closed", f"{dropped}; its claims are revoked")
            return unknown
        if msg.generation != self._state.generation:
            return wire.ErrorReply("stale-generation", f"generation {msg.generation} is gone")
        return session

    def _heartbeat(self, msg: wire.Heartbeat) -> wire.Message:
        # Heartbeats come on the sender's own heartbeat socket, so the token, not the socket
        # identity, says which session is alive (and proves it was authenticated).
        session = self._live(msg, wire.ErrorReply("unauthenticated", "unknown session token"))
        if isinstance(session, wire.ErrorReply):
            return session
        session.last_seen = time.monotonic()
        return wire.Ack(self._state.generation)

    def _resume(self, identity: bytes, msg: wire.Resume) -> wire.Message:
        """A sender's session moves to the control connection ``identity``: the sender closed
        the one before after a request there went unanswered (we were stopped, or slow). The
        token, which only the session's sender holds (its heartbeats present it too), proves
        it. Without this the new connection was a stranger's, told "say hello first", which the
        sender took for a wrong secret."""
        over = wire.ErrorReply("closed", "the session to resume is over; say hello again")
        session = self._live(msg, over)
        if isinstance(session, wire.ErrorReply):
            return session
        if session.identity != identity:
            if self._sessions.get(session.identity) is session:
                del self._sessions[session.identity]
            other = self._sessions.get(identity)
            if other is not None:  # cannot be: a connection opened anew has an identity anew
                self.drop(other, "its connection was taken over by another session")
            session.identity = identity
            self._sessions[identity] = session
        session.last_seen = time.monotonic()
        return wire.Ack(self._state.generation)

    def _hello(self, identity: bytes, msg: wire.Hello) -> wire.Message:
        self._dropped.pop(identity, None)
        old = self._sessions.get(identity)
        if old is not None:
            self.drop(old, "said hello again")
        session = Session(identity, msg.client, msg.pid, msg.host, msg.nonce)
        self._sessions[identity] = session
        if self._secret is not None:
            session.server_nonce = new_nonce()
            return wire.Challenge(session.server_nonce)
        return self._welcome(session)

    def _auth(self, session: Session | None, msg: wire.Auth) -> wire.Message:
        if session is None or self._secret is None or session.authenticated:
            return wire.ErrorReply("protocol", "unexpected auth message")
        expected = client_mac(self._secret, session.server_nonce, session.client_nonce)
        if not verify(expected, msg.mac):
            self._sessions.pop(session.identity, None)
            quiet.warning("wrong secrets", "refused %s: wrong secret", session.describe())
            return wire.ErrorReply("auth", "wrong secret")
        return self._welcome(session)

    def _welcome(self, session: Session) -> wire.Message:
        state = self._state
        session.authenticated = True
        session.token = secrets.token_bytes(wire.TOKEN_BYTES)
        self._tokens[session.token] = session
        if session.host == state.host:
            session.watch = ProcessWatch(session.pid)
        proof = b""
        if self._secret is not None:
            proof = server_proof(self._secret, session.server_nonce, session.client_nonce)
        transports: dict[str, Any] = {}
        for name, transport in TRANSPORTS.items():
            if transport.server is None and self._table.shared:
                transports[name] = {}  # the sender maps our regions by the address book's names
        transports.update(self._servers.published())
        log.debug("welcomed %s", session.describe())
        metrics.count("tensorwire_peers_connected_total", "receiver")
        return wire.Welcome(
            state.generation,
            os.getpid(),
            state.host,
            proof,
            session.token,
            transports,
            # the sender heartbeats often enough for this, whatever its own interval
            heartbeat_timeout_ms=0
            if self._heartbeat_timeout is None
            else max(1, round(self._heartbeat_timeout * 1000)),
            info=self.info,
        )

    def _address_book(self, compact: bool) -> wire.AddressBook:
        table = self._table
        return wire.AddressBook(
            self._state.generation,
            table.address_book_regions(),
            [t.wire_entry(compact) for t in table.order],
        )

    # -- claims --------------------------------------------------------------------------------

    def _claim(self, session: Session, msg: wire.Claim, how: str = "alone") -> wire.Message:
        tensor = self._table.by_id.get(msg.tensor_id)
        if tensor is None:
            return wire.ErrorReply("unknown-tensor", f"no tensor with id {msg.tensor_id}")
        transport = TRANSPORTS.get(msg.transport)
        if transport is None:
            return wire.ErrorReply("protocol", f"unknown transport {msg.transport!r}")
        owner = tensor.owner
        if owner is session:  # claimed again (a writer rebuilt): same claim, same epoch
            if tensor.inflight is None:
                tensor.expected_seq = max(tensor.ring.last_complete(), tensor.consumed) + 1
            tensor.credited = tensor.released  # the claim's reply tells the writer
            return self._claimed(tensor)
        if owner is not None:
            if self._unsure_of(owner):
                silent = time.monotonic() - owner.last_seen
                return wire.ErrorReply(
                    "silent-owner",
                    f"tensor {tensor.spec.name!r} is written by {owner.describe()} on another "
                    f"host, silent for {silent:.1f} s: the claim can be asked again until it "
                    f"speaks (then it is refused: busy) or the heartbeat timeout "
                    f"({self._heartbeat_timeout:g} s) drops it",
                )
            return wire.ErrorReply(
                "busy", f"tensor {tensor.spec.name!r} is already written by {owner.describe()}"
            )
        if transport.same_host and (not self._table.shared or session.host != self._state.host):
            return wire.ErrorReply(
                "protocol", f"{msg.transport} claimed by a sender on another host"
            )
        key = transport.server
        if key is not None:
            if not self._servers.serves(key):
                return wire.ErrorReply("protocol", f"this receiver does not serve {msg.transport}")
            if session.link is None or session.link_server != key:
                return wire.ErrorReply(
                    "protocol", f"open the {msg.transport} data connection first"
                )
        fenced = self._fenced(tensor, session)
        if fenced is not None:
            return wire.ErrorReply("fenced", f"tensor {tensor.spec.name!r}: {fenced}")
        if tensor.retired and not msg.placed:
            return wire.ErrorReply(
                "protocol",
                f"tensor {tensor.spec.name!r} has moved to fresh memory (a nixl writer of it "
                "was dropped), and this sender predates such moves: it would write where the "
                "tensor no longer is; upgrade tensorwire on the sender",
            )
        tensor.epoch += 1
        tensor.ring.set_owner(tensor.epoch)
        tensor.owner = session
        tensor.transport = msg.transport
        tensor.traffic = metrics.traffic("received", tensor.spec.name, msg.transport)
        tensor.sender_completes = key is None
        server = None if key is None else self._servers.get(key)
        link = session.link
        tensor.poll = None if server is None or link is None else server.poller(link)
        tensor.expected_seq = max(tensor.ring.last_complete(), tensor.consumed) + 1
        tensor.credited = tensor.released  # the claim's reply tells the new writer
        if tensor.lost is not None:  # told after its writer's messages, before this one's
            last = tensor.lost[-1]
            last.until = min(last.until, tensor.expected_seq)
        session.claims.add(tensor.tensor_id)
        metrics.count("tensorwire_claims_total", how)
        return self._claimed(tensor)

    def _claim_many(self, session: Session, msg: wire.ClaimMany) -> wire.Message:
        """Each of ``msg``'s tensors claimed as its own Claim would be, answered together."""
        ids = msg.tensor_ids
        if len(ids) > wire.MAX_CLAIMS or not all(
            isinstance(tid, int) and not isinstance(tid, bool) for tid in ids
        ):
            return wire.ErrorReply(
                "protocol", f"a claim-many names at most {wire.MAX_CLAIMS} tensor ids (integers)"
            )
        claims: list[list[Any]] = []
        for tid in ids:
            one = wire.Claim(msg.generation, tid, msg.transport, msg.placed)
            reply = self._claim(session, one, "batched")
            if isinstance(reply, wire.Claimed):
                granted = [tid, reply.next_seq, reply.released, reply.slots, reply.epoch]
                claims.append([*granted, reply.layout] if reply.layout else granted)
            else:
                assert isinstance(reply, wire.ErrorReply)
                claims.append([tid, reply.code, reply.message])
        return wire.ClaimedMany(self._state.generation, claims)

    def _unsure_of(self, owner: Session) -> bool:
        """Whether a claim that meets ``owner`` must be asked again rather than refused "busy":
        ``owner`` is on another host and has not spoken (a heartbeat, a request, a message)
        since a claim first met it. Such a writer may be dead: nothing of this host tells (a
        writer of this host is dropped as its process exits), and one restarted claiming its
        tensors again must wait for the heartbeat timeout to drop the dead one, not be refused
        (a parameter server restarted on another host exited 1 on "busy": `bench chaos --hosts
        separate`). A live one speaks within its heartbeat interval, and the claim is then
        refused "busy"."""
        if self._heartbeat_timeout is None or owner.host == self._state.host:
            return False  # never dropped for silence / dropped at once if it dies
        if owner.contested_since is None:
            owner.contested_since = time.monotonic()
            return True
        if owner.last_seen > owner.contested_since:
            owner.contested_since = None  # it spoke: alive; a later claim asks anew
            return False
        return True

    def _claimed(self, tensor: RegisteredTensor) -> wire.Claimed:
        return wire.Claimed(
            self._state.generation,
            tensor.tensor_id,
            tensor.expected_seq,
            tensor.released,
            tensor.ring.slot_seqs(),
            tensor.epoch,
            # where the ring lies, once it has moved: the sender's address book may be older
            tensor.ring.layout.to_wire(compact=True) if tensor.retired else [],
        )

    def _fenced(self, tensor: RegisteredTensor, session: Session) -> str | None:
        """Why ``session`` cannot claim the tensor yet: its previous writer may still be storing
        into it. None when a new writer may start (and the ring is cleared for it)."""
        inflight = tensor.inflight
        if inflight is not None:
            return f"a message from {inflight.describe()} is still arriving"
        stale = tensor.stale_writer
        if stale is not None:
            if tensor.sender_completes:
                # shm: the dropped writer read the owner word before or after we cleared it: if
                # before, its WRITING announcement is visible once every CPU has passed a
                # barrier.
                barrier_everywhere()
                if tensor.ring.writer_inside() and stale.alive():
                    return (
                        f"its previous writer (pid {stale.pid}) was dropped in the middle of a "
                        "write and has not finished it (is it stopped?); it can be claimed once "
                        "that write ends or that process exits"
                    )
            elif stale.alive() and (session.host, session.pid) != (self._state.host, stale.pid):
                # nixl, of a tensor that cannot move (a part, a GPU ring; the others' rings move
                # below): the dropped writer reads that it was dropped before each write, and one
                # stopped between that read and its RDMA write posts the write once it runs
                # again; nothing here can revoke it (UCX's cross-memory attach writes our
                # memory by our pid). Its own process claiming anew runs, and a write of its
                # sender is done (completed, under the sender's lock) before the next begins.
                return (
                    f"its previous writer (pid {stale.pid}) was dropped and still runs (is it "
                    "stopped?): a nixl write it had begun could still land; it can be claimed "
                    "once that process exits, or by that process anew"
                )
            stale.close()
            tensor.stale_writer = None
        if tensor.move_before_claim:
            if not self._table.ready_to_move(tensor):
                return (
                    "its ring is being moved to fresh memory, which is being allocated (its "
                    "dropped nixl writer may still store into the old one)"
                )
            tensor.move_before_claim = False
            try:
                self._table.move(tensor)
            except (OSError, MemoryError, TensorWireError) as exc:
                # No memory to move it to (a full /dev/shm): the claim is granted where the
                # ring is, as before moves, rather than refused for as long as the receiver
                # lives; the dropped writer may still store into it, which the log says.
                log.warning(
                    "tensor %r stays where its dropped %s writer may still store: its ring "
                    "could not be moved to fresh memory (%s)",
                    tensor.spec.name,
                    tensor.transport,
                    exc,
                )
            else:
                metrics.count("tensorwire_rings_moved_total", tensor.transport)
                log.debug(
                    "tensor %r moved to fresh memory: its dropped %s writer may still store "
                    "into the old one",
                    tensor.spec.name,
                    tensor.transport,
                )
        tensor.ring.clear_writer()  # a writer that died inside a write left its mark
        return None

    def _attach(self, session: Session, msg: wire.Attach) -> wire.Message:
        """A sender joins a transport whose peers must know each other (``nixl``): its server
        takes the sender's details and hands ours back. Or it asks for the details of a server
        started on demand (``grpc``), which the welcome could not hold."""
        transport = TRANSPORTS.get(msg.transport)
        key = transport.server if transport is not None else None
        if key is None:
            return wire.ErrorReply("protocol", f"transport {msg.transport!r} has nothing to attach")
        if session.link is not None and session.link_server != key:
            return wire.ErrorReply(
                "protocol", f"{session.describe()} already has a data connection"
            )
        session.last_seen = time.monotonic()
        try:
            server = self._servers.attachable(key)
            if server is None:  # being started on a thread of its own: ask again
                return wire.ErrorReply("starting", f"its {msg.transport} server is starting")
            link, details = server.attach(session, msg.details)
        except TensorWireError as exc:
            return wire.ErrorReply("protocol", f"{msg.transport}: {exc}")
        if link is not None:  # (none: the sender asked for the details; its connection links)
            session.link, session.link_server = link, key
        return wire.Attached(self._state.generation, details)

    # -- the end of a session ----------------------------------------------------------------

    def drop(self, session: Session, reason: str | None) -> None:
        """End a session; ``reason`` is None for a clean goodbye, else why it was lost. Called
        under the state's lock."""
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
        for server in self._servers.running():
            server.detach(session)
        moving = 0  # its tensors whose next claim moves their ring (said once, below)
        for tid in session.claims:
            tensor = self._table.by_id[tid]
            if tensor.owner is session:
                tensor.owner = None
                tensor.poll = None
                tensor.ring.set_owner(0)  # fences a shared-memory writer out of the ring
                # not when the consumer drained this writer already and nothing landed since
                drained = tensor.drained == (tensor.epoch, tensor.ring.last_complete())
                if reason is not None and not drained:
                    notice = Loss(f"{session.describe()} was lost: {reason}")
                    if tensor.lost is None:
                        tensor.lost = [notice]
                    else:
                        tensor.lost.append(notice)
                # A writer that stores into our memory itself and may still run may store
                # again: the next claim is fenced (_fenced), whether or not the consumer
                # drained it (that forgets its messages and its notice, not what it may still
                # store). A `nixl` writer's WRITE nothing here can stop (on another host
                # whether it still runs cannot even be told): the next claim moves the ring to
                # memory it never reached, where the tensor can move. A `shm` writer stopped
                # inside a write holds the claim off until that write ends (it completes that
                # message, which the consumer then reads), or its process exits.
                if reason is not None and TRANSPORTS[tensor.transport].stores_itself:
                    elsewhere = session.host != self._state.host
                    if (
                        (writer_alive or elsewhere)
                        and not tensor.sender_completes
                        and self._table.movable(tensor)
                    ):
                        tensor.move_before_claim = True
                        moving += 1
                    elif writer_alive:
                        if tensor.stale_writer is not None:
                            tensor.stale_writer.close()
                        tensor.stale_writer = ProcessWatch(session.pid)
        session.claims.clear()
        if self.on_drop is not None:
            self.on_drop()
        if reason is not None:
            # what its control connection and its heartbeats' token are told from now on
            line = f"{session.describe()} was dropped: {reason}"
            self._dropped[session.identity] = self._dropped[session.token] = line
            while len(self._dropped) > 2 * DROPPED_KEPT:
                self._dropped.popitem(last=False)
            metrics.count("tensorwire_peers_lost_total", "receiver")
            log.warning("%s lost: %s", session.describe(), reason)
            if moving:
                # one line for the session, not one a tensor at each move (a parameter
                # server's log of the `many` model had 116 of its 148 lines such moves, dozens
                # each time a worker rejoined)
                log.info(
                    "%s: the %d tensor(s) it wrote over nixl move to fresh memory at their "
                    "next claim (a WRITE it began may still land in the old memory)",
                    session.describe(),
                    moving,
                )
            self._table.wake()

    def tick(self, caught_up: float) -> None:
        """The control thread's periodic check: drop senders that died or went silent.

        Silence is counted only while we could listen: after a gap of over STALL (this
        process stopped, or starved) each session's silence is counted from where it stood
        before the gap. Counted through it, a receiver stopped for nearly its timeout dropped
        every sender at its first look, before it had read the heartbeats that came meanwhile
        (a chaos run: a worker frozen for 2.4 s dropped two of its servers, which then had to
        join it again). Nor is it counted past ``caught_up``, the latest moment no control
        message was waiting unread (ControlServer): a heartbeat still waiting behind others
        is not silence."""
        now = time.monotonic()
        stalled = now - self._ticked
        self._ticked = now
        heard_up_to = min(caught_up, now)
        with self._state.lock:
            if stalled > STALL:
                for session in self._sessions.values():
                    session.last_seen = min(now, session.last_seen + stalled)
            for session in list(self._sessions.values()):
                if session.watch is not None and not session.watch.alive():
                    self.drop(session, "process exited")
                elif (
                    self._heartbeat_timeout is not None
                    and session.authenticated
                    and heard_up_to - session.last_seen > self._heartbeat_timeout
                ):
                    self.drop(
                        session,
                        f"silent for {now - session.last_seen:.1f} s, past the receiver's "
                        f"heartbeat_timeout of {self._heartbeat_timeout:g} s (was the sender's "
                        "process stopped, or starved of CPU?)",
                    )
        self._table.drop_unused_spare()  # (not under the lock: unmapping it takes a while)

    def close(self) -> None:
        """End every session cleanly (the receiver is closing)."""
        with self._state.lock:
            for session in list(self._sessions.values()):
                self.drop(session, None)
