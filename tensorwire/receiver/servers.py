"""The data servers a receiver runs for its networked transports.

Which servers exist is declared in :mod:`tensorwire.transports` (``SERVERS``); this module starts
them (with the receiver, or when the first sender attaches, as each prefers), hands each one every
span of registered memory, publishes their details in the welcome, and closes them. It names no
transport.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import TransportError
from ..memory import Memory
from ..transports import SERVERS
from ..transports.base import DataServer, DataSink, ServerSettings


class DataServers:
    def __init__(self, settings: ServerSettings) -> None:
        self._settings = settings
        self._sink: DataSink | None = None  # where the servers deliver; set when they start
        self._running: dict[str, DataServer] = {}  # by key
        self._on_demand: set[str] = set()  # started when the first sender attaches
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
        server = SERVERS[key].start(self._settings, self._sink)
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
        return key in self._running or key in self._on_demand

    def get(self, key: str) -> DataServer:
        """The running server ``key``, started now if it waits for its first sender."""
        server = self._running.get(key)
        if server is not None:
            return server
        if key not in self._on_demand:
            raise TransportError(f"receiver {self._settings.receiver_name} does not serve {key}")
        self._on_demand.discard(key)
        return self._start(key)

    def published(self) -> dict[str, dict[str, Any]]:
        """What the welcome says of each server: its details, or nothing yet for one that
        starts when a sender attaches (the details come with the attach)."""
        out = {key: server.details() for key, server in self._running.items()}
        out.update({key: {} for key in self._on_demand})
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
        for server in self._running.values():
            server.close()
