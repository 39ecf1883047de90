"""Sender-side heartbeats: tell each receiver we are alive, and notice a receiver that is not.

One thread per sender, with a control socket of its own per receiver (a zmq socket belongs to one
thread, and a long blocking write must not delay a heartbeat), closed when the receiver is no
longer a peer. Every ``interval`` seconds it sends
each receiver a heartbeat naming the session's token; a receiver that misses ``misses`` answers in a
row, or answers that the session or generation is gone, is marked lost on the peer's channel, so the
next write, or a write blocked waiting for credit, raises :class:`~tensorwire.errors.PeerLostError`.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from . import wire
from .control import ControlClient
from .errors import TensorWireError, WireTimeoutError

log = logging.getLogger(__name__)


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
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        clients: dict[str, ControlClient] = {}
        missed: dict[str, int] = {}
        try:
            while not self._stop.wait(self.interval):
                peers = self._peers()
                current = {peer.address for peer in peers}
                for address in [a for a in clients if a not in current]:
                    clients.pop(address).close()  # the peer was removed: its socket goes too
                    missed.pop(address, None)
                for peer in peers:
                    # a peer without a channel yet is being set up: kept alive, never marked lost
                    # (its set-up fails on its own if the receiver is gone)
                    channel = peer.channel
                    if not peer.token or (channel is not None and channel.lost is not None):
                        continue
                    client = clients.get(peer.address)
                    if client is None:
                        client = clients[peer.address] = ControlClient(
                            peer.address, peer.curve_server_key
                        )
                    try:
                        client.request(wire.Heartbeat(peer.generation, peer.token), self.interval)
                        missed[peer.address] = 0
                    except WireTimeoutError:
                        missed[peer.address] = missed.get(peer.address, 0) + 1
                        if missed[peer.address] >= self.misses and channel is not None:
                            channel.mark_lost(
                                f"receiver at {peer.address} missed {self.misses} heartbeats "
                                f"({self.misses * self.interval:g} s)"
                            )
                    except TensorWireError as exc:  # session or generation gone
                        if channel is not None:
                            channel.mark_lost(f"receiver at {peer.address}: {exc}")
                    if channel is not None and channel.lost is not None:
                        peer.note_lost()
                        log.warning("%s", channel.lost)
        finally:
            for client in clients.values():
                client.close()

    def close(self) -> None:
        self._stop.set()
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
