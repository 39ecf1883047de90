"""Checks of the whole numbers a caller hands the public API: shapes' dimensions, sizes and
counts (a ring's depth, copy threads, NIXL's cache sizes, a region's bytes).

int() would take 3.5 for 3, "3" for 3 and True for 1: a size or a count the caller never
wrote, found out (if ever) far from the call. Here they are refused where they are given.
"""

from __future__ import annotations

import operator
from typing import Any


def whole_number(value: Any) -> int:
    """``value`` as an int where it is a whole number of any integer type (numpy's too);
    TypeError for a float, a string or a bool."""
    if isinstance(value, bool):
        raise TypeError(f"a bool is not a number of things: {value!r}")
    return operator.index(value)


def check_count(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int, where it is a whole number of at least ``minimum``; else a
    ValueError that names ``name``."""
    try:
        count = whole_number(value)
    except TypeError:
        count = None
    if count is None or count < minimum:
        raise ValueError(f"{name} must be a whole number of at least {minimum}, got {value!r}")
    return count
