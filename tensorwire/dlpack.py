"""DLPack for the dtypes numpy cannot name in it: ``bfloat16`` and the ``float8_*`` formats.

DLPack has a type code for each of them (``kDLBfloat``, ``kDLFloat8_e4m3fn`` ...: dlpack.h,
version 1.1 on), and PyTorch reads and writes them, but numpy's own ``__dlpack__`` and
``from_dlpack`` before 2.5 refuse every dtype outside its integer, float and complex kinds
("DLPack only supports signed/unsigned integers, float and complex dtypes"). A received
bfloat16 slot could not reach ``torch.from_dlpack``, nor a bfloat16 array of another library
reach a write. (numpy 2.5 lets a dtype's package register its code,
``numpy.dtypes.register_dlpack_dtype``, and ml_dtypes 0.7 registers these codes: what is done
here gives the same capsules, for every numpy the project supports.)

Both ways go through an unsigned integer of the same size, which numpy does export: the capsule
numpy makes of that view is the tensor's, but for its type code, which is set here in the
capsule's ``DLTensor`` before the consumer sees it (and, importing, set to unsigned before numpy
sees it, the array then viewed as the ml_dtypes type). Only the one byte of the code changes;
the capsule keeps numpy's (or the producer's) deleter, so the memory is owned as before.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .dtypes import ml_dtypes_by_name, of_ml_dtypes

#: DLDataTypeCode (dlpack.h) of each ml_dtypes format that has one
ML_CODES = {
    "bfloat16": 4,  # kDLBfloat
    "float8_e3m4": 7,
    "float8_e4m3": 8,
    "float8_e4m3b11fnuz": 9,
    "float8_e4m3fn": 10,
    "float8_e4m3fnuz": 11,
    "float8_e5m2": 12,
    "float8_e5m2fnuz": 13,
    "float8_e8m0fnu": 14,
}
_FORMAT_OF_CODE = {code: name for name, code in ML_CODES.items()}
K_DL_UINT = 1
#: where DLTensor lies in a capsule's struct: first in DLManagedTensor ("dltensor"), after the
#: version, manager context, deleter and flags (8 bytes each) in DLManagedTensorVersioned
DL_TENSOR_AT = {b"dltensor": 0, b"dltensor_versioned": 32}
#: DLTensor's dtype: after data (a pointer), device (two int32) and ndim (int32)
DTYPE_CODE_AT = 20
DTYPE_BITS_AT = 21
_UNSIGNED = {1: np.uint8, 2: np.uint16}


@functools.cache
def _capsule_api() -> tuple[Any, Any]:
    # Prototypes of our own: setting restype/argtypes on ctypes.pythonapi's shared function
    # objects would change them for every other user in the process.
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
    is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
    return (
        get_pointer(("PyCapsule_GetPointer", ctypes.pythonapi)),
        is_valid(("PyCapsule_IsValid", ctypes.pythonapi)),
    )


def _dtype_field(capsule: Any) -> int:
    """The address of the type code in ``capsule``'s DLTensor (an unconsumed DLPack capsule)."""
    get_pointer, is_valid = _capsule_api()
    for name, at in DL_TENSOR_AT.items():
        if is_valid(capsule, name):
            return int(get_pointer(capsule, name)) + at + DTYPE_CODE_AT
    raise BufferError("not an unconsumed DLPack capsule")


def ml_code(dtype: np.dtype[Any]) -> int | None:
    """``dtype``'s DLPack code where numpy has none for it (an ml_dtypes format), else None."""
    if not of_ml_dtypes(dtype):  # (cheap: numpy's own dtypes stop at isbuiltin)
        return None
    code = ML_CODES.get(dtype.name)
    return code if code is not None and ml_dtypes_by_name().get(dtype.name) == dtype else None


def export(array: Any, code: int, base: Any = np.ndarray, **kwargs: Any) -> Any:
    """``array.__dlpack__(**kwargs)`` for an array of an ml_dtypes format (its DLPack ``code``):
    the capsule ``base``'s export (numpy's, or cupy's for GPU memory) makes of the same memory
    as unsigned integers, with the format's code."""
    capsule = base.__dlpack__(array.view(_UNSIGNED[array.dtype.itemsize]), **kwargs)
    ctypes.c_uint8.from_address(_dtype_field(capsule)).value = code
    return capsule


class _Retyped:
    """A DLPack producer as numpy's ``from_dlpack`` is given it: each capsule it makes (as
    numpy asks, DLPack 1.0 or legacy) comes with an ml_dtypes format's code replaced by the
    unsigned integer of its size, and the format kept in :attr:`dtype` to view the array as."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer
        self.dtype: np.dtype[Any] | None = None

    def __dlpack__(self, **kwargs: Any) -> Any:
        capsule = self._producer.__dlpack__(**kwargs)  # (a TypeError: numpy asks the old way)
        field = _dtype_field(capsule)
        code = ctypes.c_uint8.from_address(field).value
        bits = ctypes.c_uint8.from_address(field + DTYPE_BITS_AT - DTYPE_CODE_AT).value
        name = _FORMAT_OF_CODE.get(code)
        dtype = None if name is None else ml_dtypes_by_name().get(name)
        if dtype is not None and dtype.itemsize * 8 == bits:
            ctypes.c_uint8.from_address(field).value = K_DL_UINT
            self.dtype = dtype
        return capsule

    def __dlpack_device__(self) -> Any:
        return self._producer.__dlpack_device__()


def from_dlpack(
    obj: Any,
    importer: Callable[[Any], Any] = np.from_dlpack,
    refusals: tuple[type[Exception], ...] = (BufferError, RuntimeError),
) -> Any:
    """``importer(obj)`` (numpy's ``from_dlpack``, or cupy's for GPU memory), also for a
    producer's bfloat16 or float8 tensor: an array of the ml_dtypes format over the same
    memory. ``refusals``: what the importer raises for a dtype it lacks (numpy: "Unsupported
    dtype in DLTensor", a RuntimeError); any other error, or one for a capsule of another
    dtype, stands as the importer raised it."""
    try:
        return importer(obj)
    except refusals as exc:
        refused = exc
    retyped = _Retyped(obj)
    try:
        array = importer(retyped)
    except refusals:
        raise refused from None
    if retyped.dtype is None:
        raise refused
    return array.view(retyped.dtype)
