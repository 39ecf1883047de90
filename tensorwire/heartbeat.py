"""Sender-side heartbeats: tell each receiver we are alive, and notice a receiver that is not.

One thread per sender, with a control socket of its own per receiver (a zmq socket belongs to one
thread, and a long blocking write must not delay a heartbeat), closed when the receiver is no
longer a peer. Every ``interval`` seconds it sends each receiver a heartbeat naming the session's
token, or more often where the receiver said in its welcome that it drops a session silent for
less than ``misses`` intervals (at least ``misses`` heartbeats reach it within its timeout). No
answer is awaited longer than the shortest of those intervals, so a frozen receiver does not hold
back the heartbeats of another. A receiver that answers none for ``misses`` of the sender's own
intervals, answers that the session or generation is gone, or whose process exited (on this
host), is marked lost on the peer's
channel (or, while the channel is being set up, on the peer: ``setup_lost``), so the next write,
or a write blocked waiting for credit, raises :class:`~tensorwire.errors.PeerLostError`.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from . import wire
from .checks import MAX_SECONDS
from .control import ControlClient
from .errors import TensorWireError, WireTimeoutError

log = logging.getLogger(__name__)


#: The shortest interval between heartbeats to one receiver, however short its timeout.
MIN_INTERVAL = 0.01
#: Seconds a receiver's silence may fall short of ``misses`` intervals and still be judged
#: (each unanswered wait may end up to a millisecond early: zmq polls in whole milliseconds)
SILENCE_SLACK = 0.01


def check_seconds(name: str, value: float | None) -> None:
    """``value`` must be None (never) or a positive number of seconds, at most
    :data:`~tensorwire.checks.MAX_SECONDS`: zero or less would heartbeat without pause, or
    drop every peer at once; past it (infinity too) the waits overflow. ValueError names
    ``name``."""
    if value is not None and not (0 < value <= MAX_SECONDS and value.__class__ is not bool):
        raise ValueError(
            f"{name} must be a positive number of seconds of at most {MAX_SECONDS:g}, or None "
            f"(never), got {value!r}"
        )


class Heartbeats:
    def __init__(
        self,
        peers: Callable[[], list[Any]],
        interval: float,
        misses: int = 3,
        name: str = "tensorwire-heartbeat",
    ) -> None:
        self._peers = peers
        self.interval = interval
        self.misses = misses
        self._stop = threading.Event()
        self._wake = threading.Event()  # a peer was welcomed, or close(): look again at once
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def interval_for(self, peer: Any) -> float:
        """Seconds between heartbeats to ``peer``: the sender's interval, or less where the
        receiver drops a session silent for less than ``misses`` of them (a receiver made with
        ``heartbeat_timeout=2`` would otherwise drop every idle sender of the default 5 s)."""
        timeout = peer.heartbeat_timeout
        if timeout is None:
            return self.interval
        return max(MIN_INTERVAL, min(self.interval, timeout / self.misses))

    def poke(self) -> None:
        """A peer was welcomed: schedule its heartbeats now, not at the end of the current wait."""
        self._wake.set()

    def _run(self) -> None:
        clients: dict[str, ControlClient] = {}
        missed: dict[str, int] = {}
        silent_since: dict[str, float] = {}  # when the first heartbeat still unanswered went
        due: dict[str, float] = {}  # when each peer's next heartbeat goes
        counted: dict[str, bytes] = {}  # the session (token) whose silence ``missed`` counts
        try:
            while not self._stop.is_set():
                self._wake.clear()  # before looking: a peer welcomed from here on wakes the wait
                now = time.monotonic()
                wait = self.interval
                peers = self._peers()
                current = {peer.address for peer in peers}
                for address in [a for a in clients if a not in current]:
                    clients.pop(address).close()  # the peer was removed: its socket goes too
                    missed.pop(address, None)
                    silent_since.pop(address, None)
                    counted.pop(address, None)
                for address in [a for a in due if a not in current]:
                    del due[address]
                # No answer is awaited longer than the shortest interval: one thread serves
                # every receiver, and a frozen one must not hold back the heartbeats that a
                # receiver with a short timeout needs (its verdict comes from the time it has
                # been silent, not from how many heartbeats went unanswered).
                patience = min((self.interval_for(p) for p in peers), default=self.interval)
                for peer in peers:
                    # A peer without a channel yet is being set up: kept alive, and a receiver
                    # found gone meanwhile is told to the set-up (``setup_lost``), whose waits
                    # end then rather than at their timeouts.
                    channel = peer.channel
                    # The token before the generation: a reconnect sets the generation first,
                    # so a heartbeat never pairs a new generation's token with an old generation.
                    token = peer.token
                    generation = peer.generation
                    if (
                        not token
                        or (channel is not None and channel.lost is not None)
                        or (channel is None and peer.setup_lost is not None)
                    ):
                        continue
                    if counted.get(peer.address) != token:
                        # a new session (the sender reconnected): the silence of the one
                        # before is not its, and must not bring its verdict early
                        counted[peer.address] = token
                        missed.pop(peer.address, None)
                        silent_since.pop(peer.address, None)
                    every = self.interval_for(peer)
                    # first heartbeat one interval after the welcome
                    when = due.setdefault(peer.address, now + every)
                    if when > now:
                        wait = min(wait, when - now)
                        continue
                    client = clients.get(peer.address)
                    if client is None:
                        client = clients[peer.address] = ControlClient(
                            peer.address, peer.curve_server_key
                        )
                    verdict = None
                    sent = time.monotonic()
                    try:
                        # A receiver on this host whose process exited is not sent heartbeats
                        # into the void: its verdict is that, at once. Before, it was "missed 3
                        # heartbeats" 15 s later (at the default 5 s), in a parameter server's
                        # log after its own line that the worker had died.
                        peer.check_alive()
                        client.request(wire.Heartbeat(generation, token), min(every, patience))
                        missed[peer.address] = 0
                        silent_since.pop(peer.address, None)
                    except WireTimeoutError:
                        missed[peer.address] = n = missed.get(peer.address, 0) + 1
                        silent = time.monotonic() - silent_since.setdefault(peer.address, sent)
                        # lost after ``misses`` of the sender's own intervals without an answer,
                        # however often it heartbeats (``SILENCE_SLACK``: a wait's last
                        # millisecond, which zmq's poll may cut short)
                        if silent >= self.misses * self.interval - SILENCE_SLACK:
                            verdict = (
                                f"receiver at {peer.address} missed {n} heartbeats "
                                f"({silent:.1f} s without an answer)"
                            )
                    except TensorWireError as exc:  # session or generation gone
                        verdict = str(exc)  # (a refusal names the receiver already)
                        if peer.address not in verdict:
                            verdict = f"receiver at {peer.address}: {verdict}"
                    if verdict is not None and peer.token != token:
                        # The peer reconnected while this heartbeat was out: the verdict is
                        # on the session before (a restarted receiver knows not its token),
                        # and must not end the new one's set-up (found by a CI run: a
                        # sender's reconnect to a restarted receiver failed with "refused
                        # heartbeat: unknown session token").
                        verdict = None
                    if verdict is not None:
                        if channel is not None:
                            channel.mark_lost(verdict)
                        else:
                            peer.setup_lost = verdict
                    if channel is not None and channel.lost is not None:
                        if peer.channel is channel:
                            peer.note_lost()
                            log.warning("%s", channel.lost)
                        # else the sender closed the channel while the heartbeat was out (a
                        # peer removed, a reconnect): no loss. A parameter server's log had a
                        # bare "closed" line (the gRPC channel's word for it), one per rejoin.
                    elif channel is not None:
                        try:
                            channel.tick()
                        except TensorWireError as exc:  # the channel says why at its next call
                            log.debug("%s", exc)
                    # the next one an interval after this one was due (not after its answer: a
                    # slow answer must not stretch the gaps the receiver sees); at once if that
                    # has passed, but never a burst to catch up
                    due[peer.address] = max(when + every, time.monotonic())
                    wait = min(wait, max(0.0, due[peer.address] - time.monotonic()))
                self._wake.wait(wait)
        finally:
            for client in clients.values():
                client.close()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()


def peers_of(owner: Any) -> Callable[[], list[Any]]:
    """A weak view of ``owner._peers`` and ``owner._joining`` (peers being connected): the
    thread must not keep its sender alive."""
    ref = weakref.ref(owner)

    def peers() -> list[Any]:
        obj = ref()
        return [] if obj is None else [*obj._peers.values(), *obj._joining.values()]

    return peers
