"""Specs: what may be registered, and which arrays a spec accepts."""

from __future__ import annotations

import numpy as np
import pytest

import tensorwire as tw
from tensorwire.spec import TensorSpec


def test_static_spec_byte_count() -> None:
    spec = TensorSpec.create("w", (3, 4), "float32")
    assert spec.max_bytes == 48 and not spec.dynamic and spec.static_shape == (3, 4)
    assert TensorSpec.create("s", (), "int64").max_bytes == 8
    assert TensorSpec.create("e", (0, 5), "float64").max_bytes == 0


def test_dynamic_spec_needs_capacity() -> None:
    with pytest.raises(tw.SpecMismatchError, match="max_bytes"):
        TensorSpec.create("ids", (None, 4), "int64")
    spec = TensorSpec.create("ids", (None, 4), "int64", max_bytes=320)
    assert spec.dynamic and spec.max_bytes == 320
    assert spec.check_shape((10, 4)) == 320
    with pytest.raises(tw.SpecMismatchError, match="exceed the registered capacity"):
        spec.check_shape((11, 4))


def test_a_dynamic_capacity_below_one_row_is_refused() -> None:
    """A capacity that holds only empty messages is a mistake (elements given for bytes, say)."""
    with pytest.raises(tw.SpecMismatchError, match="smallest that is not empty is 16 bytes"):
        TensorSpec.create("ids", (None, 4), "float32", max_bytes=15)
    assert TensorSpec.create("ids", (None, 4), "float32", max_bytes=16).max_bytes == 16
    # a static zero dimension: every message is empty, so any capacity holds one
    assert TensorSpec.create("e", (None, 0), "float32", max_bytes=1).max_bytes == 1


@pytest.mark.parametrize("dtype", ["object", "U4", [("a", "i4")], "V8", "datetime64[s]"])
def test_unsupported_dtypes_are_refused(dtype: object) -> None:
    with pytest.raises(tw.SpecMismatchError):
        TensorSpec.create("x", (2,), dtype)


@pytest.mark.parametrize("name", ["int4", "uint4", "float4_e2m1fn", "complex32", "bcomplex32"])
def test_ml_dtypes_formats_that_do_not_move_are_refused_by_name(name: str) -> None:
    """ml_dtypes' sub-byte formats and its complex32 (0.7 on) are not bfloat16 nor float8: refused,
    as its type or its name, in words that do not call them numpy's complex or integer dtypes."""
    import ml_dtypes  # (a dependency of the core)

    if not hasattr(ml_dtypes, name):
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {name}")
    for given in (getattr(ml_dtypes, name), name):
        with pytest.raises(
            tw.SpecMismatchError, match=f"dtype {name} is not supported: .*ml_dtypes"
        ):
            TensorSpec.create("x", (2,), given)


@pytest.mark.parametrize("shape", [(-1, 2), "ab", None])
def test_bad_shapes_are_refused(shape: object) -> None:
    with pytest.raises(tw.SpecMismatchError):
        TensorSpec.create("x", shape, "float32")


def test_static_spec_rejects_contradicting_max_bytes() -> None:
    with pytest.raises(tw.SpecMismatchError, match="contradicts"):
        TensorSpec.create("x", (4,), "float32", max_bytes=8)


def test_check_array_names_tensor_expected_and_given() -> None:
    spec = TensorSpec.create("w1", (2, 3), "float32")
    with pytest.raises(tw.SpecMismatchError) as err:
        spec.check_array(np.zeros((2, 3), dtype=np.float64))
    text = str(err.value)
    assert "'w1'" in text and "float32[2, 3]" in text and "float64[2, 3]" in text
    assert isinstance(err.value, ValueError)
    with pytest.raises(tw.SpecMismatchError, match="shape mismatch"):
        spec.check_array(np.zeros((3, 2), dtype=np.float32))
    with pytest.raises(tw.SpecMismatchError, match=r"byte order mismatch .*astype\(.<f4.\)"):
        spec.check_array(np.zeros((2, 3), dtype=">f4"))


def test_non_contiguous_refused_unless_copy_allowed() -> None:
    spec = TensorSpec.create("w", (2, 3), "int32")
    base = np.arange(12, dtype=np.int32).reshape(2, 6)[:, ::2]
    with pytest.raises(tw.SpecMismatchError, match="not C-contiguous"):
        spec.check_array(base)
    out = spec.check_array(base, allow_copy=True)
    assert out.flags.c_contiguous and np.array_equal(out, base)


