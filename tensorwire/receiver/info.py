"""What a receiver publishes about itself beside its tensors: ``Receiver(info=...)``.

A program's own facts for its senders to read before they write (``Sender.receiver_info``):
the size of a job, the settings its servers must share, a model's version. They travel in the
welcome every sender gets, so they are checked here, where they are given, and not found wrong
at a sender: a flat map of names to scalars, small enough for one control message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgpack

#: The most bytes the published facts may take once encoded (they ride in every welcome).
INFO_MAX_BYTES = 64 << 10

#: The kinds of value a fact may be: what msgpack carries as itself both ways.
_SCALARS = (str, int, float, bool, type(None))


def checked_info(info: Mapping[str, Any] | None) -> dict[str, Any]:
    """``info`` as the plain dict a receiver publishes; ValueError (TypeError for a wrong
    kind of thing) naming what is wrong: a key that is not a non-empty str, a value that is
    not a str, int, float, bool or None (a list or a numpy number among them), an int beyond
    64 bits, a float that is not finite, or more than INFO_MAX_BYTES in all."""
    if info is None:
        return {}
    if not isinstance(info, Mapping):
        raise TypeError(f"info must be a mapping of names to values, got {type(info).__name__}")
    out: dict[str, Any] = {}
    for key, value in info.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"info: each name must be a non-empty str, got {key!r}")
        if type(value) not in _SCALARS:
            raise TypeError(
                f"info[{key!r}]: a value must be a str, int, float, bool or None, got "
                f"{type(value).__name__} {value!r:.60}"
            )
        if type(value) is int and not -(1 << 63) <= value < (1 << 64):
            raise ValueError(f"info[{key!r}]: {value} does not fit in 64 bits")
        if type(value) is float and not math.isfinite(value):
            raise ValueError(f"info[{key!r}]: {value} is not a finite number")
        out[key] = value
    size = len(msgpack.packb(out, use_bin_type=True))
    if size > INFO_MAX_BYTES:
        raise ValueError(
            f"info takes {size} bytes encoded, more than the {INFO_MAX_BYTES} a receiver may "
            "publish (it travels in every welcome): publish large data as a tensor"
        )
    return out
