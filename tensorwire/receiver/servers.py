"""The data servers a receiver runs for its networked transports.

Which servers exist is declared in :mod:`tensorwire.transports` (``SERVERS``); this module starts
them (with the receiver, or when the first sender attaches, as each prefers), hands each one every
span of registered memory, publishes their details in the welcome, and closes them. It names no
transport.

A server started when its first sender attaches is created on a thread of its own: creating one
can take seconds (NIXL's agent on a GPU host: over a second), and the control thread that asked
must go on answering every sender meanwhile (heartbeats included: a sender heartbeating every
0.2 s declared the receiver lost while it created the agent, on an H100 host). Until it is up,
attaches are answered "starting" and the sender asks again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import TensorWireError, TransportError
from ..memory import Memory
from ..transports import SERVERS
from ..transports.base import DataServer, DataSink, ServerSettings

log = logging.getLogger(__name__)

#: How long closing the receiver waits for a server still being started (then closes it).
START_JOIN_TIMEOUT = 60.0


class _Starting:
    """A server being created on a thread of its own; ``server`` or ``error`` once it ends."""

    def __init__(self, key: str, settings: ServerSettings, sink: DataSink) -> None:
        self.server: DataServer | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run,
            args=(key, settings, sink),
            name=f"tensorwire-start-{key}-{settings.receiver_name}",
            daemon=True,
        )
        self.thread.start()

    def _run(self, key: str, settings: ServerSettings, sink: DataSink) -> None:
        try:
            self.server = SERVERS[key].start(settings, sink)
        except BaseException as exc:  # handed to the attach that asks next
            self.error = exc


class DataServers:
    def __init__(self, settings: ServerSettings) -> None:
        self._settings = settings
        self._sink: DataSink | None = None  # where the servers deliver; set when they start
        self._running: dict[str, DataServer] = {}  # by key
        self._on_demand: set[str] = set()  # started when the first sender attaches
        self._starting: dict[str, _Starting] = {}  # on-demand servers being created
        self._failed: dict[str, str] = {}  # on-demand servers that could not start: why
        self._memory: list[Memory] = []  # every span the receiver registered, in order

    def start_configured(self, wanted: Mapping[str, Any], sink: DataSink) -> None:
        """Start every declared server, delivering into ``sink``: ``wanted[key]`` True (or
        options) now (an error if its library is missing), False never, None (or absent) where
        its library is installed, now or on demand as the server prefers (decided once, as that
        does not change while we run)."""
        self._sink = sink
        for key, kind in SERVERS.items():
            setting = wanted.get(key)
            if setting is False or (setting is None and not kind.available()):
                continue
            if setting is None and kind.on_demand:
                self._on_demand.add(key)
                continue
            self._start(key)

    def _start(self, key: str) -> DataServer:
        assert self._sink is not None, "start_configured() names the sink"
        return self._adopt(key, SERVERS[key].start(self._settings, self._sink))

    def _adopt(self, key: str, server: DataServer) -> DataServer:
        """Hand a created server every span registered so far, and run it."""
        try:
            for memory in self._memory:
                server.add_memory(memory)
        except BaseException:
            server.close()
            raise
        self._running[key] = server
        return server

    def add_memory(self, memory: Memory) -> None:
        """The receiver registered a new span: every server, running or started later, gets it."""
        self._memory.append(memory)
        for server in self._running.values():
            server.add_memory(memory)

    # -- what the session handler asks -------------------------------------------------------

    def serves(self, key: str) -> bool:
        """Is server ``key`` running, or waiting for its first sender?"""
        return key in self._running or key in self._on_demand or key in self._starting

    def get(self, key: str) -> DataServer:
        """The running server ``key`` (a sender's data connection to it is open)."""
        server = self._running.get(key)
        if server is None:
            raise TransportError(f"receiver {self._settings.receiver_name} runs no {key} server")
        return server

    def attachable(self, key: str) -> DataServer | None:
        """The running server ``key`` for a sender that attaches, or None while it is being
        started: its start begins now, on a thread of its own, if it waits for its first
        sender (see the module's docstring). Called under the receiver's lock, as
        :meth:`add_memory` is, so a started server is handed every span exactly once."""
        server = self._running.get(key)
        if server is not None:
            return server
        starting = self._starting.get(key)
        if starting is None:
            if key in self._failed:
                raise TransportError(self._failed[key])
            if key not in self._on_demand:
                raise TransportError(
                    f"receiver {self._settings.receiver_name} does not serve {key}"
                )
            assert self._sink is not None, "start_configured() names the sink"
            self._on_demand.discard(key)
            self._starting[key] = _Starting(key, self._settings, self._sink)
            return None
        if starting.thread.is_alive():
            return None
        del self._starting[key]
        if starting.server is None:
            error = starting.error
            why = str(error) if isinstance(error, TensorWireError) else repr(error)
            self._failed[key] = f"its {key} server could not start: {why}"
            raise TransportError(self._failed[key])
        return self._adopt(key, starting.server)

    def published(self) -> dict[str, dict[str, Any]]:
        """What the welcome says of each server: its details, or nothing yet for one that
        starts when a sender attaches (the details come with the attach)."""
        out = {key: server.details() for key, server in self._running.items()}
        out.update({key: {} for key in (*self._on_demand, *self._starting)})
        return out

    def running(self) -> Iterator[DataServer]:
        return iter(tuple(self._running.values()))

    def __getitem__(self, key: str) -> DataServer:
        return self._running[key]

    def __contains__(self, key: object) -> bool:
        return key in self._running

    def close(self) -> None:
        """Stop every server; a server holding memory registrations drops them, so this comes
        before the memory is unmapped."""
        for key, starting in self._starting.items():
            starting.thread.join(START_JOIN_TIMEOUT)
            if starting.thread.is_alive():
                log.warning("left the %s server starting after %.0f s", key, START_JOIN_TIMEOUT)
            elif starting.server is not None:
                starting.server.close()
        self._starting.clear()
        for server in self._running.values():
            server.close()
