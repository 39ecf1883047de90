"""Gradient norms for ``--clip-grad-norm``, which the parameter servers and the workers both
compute: the sum of squares of a gradient's arrays (host or GPU), and the factor that scales a
gradient down to the limit, as ``torch.nn.utils.clip_grad_norm_`` computes it.

Under bsp a server takes the norm of a step's mean gradient (its own shard's, added up over the
shards by the workers where there are several); under asp and ssp each worker takes the norm
of its own whole gradient, which it sends with its push, and every server scales that push by
the same factor."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..cuda import cupy

#: what ``clip_grad_norm_`` adds to the norm before dividing the limit by it
CLIP_EPSILON = 1e-6


def squared_norm(arrays: Iterable[Any]) -> float:
    """The sum of the squares of every element of ``arrays`` (numpy or cupy), in float64: each
    array's in its own dtype (BLAS's dot), added up in float64. On a GPU each array's sum
    stays on the device and they are added up there: one synchronisation for all of them,
    where a ``float()`` of each was one per array (1004 chunks: 1004 waits for the GPU)."""
    total = 0.0
    on_device: list[Any] = []
    for a in arrays:
        if isinstance(a, np.ndarray | np.generic):  # (a numpy scalar too: host memory)
            flat = np.ravel(a)
            total += float(np.vdot(flat, flat))
        else:
            flat = a.ravel()
            on_device.append(cupy().vdot(flat, flat))
    if on_device:
        cp = cupy()
        total += float(cp.stack(on_device).astype(cp.float64).sum())
    return total


def clip_coefficient(limit: float, squares: float) -> float:
    """What a gradient whose squared norm is ``squares`` is multiplied by so that its norm is
    at most ``limit``: ``limit / (norm + 1e-6)`` where that is below 1, else 1 (a NaN norm,
    of a gradient that holds one, leaves it as it is: it is NaN anyway)."""
    coefficient = limit / (math.sqrt(squares) + CLIP_EPSILON)
    return coefficient if coefficient < 1.0 else 1.0
