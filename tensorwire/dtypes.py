"""The element types tensors may have, and how arrays from other libraries become numpy arrays.

Every dtype moves as raw bytes, so what matters is that both ends agree on its name and size.
numpy's own numeric kinds (bool, integers, floats, complex) travel as numpy's dtype string
(``"<f4"``). The formats of mixed-precision training that numpy lacks, ``bfloat16`` and the
``float8_*`` family, come from `ml_dtypes <https://github.com/jax-ml/ml_dtypes>`_ (the package
JAX uses for them in numpy) and travel by name, since numpy spells them all ``"<V2"``/``"<V1"``.
A dtype may be given as a numpy dtype or type, a name (``"bfloat16"``), an ``ml_dtypes`` type or
a PyTorch dtype (``torch.bfloat16``: read by name, torch is never imported for it).

:func:`as_host_array` turns what a user writes into a numpy array without copying: numpy arrays as
they are (a subclass's as a plain view; masked arrays refused), PyTorch CPU tensors through DLPack
(detached when they require grad; bfloat16 and float8 reinterpreted, as numpy's DLPack import does
not know them), other DLPack objects through numpy (theirs too: :mod:`tensorwire.dlpack`), and
array-interface objects through numpy. Anything else is refused with
a :class:`SpecMismatchError` naming it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import SpecMismatchError

#: numpy dtype kinds that move as raw bytes: bool, signed, unsigned, float, complex.
_NUMPY_KINDS = frozenset("biufc")


def of_ml_dtypes(dt: np.dtype[Any]) -> bool:
    """Is ``dt`` one of ml_dtypes' formats? Asked of the dtype itself (registered with numpy,
    ``isbuiltin`` 2, by a type of ml_dtypes' module), so that numpy's own dtypes never import
    ml_dtypes: its extension takes 0.6-1.5 s to load (0.7.0, on this project's machines; 0.6.0
    0.03 s: perf puts most of it in numpy's ``PyUFunc_AddLoop``, whose search through the loops
    already added grows with each of 0.7.0's many more), all of it holding the GIL, where a
    sender's first spec lookup made its heartbeats miss a 0.6 s receiver timeout and its
    session was dropped."""
    return dt.isbuiltin == 2 and dt.type.__module__.split(".")[0] == "ml_dtypes"


@functools.cache
def ml_dtypes_by_name() -> dict[str, np.dtype[Any]]:
    """``bfloat16`` and every ``float8_*`` format of the installed ml_dtypes, by name."""
    import ml_dtypes  # imported on first use: registers the types with numpy

    names = ["bfloat16", *sorted(n for n in dir(ml_dtypes) if n.startswith("float8_"))]
    return {n: np.dtype(getattr(ml_dtypes, n)) for n in names}


def supported_names() -> list[str]:
    """Every dtype name a tensor may have, for error messages and documentation."""
    numpy_names = [
        "bool",
        *(f"int{b}" for b in (8, 16, 32, 64)),
        *(f"uint{b}" for b in (8, 16, 32, 64)),
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    ]
    return numpy_names + list(ml_dtypes_by_name())


def canonical_dtype(dtype: Any) -> np.dtype[Any]:
    """``dtype`` as a numpy dtype, refusing what does not move as plain bytes."""
    if type(dtype).__module__ == "torch":  # torch.bfloat16 -> "bfloat16"; torch stays unimported
        dtype = str(dtype).removeprefix("torch.")
    if dtype is None:
        # numpy reads None as float64: a lookup that found nothing registered float64 tensors,
        # and every float32 write to them was refused later, far from the cause
        raise SpecMismatchError(
            f"not a dtype: None (numpy would take it as float64); give the tensor's dtype, "
            f"e.g. 'float32'; supported: {', '.join(supported_names())}"
        )
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        # numpy does not know ml_dtypes' names ("bfloat16") until ml_dtypes is imported
        if isinstance(dtype, str) and dtype in ml_dtypes_by_name():
            return ml_dtypes_by_name()[dtype]
        raise SpecMismatchError(
            f"not a dtype: {dtype!r}; supported: {', '.join(supported_names())}"
        ) from exc
    plain = dt.fields is None and dt.subdtype is None
    if plain and of_ml_dtypes(dt):  # float8_e5m2's kind is "f": asked first
        if ml_dtypes_by_name().get(dt.name) == dt:
            return dt
    elif plain and dt.kind in _NUMPY_KINDS:
        return dt
    raise SpecMismatchError(
        f"dtype {dt} is not supported: only numpy's bool, integer, float and complex dtypes and "
        f"ml_dtypes' bfloat16 and float8 formats move as raw bytes; supported: "
        f"{', '.join(supported_names())}"
    )


@functools.cache
def exports_buffer(dtype: np.dtype[Any]) -> bool:
    """Can an array of ``dtype`` be seen as bytes through the buffer protocol
    (``array.data.cast("B")``, the cheapest byte view)? Not ml_dtypes' formats: numpy refuses
    to export them (``cannot include dtype 'E' in a buffer``); their bytes are reached through
    a ``uint8`` view instead."""
    try:
        np.zeros(1, dtype).data.cast("B")
    except (ValueError, TypeError):
        return False
    return True


def dtype_to_wire(dtype: np.dtype[Any]) -> str:
    """How a spec's dtype travels: numpy's dtype string, or the ml_dtypes name."""
    return dtype.name if of_ml_dtypes(dtype) else dtype.str


# -- arrays from elsewhere -------------------------------------------------------------------


def _describe(obj: Any) -> str:
    kind = type(obj)
    if kind.__module__ == "builtins":
        return kind.__name__
    return f"{kind.__module__}.{kind.__qualname__}"


def _from_torch(tensor: Any, name: str) -> np.ndarray[Any, Any]:
    if tensor.device.type != "cpu":  # CUDA tensors are read as GPU arrays (tensorwire.cuda)
        raise SpecMismatchError(
            f"tensor {name!r}: got a torch tensor on {tensor.device}; tensorwire writes host and "
            "CUDA memory: move it with .cpu() first"
        )
    array: np.ndarray[Any, Any] = import_torch(tensor, np.from_dlpack, name)
    return array


def import_torch(tensor: Any, from_dlpack: Callable[[Any], Any], name: str) -> Any:
    """A torch tensor (CPU or CUDA) imported through DLPack over the same memory, by
    ``from_dlpack`` (numpy's or cupy's): without its autograd graph, lazy conjugate/negative
    views materialised, and a dtype the importers lack (bfloat16, float8: numpy and cupy have
    no DLPack code for them) imported as a plain integer of the same size and viewed back."""
    import torch  # the caller holds a torch tensor, so torch is imported already

    # Tensors that are not one block of elements: DLPack refuses them, in words that name
    # torch's internals (a nested tensor's "Internal error ... Please file an issue").
    if getattr(tensor, "is_nested", False):
        raise SpecMismatchError(
            f"tensor {name!r}: got a nested torch tensor; tensorwire writes dense tensors: send "
            "x.to_padded_tensor(0), or each of x.unbind() to a tensor of its own"
        )
    if tensor.layout is not torch.strided:
        raise SpecMismatchError(
            f"tensor {name!r}: got a torch tensor of layout {tensor.layout}; tensorwire writes "
            "dense tensors: send x.to_dense()"
        )
    if tensor.is_quantized:
        raise SpecMismatchError(
            f"tensor {name!r}: got a quantized torch tensor ({tensor.dtype}); send "
            "x.dequantize() (its values) or x.int_repr() (its integers, beside its scale)"
        )
    if tensor.requires_grad:
        tensor = tensor.detach()  # the same memory, without the autograd graph
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()  # lazy views DLPack cannot carry
    ml = ml_dtypes_by_name().get(str(tensor.dtype).removeprefix("torch."))
    if ml is None:
        return from_dlpack(tensor)
    same_size = {1: torch.uint8, 2: torch.int16}[ml.itemsize]
    return from_dlpack(tensor.view(same_size)).view(ml)


def plain_array(obj: np.ndarray[Any, Any], name: str) -> np.ndarray[Any, Any]:
    """A numpy subclass's array as a plain ndarray over the same memory: the transports read
    a plain array's bytes, shape and strides, which a subclass may answer otherwise (a
    ``np.matrix`` stays two-dimensional when flattened, a masked array's ``tobytes`` fills
    its masked elements). A masked array is refused: its mask cannot travel, and what lies
    under the mask is no value."""
    if isinstance(obj, np.ma.MaskedArray):
        raise SpecMismatchError(
            f"tensor {name!r}: got a masked array, whose mask cannot travel: send "
            "x.filled(value) (masked elements replaced) or x.data (the raw values)"
        )
    return obj.view(np.ndarray)


def as_host_array(obj: Any, name: str) -> np.ndarray[Any, Any]:
    """``obj`` as a numpy array over the same memory where it can be (see the module's
    docstring); :class:`SpecMismatchError` for what cannot be written."""
    if isinstance(obj, np.ndarray):
        return obj if obj.__class__ is np.ndarray else plain_array(obj, name)
    if obj is None or isinstance(obj, (str, bytes, bytearray, dict)):
        raise SpecMismatchError(f"tensor {name!r}: expected an array, got {_describe(obj)}")
    try:
        if type(obj).__module__.startswith("torch"):
            arr = _from_torch(obj, name)
        elif hasattr(obj, "__dlpack__") and not hasattr(obj, "__array_interface__"):
            from .dlpack import from_dlpack  # (which imports this module)

            arr = from_dlpack(obj)
        else:
            arr = np.asarray(obj)
    except SpecMismatchError:
        raise
    except Exception as exc:  # numpy, DLPack and torch each raise their own kinds
        raise SpecMismatchError(
            f"tensor {name!r}: cannot read a {_describe(obj)} as an array in host memory: {exc}"
        ) from None
    if arr.dtype.kind == "O":
        raise SpecMismatchError(
            f"tensor {name!r}: expected an array of numbers, got {_describe(obj)} (numpy makes "
            "an object array of it)"
        )
    return arr