def test_negative_dynamic_dimensions_are_refused() -> None:
    """(-2, -3) has a positive byte count: only the sign tells it apart from (2, 3)."""
    spec = TensorSpec.create("d", (None, None), "float32", max_bytes=1024)
    assert spec.check_shape((2, 3)) == 24
    for shape in [(-2, -3), (-1, 4), (0, -1)]:
        with pytest.raises(tw.SpecMismatchError, match="negative dimension"):
            spec.check_shape(shape)


def test_a_shape_of_anything_but_whole_numbers_is_refused_not_truncated() -> None:
    """int() turned 3.5 into 3, "3" into 3 and True into 1: a tensor registered with a shape
    its caller never wrote. Whole numbers of any integer type (numpy's too) and None pass."""
    assert TensorSpec.create("a", [2, np.uint8(3)], "float32").shape == (2, 3)
    assert TensorSpec.create("b", np.int64(4), "float32").shape == (4,)
    for shape in [(3.5,), (3.0,), ("3",), (True, 2), ((2,),)]:
        with pytest.raises(tw.SpecMismatchError, match="must be a whole number"):
            TensorSpec.create("c", shape, "float32")
    # a string or bytes is a sequence, of characters: "" was taken as a scalar's shape and
    # b"f4" (a dtype in the shape's place) as (102, 52)
    for shape in [None, True, "34", "", b"f4", bytearray(b"ab")]:
        with pytest.raises(tw.SpecMismatchError, match="shape must be a sequence of dimensions"):
            TensorSpec.create("c", shape, "float32")


def test_a_dtype_of_none_is_refused_not_taken_as_float64() -> None:
    """numpy reads dtype None as float64: a lookup that found nothing registered a float64
    tensor, and every float32 write to it was refused later, far from the cause."""
    with pytest.raises(tw.SpecMismatchError, match="not a dtype: None"):
        TensorSpec.create("c", (4,), None)
    with tw.Receiver(bind="tcp://127.0.0.1:0") as rx:
        with pytest.raises(tw.SpecMismatchError, match="not a dtype: None"):
            rx.register("c", (4,), None)
        assert rx.register("c", (4,), "float64").dtype == np.float64  # refused, nothing kept


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("x" * 70000, "is 70000 bytes of UTF-8; at most 255"),
        ("a\udc80", "has no UTF-8 form"),
        ("", "must be a non-empty string, not ''"),
        (None, "must be a non-empty string, not None"),
        (b"w", "must be a non-empty string, not b'w'"),
    ],
)
def test_a_bad_tensor_name_is_refused_in_one_short_line(name: object, message: str) -> None:
    """A name that is too long is named in its error shortened (it echoed all 70 KB of it);
    one with a lone surrogate, which has no UTF-8 for the wire, was a bare UnicodeEncodeError."""
    with tw.Receiver(bind="tcp://127.0.0.1:0") as rx:
        with pytest.raises(tw.SpecMismatchError, match=message) as refused:
            rx.register(name, (4,), "float32")  # type: ignore[arg-type]
        assert len(str(refused.value)) < 200, refused.value
        assert rx.specs == {}


def test_an_unknown_name_is_answered_with_the_nearest_names_not_all() -> None:
    """A typo among a model's parameters named every registered tensor in one line (hundreds,
    for a real model): past a dozen, the error gives their count and the nearest names."""
    names = [f"layer{i}.weight" for i in range(40)]
    with tw.Receiver(bind="tcp://127.0.0.1:0") as rx:
        rx.register_many([(n, (4,), "float32") for n in names])
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            for refused in (
                lambda: tx.write("layer3.weigth", np.zeros(4, np.float32)),
                lambda: rx.wait("layer3.weigth", timeout=0),
            ):
                with pytest.raises(tw.UnknownTensorError) as info:
                    refused()
                text = str(info.value)
                assert "'layer3.weigth'" in text and "40 tensors, the nearest layer3.weight" in text
                assert "layer17.weight" not in text, text
            with pytest.raises(tw.UnknownTensorError) as info:
                rx.wait("y" * 70000, timeout=0)
            assert len(str(info.value)) < 300, info.value
