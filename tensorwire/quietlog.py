"""Warnings about bad input from the network, rate-limited so that nobody can flood a log.

Whoever can reach a receiver's ports can send it garbage, one connection after another; a warning
per bad message would let them fill the host's disk. A :class:`QuietLog` logs the first few
warnings of each *reason* in full, then counts the rest and logs the count once per period
(when the next warning of that reason comes, or at the first :func:`report_due` after the period:
every receiver's control thread calls it on its tick). Reasons
are fixed strings chosen by the code, never taken from the input, so the bookkeeping is bounded.
Every warning, logged or not, is counted in the metrics (``tensorwire_bad_input_total``, labelled
with the reason in snake case).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from . import metrics

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
        _ALL.add(self)

    def warning(self, reason: str, msg: str, *args: object) -> None:
        """Log ``msg % args`` at WARNING unless ``reason`` already had ``burst`` warnings in this
        period; those are counted and reported as one line when the period is over."""
        metrics.count("tensorwire_bad_input_total", reason.replace(" ", "_"))
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

    def report_due(self) -> None:
        """Report the counts of the periods that are over (and forget those windows)."""
        now = self._clock()
        with self._lock:
            due = [r for r, w in self._windows.items() if now - w.start >= self.period]
            for reason in due:
                self._report(reason, self._windows.pop(reason), now)

    def flush(self) -> None:
        """Report every count not reported yet, whether its period is over or not, and start
        afresh."""
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


_ALL: weakref.WeakSet[QuietLog] = weakref.WeakSet()


def report_due() -> None:
    """Every quiet log of the process reports the counts of its periods that are over."""
    for quiet in list(_ALL):
        quiet.report_due()
