"""``Sender(copy_threads=N)``: a large ``shm`` write copied by several threads at once lands
byte-exact, whatever the part boundaries, and the sender's copy threads go with it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tensorwire as tw
from tensorwire.split_copy import MIN_PART_BYTES


def _copy_threads(sender: tw.Sender) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"{sender.name}-copy")]


def test_a_large_shm_write_split_across_threads_is_byte_exact() -> None:
    odd = 2 * MIN_PART_BYTES + 5  # two parts, one a byte longer than the other
    rng = np.random.default_rng(7)
    with tw.Receiver(ring=2) as rx:
        rx.register("odd", (odd,), "uint8")
        rx.register("dyn", (None,), "float32", max_bytes=3 * MIN_PART_BYTES)
        rx.register("small", (1000,), "float64")
        with tw.Sender.connect(rx.address, transport="shm", copy_threads=3, timeout=10) as tx:
            for _ in range(2):
                a = rng.integers(0, 256, odd, dtype=np.uint8)
                tx.write("odd", a)
                assert np.array_equal(rx.wait("odd", timeout=10), a)
                rx.release("odd")
            for n in (3 * MIN_PART_BYTES // 4, 2 * MIN_PART_BYTES // 4 + 1, 7):  # 3, 2, 1 parts
                b = rng.standard_normal(n).astype(np.float32)
                tx.write("dyn", b)
                got = rx.wait("dyn", timeout=10)
                assert got.shape == (n,) and np.array_equal(got, b)
                rx.release("dyn")
            c = rng.standard_normal(1000)
            tx.write("small", c)
            assert np.array_equal(rx.wait("small", timeout=10), c)
            rx.release("small")
            # at most copy_threads - 1: the caller's thread copies a part too
            assert 0 < len(_copy_threads(tx)) <= 2
        assert not _copy_threads(tx)  # stopped by close


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_copy_threads_is_checked_before_anything_starts(bad: object) -> None:
    with pytest.raises(ValueError, match="copy_threads must be a whole number"):
        tw.Sender(copy_threads=bad)  # type: ignore[arg-type]
    assert not [t for t in threading.enumerate() if "-copy_" in t.name]  # no pool was started
