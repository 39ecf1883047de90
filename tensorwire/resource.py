"""Resource hygiene shared by every object that owns memory, a socket or a thread.

A :class:`Resource` is a context manager whose ``close()`` is idempotent, reports ``closed``, and
warns with a :class:`ResourceWarning` when it is collected without having been closed (then closes
itself), in the manner of pyzmq and UCX-Py.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, TypeVar

R = TypeVar("R", bound="Resource")


class Resource:
    _closed: bool = True  # until a subclass's __init__ has opened something
    name: str = ""

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:  # pragma: no cover - every subclass overrides it
        self._closed = True

    def __enter__(self: R) -> R:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not self._closed:
            warnings.warn(
                f"unclosed tensorwire {type(self).__name__} {self.name}",
                ResourceWarning,
                stacklevel=1,
            )
            with contextlib.suppress(Exception):
                self.close()
