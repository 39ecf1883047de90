"""Checks of the numbers a caller hands the public API: shapes' dimensions, sizes and counts
(a ring's depth, copy threads, NIXL's cache sizes, a region's bytes), and amounts (CPUs per
process, seconds); of lists that must name each thing once (a job's servers); and of the
options that must be of one kind (a switch that is a bool, not a string that is true).

int() would take 3.5 for 3, "3" for 3 and True for 1: a size or a count the caller never
wrote, found out (if ever) far from the call. Here they are refused where they are given.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

#: The longest wait, interval or timeout the API takes, in seconds (about 31 years). Past it
#: the clocks, sockets and threads a wait reaches overflow: a sender's timeout of 1e30 raised
#: OverflowError from its first wait, a receiver's frame_timeout of 1e30 failed each data
#: connection in its thread (a socket's timeval), a heartbeat_timeout of 1e30 ended the
#: receiver's control thread (a welcome's milliseconds), and an infinite one refused every
#: hello. None says "no limit" where one may be left out.
MAX_SECONDS = 1e9


def whole_number(value: Any) -> int:
    """``value`` as an int where it is a whole number of any integer type (numpy's too);
    TypeError for a float, a string or a bool."""
    if isinstance(value, bool):
        raise TypeError(f"a bool is not a number of things: {value!r}")
    return operator.index(value)


def check_count(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an int, where it is a whole number of at least ``minimum`` (and at most
    ``maximum``, where given); else a ValueError that names ``name``."""
    try:
        count = whole_number(value)
    except TypeError:
        count = None
    if count is None or count < minimum or (maximum is not None and count > maximum):
        most = "" if maximum is None else f" and at most {maximum}"
        raise ValueError(
            f"{name} must be a whole number of at least {minimum}{most}, got {value!r}"
        )
    return count


def check_amount(name: str, value: Any, *, positive: bool = False, most: float = math.inf) -> float:
    """``value`` as a float, where it is a finite real number of at least 0 (more than 0 where
    ``positive``), and at most ``most``; else a ValueError that names ``name``. NaN compares
    false with every bound, so a check of the bound alone passed it."""
    try:
        amount = None if isinstance(value, (bool, str)) else float(value)
    except (TypeError, ValueError):
        amount = None
    if (
        amount is None
        or not math.isfinite(amount)
        or amount < 0
        or (positive and amount == 0)
        or amount > most
    ):
        wanted = "a positive number" if positive else "a number of at least 0"
        if most < math.inf:
            wanted += f" of at most {most:g}"
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return amount


def check_kind(name: str, value: Any, kinds: tuple[type, ...], wanted: str) -> Any:
    """``value`` where it is an instance of one of ``kinds`` (``type(None)`` among them lets
    None pass); else a TypeError that names ``name`` and what was ``wanted``. A switch tested
    for its truth took anything: ``insecure="false"`` is true, and admitted unauthenticated
    senders; a bind address or name of another type failed deep inside, an AttributeError."""
    if not isinstance(value, kinds):
        raise TypeError(f"{name} must be {wanted}, got {value!r:.80}")
    return value


def check_distinct(name: str, values: Sequence[str]) -> None:
    """A ValueError that names ``name`` and the values it holds more than once, if any."""
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise ValueError(f"{name} names {', '.join(repeated)} more than once")
