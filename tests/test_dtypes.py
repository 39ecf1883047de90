"""Dtypes and inputs: bfloat16 and float8 (ml_dtypes), PyTorch tensors, DLPack objects, and the
library's own error for everything that cannot be written.

The byte-exact transfer of every dtype over every transport is in the conformance suite
(``test_every_dtype_byte_exact``); this file covers what users pass in and take out.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tensorwire as tw
from tensorwire.spec import TensorSpec

from .conftest import DLPackProducer, needed, optional_module

TORCH = optional_module("torch")  # (imported here, not in a test: conftest.optional_module)


@pytest.mark.parametrize(
    ("given", "name"),
    [
        ("bfloat16", "bfloat16"),
        (ml_dtypes.bfloat16, "bfloat16"),
        (np.dtype(ml_dtypes.float8_e4m3fn), "float8_e4m3fn"),
        ("float8_e5m2", "float8_e5m2"),
        ("float32", "float32"),
        (np.int64, "int64"),
    ],
)
def test_dtype_names_types_and_the_wire(given: Any, name: str) -> None:
    spec = TensorSpec.create("t", (2, 3), given)
    assert spec.dtype.name == name
    # What the sender rebuilds from the address book is the same spec.
    wire = spec.to_wire()
    again = TensorSpec.create(wire["name"], wire["shape"], wire["dtype"])
    assert again == spec


def test_plain_dtypes_never_import_ml_dtypes() -> None:
    """A job of numpy's own dtypes never loads ml_dtypes, whose extension held the GIL for
    0.6-0.9 s (0.7.0): imported at a sender's first spec lookup, its heartbeats missed a 0.6 s
    receiver timeout and its session was dropped before its first write."""
    script = """
import sys
import numpy as np
import tensorwire as tw
from tensorwire.spec import TensorSpec
with tw.Receiver() as rx:
    rx.register("t", (4,), "float32")
    rx.register("u", (2,), np.int64)
    with tw.Sender.connect(rx.address, transport="shm") as tx:
        tx.write("t", np.ones(4, np.float32))
        assert rx.wait("t", timeout=10).tolist() == [1.0] * 4
