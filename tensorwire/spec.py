"""Tensor specs: the static-shape contract between a receiver and its senders.

A :class:`TensorSpec` names a tensor, its dtype and its shape. A shape made only of integers is
*static*: its byte count is fixed at registration and every write must match it exactly. A shape
with ``None`` in some dimensions is *dynamic*: the free dimensions are chosen per write, bounded by
``max_bytes``. This module checks arrays against specs; it never touches a buffer.
"""

from __future__ import annotations

import difflib
import math
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .checks import whole_number
from .cuda import array_device, as_device_array, cupy
from .dtypes import as_host_array, canonical_dtype, dtype_to_wire, plain_array
from .errors import SpecMismatchError
from .received import ReceivedArray

#: A dynamic tensor's header carries its shape; bound the rank so the header stays small.
MAX_DYNAMIC_NDIM = 16

Shape = tuple[int | None, ...]

#: Tensor names are at most this many bytes of UTF-8
MAX_NAME_BYTES = 255
#: How many names an error lists before it lists only the nearest few
NAMES_LISTED = 12

_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80


def shown_name(name: Any) -> str:
    """``repr(name)``, shortened: an error names what it was given without echoing 70 KB."""
    return _SHOWN.repr(name)


def name_problem(name: Any) -> str | None:
    """What is wrong with ``name`` as a tensor name, or None: a non-empty string of at most
    255 bytes of UTF-8 (a lone surrogate has no UTF-8, and would fail later, on the wire)."""
    if not isinstance(name, str) or not name:
        return f"tensor name must be a non-empty string, not {shown_name(name)}"
    try:
        size = len(name.encode())
    except UnicodeEncodeError as exc:
        return f"tensor name {shown_name(name)} has no UTF-8 form ({exc.reason} at {exc.start})"
    if size > MAX_NAME_BYTES:
        return f"tensor name {shown_name(name)} is {size} bytes of UTF-8; at most {MAX_NAME_BYTES}"
    return None


def names_listed(name: Any, known: Iterable[str]) -> str:
    """The names an unknown-name error offers instead: all of a few, or how many there are
    and the nearest to ``name`` (a model's hundreds of parameters are not one line)."""
    names = sorted(known)
    if len(names) <= NAMES_LISTED:
        return ", ".join(names) or "none"
    near = difflib.get_close_matches(name, names, n=3) if isinstance(name, str) else []
    if near:
        return f"{len(names)} tensors, the nearest {', '.join(near)}"
    return f"{len(names)} tensors, among them {', '.join(names[:3])}"


