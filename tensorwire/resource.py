"""Resource hygiene shared by every object that owns memory, a socket or a thread.

A :class:`Resource` is a context manager whose ``close()`` is idempotent, reports ``closed``, and
warns with a :class:`ResourceWarning` when it is collected without having been closed (then closes
itself), in the manner of pyzmq and UCX-Py.

A forked child leaves the objects it inherited alone: they are its parent's (closing the copy
would unlink the parent's regions and wait for threads the child does not have); the kernel drops
the child's copies of the mappings and sockets when it exits. Nor may the child use them: its
copy of a sender would write with the parent's claims and sequence numbers (a message of the
parent's was lost over ``shm``, and the parent's session cut over ``tcp``), its copy of a
receiver would take the parent's messages. At the fork each is marked closed in the child
(:meth:`Resource._forked`), with a new lock (one a parent's thread held at the fork would be
held for ever), and every call there says to make one of its own.

One still open when the interpreter exits is closed by an :mod:`atexit` hook, newest first (a
sender says goodbye before the receiver it writes to closes). It cannot be left to ``__del__``:
by the time the interpreter collects what its modules held, the daemon threads a close waits for
(grpcio's server, a data server's connection threads) are frozen, and the close would wait for
them forever, so that the program never exits; a close at that point would also leave regions in
``/dev/shm``.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import sys
import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R", bound="Resource")

#: every Resource made and not yet collected, by creation order (closed ones too: cheap to skip)
_live: weakref.WeakValueDictionary[int, Resource] = weakref.WeakValueDictionary()
_made = itertools.count()


class Resource:
    _closed: bool = True  # until a subclass's __init__ has opened something
    name: str = ""

    _pid: int = 0  # the process that made it

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        self = super().__new__(cls)
        self._pid = os.getpid()
        _live[next(_made)] = self
        return self

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:  # pragma: no cover - every subclass overrides it
        self._closed = True

    def __enter__(self: R) -> R:
        return self

    def __reduce__(self) -> Any:
        # Handed to another process (multiprocessing, Ray), pickle failed on whichever lock or
        # socket it met first ("cannot pickle '_thread.RLock' object"), naming neither this
        # object nor what to do instead.
        kind = type(self).__name__
        raise TypeError(
            f"a tensorwire {kind} cannot be pickled or sent to another process: it owns this "
            f"process's sockets, threads and memory. Make the {kind} in the process that uses "
            "it, and pass the receiver's address (a string) instead"
        )

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _forked(self) -> None:
        """In a child forked while this was open: make every later call here refuse (with
        :meth:`_forked_message`), and ``close()`` do nothing; the object is the parent's."""

    def _forked_message(self) -> str:
        kind = type(self).__name__
        return (
            f"{kind.lower()} {self.name} belongs to process {self._pid}, which forked this one "
            f"({os.getpid()}): its sessions, claims and sequence numbers are that process's, "
            f"so it is closed here; make a {kind} of this process's own (as a DataLoader worker "
            "or a multiprocessing child must)"
        )

    def _close_unclosed(self) -> None:
        """Close what its owner forgot to, saying so (in the process that made it only)."""
        if self._closed or self._pid != os.getpid():
            return
        warnings.warn(
            f"unclosed tensorwire {type(self).__name__} {self.name}",
            ResourceWarning,
            stacklevel=2,
        )
        with contextlib.suppress(Exception):
            self.close()

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # Once the interpreter is finalizing, closing could wait forever on a frozen daemon
        # thread; the atexit hook below has closed everything that was open by then. (The
        # function is bound here: an object collected late in the interpreter's shutdown
        # found this module's ``sys`` already None, and printed "Exception ignored in
        # Resource.__del__" as a worker of torch 2.3 exited: `make test-floors`.)
        if not _finalizing():
            self._close_unclosed()


def _in_forked_child() -> None:
    for key in list(_live.keys()):
        resource = _live.get(key)
        if resource is not None and not resource._closed:
            resource._forked()


os.register_at_fork(after_in_child=_in_forked_child)


@atexit.register
def _close_at_exit() -> None:
    for key in sorted(_live.keys(), reverse=True):
        resource = _live.get(key)
        if resource is not None:
            resource._close_unclosed()