TensorSpec.create("v", (2,), np.dtype(">f8").newbyteorder())
print("ml_dtypes" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["False"], out.stderr


@pytest.mark.parametrize("bad", ["object", "U4", "V4", [("a", "f4")], "no-such-type", "datetime64"])
def test_unsupported_dtypes_are_refused_by_name(bad: Any) -> None:
    with pytest.raises(tw.SpecMismatchError, match="supported: bool, int8"):
        TensorSpec.create("t", (2,), bad)


def test_bad_inputs_raise_the_librarys_error_and_leave_the_slot_untouched() -> None:
    class OnlyDLPack:
        """An array library's tensor that numpy knows only through DLPack."""

        def __init__(self, array: np.ndarray[Any, Any]) -> None:
            self._array = array

        def __dlpack__(self, **kwargs: Any) -> Any:
            return self._array.__dlpack__(**kwargs)

        def __dlpack_device__(self) -> Any:
            return self._array.__dlpack_device__()

    with tw.Receiver() as rx:
        rx.register("t", (4,), "float32")
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            for bad, says in [
                (None, "expected an array, got NoneType"),
                ("1234", "expected an array, got str"),
                ({"a": 1}, "expected an array, got dict"),
                ([[1.0], [2.0, 3.0]], "cannot read a list as an array"),
                ([object()] * 4, "expected an array of numbers"),
            ]:
                with pytest.raises(tw.SpecMismatchError, match=says):
                    tx.write("t", bad)
            assert rx.pending("t") == 0
            tx.write("t", OnlyDLPack(np.arange(4, dtype=np.float32)))
            got = rx.wait("t", timeout=10)
            assert got.tolist() == [0.0, 1.0, 2.0, 3.0]
            rx.release("t")


def test_received_views_are_read_only_arrays_whose_arithmetic_is_plain() -> None:
    with tw.Receiver() as rx:
        rx.register("t", (3,), "bfloat16")
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            tx.write("t", np.array([1, 2, 3], dtype=ml_dtypes.bfloat16))
            got = rx.wait("t", timeout=10)
            assert isinstance(got, tw.ReceivedArray) and not got.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                got[0] = 5
            total = got.astype(np.float32) * 2
            assert type(total) is np.ndarray and total.tolist() == [2.0, 4.0, 6.0]
            assert isinstance(got[1:], tw.ReceivedArray) and not got[1:].flags.writeable
            rx.release("t")


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_lent_buffer_is_what_a_ufunc_writes_into_and_its_arithmetic_is_plain(
    transport: str,
) -> None:
    with tw.Receiver() as rx:
        rx.register("t", (2, 2), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
            a = np.array([[1, 2], [3, 4]], np.float32)
            with tx.buffer("t") as out:
                assert out.flags.writeable
                assert np.matmul(a, a, out=out) is out  # numpy hands back its `out`
                assert np.add(out, 1, out=out) is out
                doubled = out * 2  # new memory: a plain array, not a buffer
                assert type(doubled) is np.ndarray
            assert not out.flags.writeable  # lent for the block only
            got = rx.wait("t", timeout=10)
            assert got.tolist() == (a @ a + 1).tolist() and doubled.tolist() == (got * 2).tolist()
            rx.release("t")


# -- PyTorch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_torch_tensors_are_written_as_they_are(transport: str) -> None:
    torch = needed(TORCH, "PyTorch")
    with tw.Receiver() as rx:
        rx.register("bf16", (4, 3), "bfloat16")
        rx.register("fp8", (5,), torch.float8_e4m3fn)  # a torch dtype is taken by name
        rx.register("grad", (3,), torch.float32)
        rx.register("dyn", (None,), "bfloat16", max_bytes=64)
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
            bf16 = torch.randn(4, 3).to(torch.bfloat16)
            fp8 = torch.randn(5).to(torch.float8_e4m3fn)
            weights = torch.ones(3, requires_grad=True)
            tx.write("bf16", bf16)
            tx.write("fp8", fp8)
            tx.write("grad", weights)  # requires_grad: written from the same memory, detached
            tx.write("dyn", torch.arange(7).to(torch.bfloat16))

            got = rx.wait("bf16", timeout=10)
            assert got.dtype == np.dtype(ml_dtypes.bfloat16)
            assert got.view(np.int16).tobytes() == bf16.view(torch.int16).numpy().tobytes()
            got = rx.wait("fp8", timeout=10)
            assert got.view(np.uint8).tobytes() == fp8.view(torch.uint8).numpy().tobytes()
            assert rx.wait("grad", timeout=10).tolist() == [1.0, 1.0, 1.0]
            got = rx.wait("dyn", timeout=10)
            assert got.shape == (7,) and got.astype(np.float32).tolist() == list(range(7))
            for name in ("bf16", "fp8", "grad", "dyn"):
                rx.release(name)


def test_torch_tensors_that_cannot_be_written_are_refused() -> None:
    torch = needed(TORCH, "PyTorch")
    with tw.Receiver() as rx:
        rx.register("t", (3,), "float32")
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            # A tensor neither on the host nor on a GPU ("meta" has no memory at all).
            with pytest.raises(tw.SpecMismatchError, match="on meta; tensorwire writes host and"):
                tx.write("t", torch.empty(3, device="meta"))
            with pytest.raises(tw.SpecMismatchError, match="dtype mismatch"):
                tx.write("t", torch.ones(3, dtype=torch.float64))
            # Not one block of elements: each named with its remedy (before, DLPack's words:
            # a nested tensor's "Internal error ... Please file an issue").
            dense = torch.ones(3)
            with warnings.catch_warnings():  # nested: a prototype; quantized: deprecated
                warnings.simplefilter("ignore", UserWarning)
                nested = torch.nested.as_nested_tensor([dense])
                quantized = torch.quantize_per_tensor(dense, 0.1, 0, torch.quint8)
            for wrong, remedy in (
                (dense.to_sparse(), r"layout torch.sparse_coo; .*x.to_dense\(\)"),
                (nested, r"nested torch tensor; .*unbind"),
                (quantized, r"quantized .*dequantize"),
            ):
                with pytest.raises(tw.SpecMismatchError, match=remedy):
                    tx.write("t", wrong)
            assert rx.pending("t") == 0


def test_legacy_dlpack_consumers_read_the_received_view() -> None:
    torch = needed(TORCH, "PyTorch")
    from torch.utils.dlpack import from_dlpack as legacy_from_dlpack

    with tw.Receiver() as rx:
        rx.register("t", (4,), "float32")
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            tx.write("t", np.arange(4, dtype=np.float32))
            got = rx.wait("t", timeout=10)
            # As jax.dlpack.from_dlpack and older PyTorch ask: __dlpack__() with no max_version,
            # which numpy refuses for a read-only array.
            with pytest.raises(BufferError):
                np.ndarray.__dlpack__(got)
            capsule = got.__dlpack__()
            as_torch = legacy_from_dlpack(capsule)
            assert as_torch.tolist() == [0.0, 1.0, 2.0, 3.0]
            assert as_torch.data_ptr() == got.ctypes.data  # the slot itself, not a copy
            assert torch.from_dlpack(got).tolist() == [0.0, 1.0, 2.0, 3.0]  # DLPack >= 1.0
            del as_torch, capsule
            rx.release("t")


def test_bfloat16_and_float8_views_carry_their_own_dlpack_type() -> None:
    """numpy before 2.5 exports none of them ("DLPack only supports signed/unsigned integers,
    float and complex dtypes"): a received view and a lent buffer do, and come back as the same
    format over the same memory, through a DLPack 1.0 capsule and a legacy one."""

    from tensorwire.dlpack import ML_CODES, from_dlpack

    rng = np.random.default_rng(7)
    with tw.Receiver() as rx:
        for name in ML_CODES:
            rx.register(name, (3, 5), name)
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            for name, code in ML_CODES.items():
                dtype = np.dtype(getattr(ml_dtypes, name))
                sent = rng.integers(0, 256, 15 * dtype.itemsize, np.uint8).view(dtype)
                sent = sent.reshape(3, 5)  # any bit patterns: compared as bytes
                _numpy_exports_as_we_do(sent, code)
                with tx.buffer(name) as out:
                    out[...] = sent
                    lent = from_dlpack(out)  # the slot itself (shm), through DLPack
                    assert lent.dtype == dtype and lent.ctypes.data == out.ctypes.data
                    del lent
                got = rx.wait(name, timeout=10)
                capsules = [got.__dlpack__()]  # a legacy consumer's ask
                if np.lib.NumpyVersion(np.__version__) >= "2.1.0":  # (before: a TypeError,
                    capsules.append(got.__dlpack__(max_version=(1, 0)))  # then the old ask)
                for capsule in capsules:
                    assert _code_and_bits(capsule) == [code, 8 * dtype.itemsize], name
                del capsules, capsule
                back = from_dlpack(got)
                assert back.dtype == dtype and back.ctypes.data == got.ctypes.data
                assert back.tobytes() == sent.tobytes()
                del back
                rx.release(name)


def _numpy_exports_as_we_do(array: Any, code: int) -> None:
    """numpy's own export of ``array`` (an ml_dtypes format): refused before numpy 2.5 (why
    tensorwire.dlpack exists); from 2.5, where ml_dtypes registers its formats with numpy
    (``numpy.dtypes.register_dlpack_dtype``, ml_dtypes 0.7), made with the same type code."""
    if not hasattr(getattr(np, "dtypes", None), "register_dlpack_dtype"):  # (1.24: no np.dtypes)
        with pytest.raises(BufferError):
            np.ndarray.__dlpack__(array)
        return
    try:
        capsule = np.ndarray.__dlpack__(array)
    except BufferError:  # an ml_dtypes that does not register its formats
        assert np.lib.NumpyVersion(ml_dtypes.__version__) < "0.7.0"
        return
    assert _code_and_bits(capsule) == [code, 8 * array.dtype.itemsize], array.dtype
    del capsule


def _code_and_bits(capsule: Any) -> list[int]:
    """The DLPack type code and bit width in an unconsumed capsule's DLTensor."""
    import ctypes

    from tensorwire.dlpack import _dtype_field

    field = _dtype_field(capsule)
    return [ctypes.c_uint8.from_address(field + k).value for k in (0, 1)]


def _torch_exports(torch: Any, dtype: Any) -> bool:
    """Whether ``dtype`` is a torch format this torch gives a DLPack capsule of."""
    if not isinstance(dtype, torch.dtype):
        return False
    try:
        torch.zeros(1, dtype=dtype).__dlpack__()
    except (BufferError, RuntimeError, TypeError):
        return False
    return True


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_bfloat16_and_float8_go_between_torch_and_tensorwire_through_dlpack(
    transport: str,
) -> None:
    torch = needed(TORCH, "PyTorch")
    from torch.utils.dlpack import from_dlpack as legacy_from_dlpack

    from tensorwire.dlpack import ML_CODES

    # The formats this torch has and exports: torch 2.3 (the floor of the `torch` extra) has
    # float8 but refuses its DLPack itself ("float8 types are not supported by dlpack")
    names = [n for n in ML_CODES if _torch_exports(torch, getattr(torch, n, None))]
    assert "bfloat16" in names
    with tw.Receiver() as rx:
        for name in names:
            rx.register(name, (4, 6), name)
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
            for name in names:
                dtype = getattr(torch, name)
                sent = [torch.randn(4, 6).to(dtype) for _ in range(3)]
                tx.write(name, DLPackProducer(sent[0]))  # a foreign producer's format, read as is
                tx.write(name, DLPackProducer(sent[1], legacy=True))
                with tx.buffer(name) as out:  # produced in place by torch
                    torch.from_dlpack(out).copy_(sent[2])
                for k in range(3):
                    got = rx.wait(name, timeout=10)
                    as_torch = torch.from_dlpack(got)
                    assert as_torch.dtype == dtype
                    assert as_torch.data_ptr() == got.ctypes.data  # the slot, not a copy
                    assert torch.equal(as_torch.view(torch.uint8), sent[k].view(torch.uint8))
                    legacy = legacy_from_dlpack(got.__dlpack__())
                    assert legacy.dtype == dtype and legacy.data_ptr() == got.ctypes.data
                    del as_torch, legacy
                    rx.release(name)
            # What numpy refuses for another reason is still refused, in numpy's words (from
            # numpy 2.5 with ml_dtypes 0.7, numpy takes it as ml_dtypes' complex32, which the
            # tensor's dtype refuses)
            rx.register("c", (2,), "complex64")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "ComplexHalf ... experimental"
                half_complex = torch.zeros(2, dtype=torch.complex32)
            with pytest.raises(tw.SpecMismatchError, match=r"Unsupported dtype|got complex32"):
                tx.write("c", DLPackProducer(half_complex))
            assert rx.pending("c") == 0


def test_wire16_rounds_and_widens_to_numpys_bits() -> None:
    """The parameter server's 16-bit wire (``tensorwire.job.wire16``) rounds float32 into
    float16 to the very bits numpy's cast gives, without its slow path for values below
    2**-14 (a gradient's, mostly): every tie between two float16 subnormals and its float32
    neighbours, both signs; a million random float32 bit patterns (every exponent, NaNs and
    infinities among them); overflow, signed zeros and float32 subnormals; arrays of small
    values alone, and of few; strided arrays. Widening back is exact (by table), and bfloat16
    takes numpy's own casts (ml_dtypes' have no slow path)."""
    from tensorwire.job.wire16 import narrow_into, widen_into

    rng = np.random.default_rng(16)
    ties = (np.arange(2049, dtype=np.float64) * 2.0**-25).astype(np.float32)
    near = np.concatenate([ties, np.nextafter(ties, np.float32(1)), np.nextafter(ties, 0)])
    patterns = rng.integers(0, 1 << 32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504, 65519.99, 65520, 1e6]
    special += [1e-45, -1e-45, 2**-14, -(2**-14), 2**-24, 2**-25, 1.5 * 2**-24, 3 * 2**-26]
    cases = [near, -near, patterns.view(np.float32), np.array(special, np.float32)]
    cases += [(rng.standard_normal(50_000) * scale).astype(np.float32) for scale in (1e-5, 1.0)]
    wide = rng.standard_normal((64, 96)).astype(np.float32) * 1e-5
    cases.append(wide.T)  # (strided: a transpose)
    for src in cases:
        with np.errstate(over="ignore", invalid="ignore"):  # (numpy warns of overflow to inf)
            want = src.astype(np.float16)
            got = np.empty_like(want)
            if src.ndim == 2:  # (strided too)
                got = np.empty((src.shape[0], 2 * src.shape[1]), np.float16)[:, ::2]
            narrow_into(got, src)
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
        back = np.empty(src.shape, np.float32)
        widen_into(back, got)
        assert np.array_equal(back.view(np.uint32), want.astype(np.float32).view(np.uint32))
    src = (rng.standard_normal(1000) * 1e-5).astype(np.float32)
    bf16 = np.empty(src.shape, ml_dtypes.bfloat16)
    narrow_into(bf16, src)
    assert np.array_equal(bf16.view(np.uint16), src.astype(ml_dtypes.bfloat16).view(np.uint16))
    back = np.empty(src.shape, np.float32)
    widen_into(back, bf16)
    assert np.array_equal(back, bf16.astype(np.float32))