def _format(dtype: np.dtype[Any], shape: Shape) -> str:
    dims = ", ".join("?" if d is None else str(d) for d in shape)
    return f"{dtype}[{dims}]"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """What a receiver registered under ``name``: dtype, shape and, for dynamic shapes, capacity."""

    name: str
    shape: Shape
    dtype: np.dtype[Any]
    max_bytes: int
    #: a dimension is None (chosen per write); computed once, since every message asks
    dynamic: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dynamic", any(d is None for d in self.shape))

    @classmethod
    def create(cls, name: str, shape: Any, dtype: Any, max_bytes: int | None = None) -> TensorSpec:
        """Validate and build a spec; ``max_bytes`` is required when a dimension is ``None``."""
        problem = name_problem(name)
        if problem:
            raise SpecMismatchError(problem)
        dt = canonical_dtype(dtype)
        if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
            shape = (int(shape),)
        try:
            if isinstance(shape, (str, bytes, bytearray)):
                # sequences, but of characters: "" read as a scalar's shape, b"f4" as (102, 52)
                raise TypeError
            items = tuple(shape)
        except TypeError as exc:
            raise SpecMismatchError(
                f"tensor {name!r}: shape must be a sequence of dimensions, e.g. (3, 4), got "
                f"{shape!r}"
            ) from exc
        try:
            dims: Shape = tuple(None if d is None else whole_number(d) for d in items)
        except TypeError as exc:
            raise SpecMismatchError(
                f"tensor {name!r}: each dimension of a shape must be a whole number (or None "
                f"for a dynamic one), got {shape!r}"
            ) from exc
        if any(d is not None and d < 0 for d in dims):
            raise SpecMismatchError(f"tensor {name!r}: negative dimension in shape {shape!r}")
        dynamic = any(d is None for d in dims)
        if dynamic:
            if len(dims) > MAX_DYNAMIC_NDIM:
                raise SpecMismatchError(
                    f"tensor {name!r}: a dynamic shape has at most {MAX_DYNAMIC_NDIM} dimensions"
                )
            try:
                capacity = whole_number(max_bytes)
            except TypeError:
                capacity = 0
            if capacity <= 0:
                raise SpecMismatchError(
                    f"tensor {name!r}: shape {shape!r} is dynamic, so max_bytes (its capacity) "
                    f"must be given as a positive integer, got {max_bytes!r}"
                )
            # The smallest message but an empty one: one along each dynamic dimension. A
            # capacity below it holds only empty messages, which is a mistake (max_bytes is
            # in bytes, not elements), not a tensor anyone means to register.
            smallest = math.prod(1 if d is None else d for d in dims) * dt.itemsize
            if capacity < smallest:
                raise SpecMismatchError(
                    f"tensor {name!r}: max_bytes={capacity} holds no message of shape "
                    f"{_format(dt, dims)}: the smallest that is not empty is {smallest} bytes "
                    "(max_bytes is in bytes)"
                )
        else:
            capacity = math.prod(d for d in dims if d is not None) * dt.itemsize
            if max_bytes is not None and max_bytes != capacity:
                raise SpecMismatchError(
                    f"tensor {name!r}: static shape {shape!r} of {dt} is {capacity} bytes; "
                    f"max_bytes={max_bytes} contradicts it (leave it out for static shapes)"
                )
        return cls(name=name, shape=dims, dtype=dt, max_bytes=capacity)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def static_shape(self) -> tuple[int, ...]:
        """The shape of a static spec (raises for a dynamic one)."""
        if self.dynamic:
            raise SpecMismatchError(f"tensor {self.name!r} has a dynamic shape {self.describe()}")
        return tuple(d for d in self.shape if d is not None)

    def describe(self) -> str:
        """Human form, e.g. ``float32[1024, ?] (<= 1048576 bytes)``."""
        text = _format(self.dtype, self.shape)
        if self.dynamic:
            return f"{text} (<= {self.max_bytes} bytes)"
        return f"{text} ({self.max_bytes} bytes)"

    def check_shape(self, shape: tuple[int, ...], dtype: np.dtype[Any] | None = None) -> int:
        """Check that a tensor of ``shape`` (and ``dtype``) may be written; return its bytes."""
        dt = self.dtype if dtype is None else dtype
        nbytes = math.prod(shape) * dt.itemsize
        if dt != self.dtype and dt.newbyteorder("=") == self.dtype.newbyteorder("="):
            # The same type in the other byte order (a big-endian file's data, say): its name
            # reads like the registered one's, so say what differs and the one-line remedy.
            problem = (
                f"byte order mismatch (the tensor is {self.dtype.str}: "
                f"send x.astype({self.dtype.str!r}))"
            )
        elif dt != self.dtype:
            problem = "dtype mismatch"
        elif any(d < 0 for d in shape):
            problem = "negative dimension"
        elif len(shape) != len(self.shape) or any(
            want is not None and want != got for want, got in zip(self.shape, shape, strict=True)
        ):
            problem = "shape mismatch"
        elif nbytes > self.max_bytes:
            problem = f"{nbytes} bytes exceed the registered capacity"
        else:
            return nbytes
        given = f"{_format(dt, tuple(shape))} ({nbytes} bytes)"
        raise SpecMismatchError(
            f"tensor {self.name!r}: {problem}: expected {self.describe()}, got {given}"
        )

    def check_array(self, array: Any, *, allow_copy: bool = False) -> Any:
        """Return ``array`` as a C-contiguous array that may be written under this spec: a
        numpy array for host memory, a cupy array over the same memory for a GPU array (cupy,
        torch CUDA, anything with ``__dlpack__`` or ``__cuda_array_interface__`` on a GPU).

        Refuses (with :class:`SpecMismatchError`) a dtype, shape or byte count that does not
        match, and a non-contiguous array unless ``allow_copy`` is set, in which case a
        contiguous copy is returned.
        """
        if array.__class__ is np.ndarray or array.__class__ is ReceivedArray:
            arr = array
        elif isinstance(array, np.ndarray):  # a subclass: np.matrix, np.memmap, masked
            arr = plain_array(array, self.name)
        elif array_device(array) is not None:
            arr = as_device_array(array, self.name)
        else:
            arr = as_host_array(array, self.name)
        if arr.shape != self.shape or arr.dtype != self.dtype:  # the static fast path misses
            self.check_shape(arr.shape, arr.dtype)
        if not arr.flags.c_contiguous:
            if not allow_copy:
                raise SpecMismatchError(
                    f"tensor {self.name!r}: the array is not C-contiguous (strides {arr.strides}); "
                    "pass a contiguous array, or allow_copy=True to send a contiguous copy"
                )
            host = isinstance(arr, np.ndarray)
            arr = np.ascontiguousarray(arr) if host else cupy().ascontiguousarray(arr)
        return arr

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": dtype_to_wire(self.dtype),
            "max_bytes": self.max_bytes,
        }
