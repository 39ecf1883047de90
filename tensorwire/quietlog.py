"""Warnings about bad input from the network, rate-limited so that nobody can flood a log.

Whoever can reach a receiver's ports can send it garbage, one connection after another; a warning
per bad message would let them fill the host's disk. A :class:`QuietLog` logs the first few
warnings of each *reason* in full, then counts the rest and logs the count once per period
(when the next warning of that reason comes, or when :meth:`QuietLog.flush` is called). Reasons
are fixed strings chosen by the code, never taken from the input, so the bookkeeping is bounded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: warnings of one reason logged in full per period
BURST = 5
#: seconds between the counts of what was not logged
PERIOD = 60.0


@dataclass
class _Window:
    start: float
    shown: int = 0
    hidden: int = 0


class QuietLog:
    def __init__(
        self,
        logger: logging.Logger,
        burst: int = BURST,
        period: float = PERIOD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self.burst = burst
        self.period = period
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()  # warnings come from control, data and accept threads

    def warning(self, reason: str, msg: str, *args: object) -> None:
        """Log ``msg % args`` at WARNING unless ``reason`` already had ``burst`` warnings in this
        period; those are counted and reported as one line when the period is over."""
        now = self._clock()
        with self._lock:
            window = self._windows.get(reason)
            if window is None or now - window.start >= self.period:
                if window is not None:
                    self._report(reason, window, now)
                window = self._windows[reason] = _Window(now)
            if window.shown >= self.burst:
                window.hidden += 1
                return
            window.shown += 1
        self._logger.warning(msg, *args)

    def flush(self) -> None:
        """Report every count not reported yet and start afresh. (Nothing calls it on a timer: a
        count is otherwise reported when the next warning of its reason comes after the
        period.)"""
        now = self._clock()
        with self._lock:
            for reason, window in self._windows.items():
                self._report(reason, window, now)
            self._windows.clear()

    def _report(self, reason: str, window: _Window, now: float) -> None:
        if window.hidden:
            self._logger.warning(
                "%s: %d more in the last %.0f s, not logged one by one",
                reason,
                window.hidden,
                now - window.start,
            )
