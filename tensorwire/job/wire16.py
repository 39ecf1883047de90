"""The parameter server's 16-bit wire (``--wire-dtype float16`` or ``bfloat16``): float32 arrays
rounded into the wire's dtype, and wire arrays widened back into float32, on the host.

numpy's own float32 -> float16 cast takes a slow path for every value that becomes a float16
subnormal or zero (below 2**-14 in magnitude: 63 ns a value against 1.9 ns, measured on the
2-core VM with numpy 2.4), and gradients are mostly such values: a worker of the ``many`` model
spent 13 ms a pack rounding its gradients, and its job ran at 7 steps/s over ``tcp`` against 35
in float32 and 31 in bfloat16 (whose casts, ml_dtypes', have no such path). The widening cast
back is 10 times slower on those values too. Here, float16 takes:

* rounding: numpy's cast for the values that stay normal, and for the others the float32 sum
  ``|x| + 0.5``, whose rounding to a multiple of 2**-24 (the float32 spacing at 0.5) is the
  round-to-nearest-even of the cast to a float16 subnormal, so that the difference of the bits
  is the float16's bits (Fabian Giesen's ``float_to_half_fast3_rtne``); the bits are numpy's
  cast's, every one (``tests/test_dtypes.py -k wire16``). The ``many`` model's gradients (half
  their values small) take 13.5 ms a step, against 68.7 by numpy's cast;
* widening: a table of the 65,536 float16 values as float32, looked up by the bits.

Where few values are small, numpy's cast alone is faster, and is used.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

#: below this magnitude a float32 value becomes a float16 subnormal (or zero)
_HALF_MIN_NORMAL = np.float32(2.0**-14)
#: the bits of 0.5 in float32, whose spacing is 2**-24, the float16 subnormals' step
_HALF_BITS = np.uint32(0x3F000000)
#: numpy's cast is used alone where at most one value in this many is small: its slow path
#: costs about 30 of its fast values each (63 against 1.9 ns), and this module's way about
#: 2.5 times numpy's fast cast of the whole array
_FEW_SMALL = 64


@functools.cache
def _half_to_float() -> np.ndarray[Any, np.dtype[np.float32]]:
    """Every float16 value as float32, by its bits (256 KiB, made once)."""
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


def narrow_into(out: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
    """``out[...] = src``: float32 ``src`` rounded to nearest (even) into ``out``'s dtype, the
    bits numpy's cast gives, without its slow path for small values where ``out`` is float16.
    Both host arrays of one shape, any layout."""
    if out.dtype != np.float16 or src.dtype != np.float32:
        out[...] = src
        return
    magnitude = np.abs(src)
    small = magnitude < _HALF_MIN_NORMAL
    if np.count_nonzero(small) * _FEW_SMALL <= small.size:
        out[...] = src
        return
    # numpy's cast of the magnitudes, the small ones raised to the least normal: its fast
    # path for every value (NaN and infinity kept); the small ones' bits and the sign follow
    scratch = np.maximum(magnitude, _HALF_MIN_NORMAL)
    out[...] = scratch
    half = out.view(np.uint16)
    np.minimum(magnitude, _HALF_MIN_NORMAL, out=magnitude)
    magnitude += np.float32(0.5)  # rounded to a multiple of 2**-24, to nearest even
    bits = magnitude.view(np.uint32)
    bits -= _HALF_BITS
    np.copyto(half, bits, casting="unsafe", where=small)
    sign = scratch.view(np.uint32)
    np.right_shift(src.view(np.uint32), np.uint32(16), out=sign)
    sign &= np.uint32(0x8000)
    np.bitwise_or(half, sign, out=half, casting="unsafe")


def widen_into(out: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
    """``out[...] = src``: 16-bit ``src`` widened into float32 ``out`` (exactly), float16 by
    table. Both host arrays of one shape."""
    if src.dtype != np.float16 or out.dtype != np.float32:
        np.copyto(out, src)
        return
    np.take(_half_to_float(), src.view(np.uint16), out=out, mode="clip")
