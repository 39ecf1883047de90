"""The conformance suite: the same behaviour over every transport, with real sender processes.

Each test runs once per transport (the ``transport`` fixture). Senders are separate interpreters
that rebuild their arrays from seeds, so the receiver can check every byte that landed.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorwire as tw

from .conftest import Children
from .peers import make_array, send_plan, send_uniform

DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    # mixed precision, through ml_dtypes
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
]


def test_every_dtype_byte_exact(transport: str, children: Children) -> None:
    shape = (3, 5, 7)
    with tw.Receiver() as rx:
        for dt in DTYPES:
            rx.register(dt, shape, dt)
        plan = [(dt, dt, shape, i) for i, dt in enumerate(DTYPES)]
        proc = children.start(send_plan, rx.address, transport, plan)
        for name, dt, shp, seed in plan:
            got = rx.wait(name, timeout=30)
            expected = make_array(dt, shp, seed)
            assert got.dtype == expected.dtype and got.shape == expected.shape
            assert got.tobytes() == expected.tobytes(), name
            assert not got.flags.writeable
            rx.release(name)
        children.join_ok(proc)


def test_zero_d_empty_and_large(transport: str, children: Children) -> None:
    big = (4096, 4096)  # 64 MiB of float32
    with tw.Receiver() as rx:
        rx.register("scalar", (), "float64")
        rx.register("empty", (0, 128), "float32")
        rx.register("big", big, "float32")
        plan = [
            ("scalar", "float64", (), 1),
            ("empty", "float32", (0, 128), 2),
            ("big", "float32", big, 3),
        ]
        proc = children.start(send_plan, rx.address, transport, plan)
        for name, dt, shp, seed in plan:
            got = rx.wait(name, timeout=60)
            assert got.shape == shp
            assert np.array_equal(got, make_array(dt, shp, seed))
            rx.release(name)
        children.join_ok(proc)


def test_ring_wraps_with_credits_over_hundreds_of_writes(
    transport: str, children: Children
) -> None:
    count = 300
    with tw.Receiver(ring=2) as rx:
        rx.register("t", (257,), "int32")  # an odd size, so slots are not all page-multiples
        plan = [("t", "int32", (257,), seed) for seed in range(count)]
        proc = children.start(send_plan, rx.address, transport, plan)
        for seed in range(count):
            got = rx.wait("t", timeout=30)
            assert np.array_equal(got, make_array("int32", (257,), seed)), seed
            rx.release("t")
        children.join_ok(proc)
        with pytest.raises(tw.WireTimeoutError):
            rx.wait("t", timeout=0.05)


def test_consumer_may_hold_every_slot_then_must_release(transport: str, children: Children) -> None:
    with tw.Receiver(ring=3) as rx:
        rx.register("t", (16,), "float32")
        plan = [("t", "float32", (16,), s) for s in range(6)]
        proc = children.start(send_plan, rx.address, transport, plan)
        held = [rx.wait("t", timeout=30) for _ in range(3)]
        for s, view in enumerate(held):
            assert np.array_equal(view, make_array("float32", (16,), s))
        with pytest.raises(tw.TensorWireError, match="release"):
            rx.wait("t", timeout=0)
        for s in range(3, 6):
            rx.release("t")
            assert np.array_equal(rx.wait("t", timeout=30), make_array("float32", (16,), s))
        for _ in range(3):
            rx.release("t")
        with pytest.raises(tw.TensorWireError, match="nothing to release"):
            rx.release("t")
        children.join_ok(proc)


def test_many_senders_to_one_receiver(transport: str, children: Children) -> None:
    senders, count = 3, 40
    with tw.Receiver() as rx:
        for k in range(senders):
            rx.register(f"grad{k}", (64, 33), "float32")
        procs = [
            children.start(
                send_plan,
                rx.address,
                transport,
                [(f"grad{k}", "float32", (64, 33), 1000 * k + i) for i in range(count)],
            )
            for k in range(senders)
        ]
        seen = {f"grad{k}": 0 for k in range(senders)}
        for _ in range(senders * count):
            name, view = rx.wait_any(timeout=30)
            k = int(name[4:])
            assert np.array_equal(view, make_array("float32", (64, 33), 1000 * k + seen[name]))
            seen[name] += 1
            rx.release(name)
        assert seen == {f"grad{k}": count for k in range(senders)}
        for p in procs:
            children.join_ok(p)


def test_wait_any_among_many_tensors_hands_out_each_message_once_in_turn(transport: str) -> None:
    """Over 200 tensors (from 64 on, wait_any reads every slot's sequence number at once:
    consumer.SCAN_ALL_FROM; before, it looked at each idle tensor's every slot, 106 ms a message
    among 20,000), each landed message is handed out once, the tensors in round-robin order
    from the cursor, a tensor's messages in their order, and nothing once all are taken."""
    with tw.Receiver() as rx:
        rx.register_many([(f"t{i}", (4,), "int64") for i in range(200)])
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
            sent = [3, 150, 3, 199, 0, 77]
            for k, i in enumerate(sent):
                tx.write(f"t{i}", np.full(4, k))
            deadline = time.monotonic() + 10
            while sum(rx.pending(f"t{i}") for i in set(sent)) < len(sent):  # bounded: landed
                assert time.monotonic() < deadline, "the messages did not land"
                time.sleep(0.005)
            got = []
            for _ in sent:
                name, view = rx.wait_any(timeout=10)
                got.append((name, int(view[0])))
                rx.release(name)
            assert got == [("t0", 4), ("t3", 0), ("t77", 5), ("t150", 1), ("t199", 3), ("t3", 2)]
            with pytest.raises(tw.WireTimeoutError):
                rx.wait_any(timeout=0.2)
            tx.write("t42", np.full(4, 9))  # one more, behind the cursor (after t3): in turn
            name, view = rx.wait_any(timeout=10)
            assert (name, int(view[0])) == ("t42", 9)


def test_connect_called_on_a_sender_connects_that_sender() -> None:
    """``tx = Sender(); tx.connect(address)``, as a socket is connected: that sender connects
    (to one more receiver each call) and returns itself, and the options a sender is made with
    are refused there by name, before anything connects. Before, ``connect`` (a classmethod)
    made another sender there and returned it: ``tx`` stayed connected to nothing, and its
    first write said no receiver published the tensor."""
    with tw.Receiver() as a, tw.Receiver() as b:
        a.register("w", (4,), "float32")
        b.register("v", (2,), "int64")
        with tw.Sender(timeout=5) as tx:
            assert tx.connect(a.address) is tx
            tx.connect(b.address, transport="tcp", connect_timeout=5)
            assert sorted(tx.peers) == sorted([a.address, b.address])
            tx.write("w", np.arange(4, dtype=np.float32))
            tx.write("v", np.array([7, 8]))
            assert a.wait("w", timeout=5).tolist() == [0, 1, 2, 3]
            assert b.wait("v", timeout=5).tolist() == [7, 8]
            with pytest.raises(TypeError, match=r"secret, timeout cannot change here"):
                tx.connect(a.address, secret="s", timeout=1)
        # on the class, as ever: a new sender
        with tw.Sender.connect(a.address, timeout=5) as other:
            assert isinstance(other, tw.Sender) and other is not tx
            assert other.peers == [a.address]


def test_a_receiver_publishes_its_info_to_every_sender() -> None:
    """``Receiver(info=...)`` reaches each sender in its welcome (``receiver_info``), per
    receiver; a receiver without it publishes {}; what may not travel, or is too large, is
    refused at the receiver with the name it was given under."""
    info = {"job.workers": 3, "lr": 0.05, "model": "mlp", "resumed": False, "note": None}
    with tw.Receiver(info=info) as rx, tw.Receiver() as plain:
        info["lr"] = 1.0  # the caller's dict is not the receiver's
        assert rx.info == {**info, "lr": 0.05}
        with tw.Sender(timeout=5) as tx:
            tx.add_peer(rx.address)
            assert tx.receiver_info() == {**info, "lr": 0.05}
            tx.add_peer(plain.address)
            assert tx.receiver_info(peer=plain.address) == {}
            assert tx.receiver_info(peer=rx.address)["job.workers"] == 3
            with pytest.raises(tw.TensorWireError, match="name one with peer="):
                tx.receiver_info()
    bad: list[tuple[Any, type[Exception], str]] = [
        ({"shape": [1, 2]}, TypeError, r"info\['shape'\]: a value must be a str, int"),
        ({"n": np.int64(3)}, TypeError, r"info\['n'\]: .* got int64"),
        ({1: "a"}, TypeError, "each name must be a non-empty str, got 1"),
        ({"": "a"}, TypeError, "each name must be a non-empty str"),
        ({"big": 1 << 64}, ValueError, "does not fit in 64 bits"),
        ({"x": math.inf}, ValueError, "not a finite number"),
        ({"blob": "x" * (70 << 10)}, ValueError, "more than the 65536 a receiver may publish"),
        ("workers=3", TypeError, "info must be a mapping"),
    ]
    for given, error, match in bad:
        with pytest.raises(error, match=match):
            tw.Receiver(info=given)


def test_second_writer_of_a_claimed_tensor_is_refused(transport: str) -> None:
    with tw.Receiver() as rx:
        rx.register("t", (4,), "int64")
        with (
            tw.Sender.connect(rx.address, transport=transport, timeout=5) as a,
            tw.Sender.connect(rx.address, transport=transport, timeout=5) as b,
        ):
            a.write("t", np.arange(4))
            with pytest.raises(tw.RemoteProtocolError, match="already written by") as refused:
                b.write("t", np.arange(4))
            assert refused.value.code == "busy"  # what a caller may wait out (PSClient does)
        # once the first writer said goodbye, another may take over and continue the sequence
        assert np.array_equal(rx.wait("t", timeout=5), np.arange(4))
        rx.release("t")
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as c:
            c.write("t", np.arange(4) * 2)
        assert np.array_equal(rx.wait("t", timeout=5), np.arange(4) * 2)
        rx.release("t")


def test_one_sender_to_many_receivers(transport: str, children: Children) -> None:
    with tw.Receiver() as r1, tw.Receiver() as r2:
        r1.register("a", (10,), "int16")
        r2.register("b", (10,), "int16")
        r1.register("x", (3,), "float64")
        r2.register("x", (3,), "float64")
        plan = [
            ("a", "int16", (10,), 1),
            ("b", "int16", (10,), 2),
            ("x", "float64", (3,), 3, r1.address),
            ("x", "float64", (3,), 4, r2.address),
        ]
        proc = children.start(send_plan, r1.address, transport, plan, None, [r2.address])
        assert np.array_equal(r1.wait("a", timeout=30), make_array("int16", (10,), 1))
        assert np.array_equal(r2.wait("b", timeout=30), make_array("int16", (10,), 2))
        assert np.array_equal(r1.wait("x", timeout=30), make_array("float64", (3,), 3))
        assert np.array_equal(r2.wait("x", timeout=30), make_array("float64", (3,), 4))
        children.join_ok(proc)


@pytest.mark.parametrize("written_before", [False, True])
def test_ambiguous_name_needs_a_peer(transport: str, written_before: bool) -> None:
    """A name two receivers publish needs peer=, also when it was written without one before
    the second receiver was added (before, those writes went on to the first receiver, and
    spec() answered with its spec, where a sender connected to both at once refused)."""
    with tw.Receiver() as r1, tw.Receiver() as r2:
        r1.register("x", (3,), "float64")
        r2.register("x", (3,), "float64")
        with tw.Sender.connect(r1.address, transport=transport, timeout=5) as tx:
            if written_before:
                tx.write("x", np.full(3, 7.0))
                assert np.array_equal(r1.wait("x", timeout=5), np.full(3, 7.0))
                r1.release("x")
            tx.add_peer(r2.address)
            with pytest.raises(tw.TensorWireError, match="several receivers"):
                tx.write("x", np.zeros(3))
            with pytest.raises(tw.TensorWireError, match="several receivers"):
                tx.spec("x")
            tx.write("x", np.ones(3), peer=r2.address)
            assert np.array_equal(r2.wait("x", timeout=5), np.ones(3))
            assert r1.pending("x") == 0


def test_dynamic_shapes(transport: str, children: Children) -> None:
    cap = 64 * 128 * 8
    rows = [0, 1, 7, 64, 3]
    with tw.Receiver() as rx:
        rx.register("ids", (None, 128), "int64", max_bytes=cap)
        plan = [("ids", "int64", (r, 128), r) for r in rows]
        proc = children.start(send_plan, rx.address, transport, plan)
        for r in rows:
            got = rx.wait("ids", timeout=30)
            assert got.shape == (r, 128)
            assert np.array_equal(got, make_array("int64", (r, 128), r))
            rx.release("ids")
        children.join_ok(proc)


def test_late_registration_is_found_by_name(transport: str) -> None:
    with tw.Receiver() as rx:
        rx.register("early", (2,), "int8")
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as tx:
            rx.register("late", (2,), "int8")
            tx.write("late", np.array([1, 2], dtype=np.int8))
            assert rx.wait("late", timeout=5).tolist() == [1, 2]
            with pytest.raises(tw.UnknownTensorError, match="never"):
                tx.write("never", np.zeros(2, dtype=np.int8))


def test_produce_in_place_with_buffer(transport: str) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(20, dtype=np.float32).reshape(4, 5)
    with tw.Receiver() as rx:
        rx.register("c", (3, 5), "float32")
        rx.register("d", (None,), "float32", max_bytes=400)
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as tx:
            with tx.buffer("c") as out:
                np.matmul(a, b, out=out)
            assert np.array_equal(rx.wait("c", timeout=5), a @ b)
            rx.release("c")
            with tx.buffer("d", shape=(7,)) as out:
                out[:] = np.arange(7)
            assert rx.wait("d", timeout=5).tolist() == list(range(7))
            with pytest.raises(tw.SpecMismatchError, match="takes whole numbers"):
                tx.buffer("d", shape=(7.5,)).__enter__()  # int() made it 7
            with pytest.raises(tw.SpecMismatchError, match=r"dynamic shape .* shape=\.\.\."):
                tx.buffer("d").__enter__()  # the message's shape is needed
            with pytest.raises(RuntimeError), tx.buffer("c") as out:
                out[:] = 1
                raise RuntimeError("producer failed")
            with pytest.raises(tw.WireTimeoutError):
                rx.wait("c", timeout=0.1)  # the aborted message was never completed


def test_a_receiver_closed_while_a_buffer_block_is_open_ends_the_block_lost(
    transport: str,
) -> None:
    """The block's message cannot be delivered: its end raises PeerLostError on every
    transport. Before, over ``shm`` the block ended as if it had been, its message completed in
    the closed receiver's memory."""
    rx = tw.Receiver()
    rx.register("a", (1024,), "float32")
    try:
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as tx:
            with pytest.raises(tw.PeerLostError), tx.buffer("a") as out:
                out[:] = 1.0
                rx.close()
                out[:] = 2.0
            with pytest.raises(tw.PeerLostError):
                tx.write("a", np.ones(1024, np.float32))
    finally:
        rx.close()


def test_a_buffer_kept_past_its_block_is_read_only(transport: str) -> None:
    """Over shm the block's array is the receiver's slot: a write through a reference kept past
    the block changed the message the receiver then read (by hand: [9, 9, 9, 9] for a message
    filled with 5s). It is read-only once the block ends, also when the block raised."""
    with tw.Receiver() as rx:
        rx.register("x", (4,), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as tx:
            with pytest.raises(KeyError), tx.buffer("x") as aborted:
                raise KeyError("the producer failed")
            with tx.buffer("x") as kept:
                kept[:] = 5
            for lent in (aborted, kept):
                with pytest.raises(ValueError, match="read-only"):
                    lent[:] = 9
            assert rx.wait("x", timeout=5).tolist() == [5.0] * 4
            rx.release("x")
            with tx.buffer("x") as again:  # the same slot lent anew: writable in its block
                again[:] = 6
            assert rx.wait("x", timeout=5).tolist() == [6.0] * 4


def test_another_message_of_a_tensor_inside_its_buffer_block_is_refused(transport: str) -> None:
    """A buffer() block holds its tensor's next slot (over shm) or its staging buffer: a
    second block of the same tensor, or a write of it, inside the block took that slot and
    lost a message (over shm the receiver waited for message 1 for ever). Refused now, with
    the block's own message and every later one delivered in order; other tensors go on."""
    with tw.Receiver() as rx:
        rx.register("a", (4,), "float32", ring=4)
        rx.register("b", (4,), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as tx:
            tx.write("a", np.full(4, 1, np.float32))  # a fast route the block must not take
            with tx.buffer("a") as out:
                out[:] = 2
                for wrong in (
                    lambda: tx.buffer("a").__enter__(),
                    lambda: tx.write("a", np.zeros(4, np.float32)),
                    lambda: tx.write_many([("b", np.zeros(4, np.float32)), ("a", out)]),
                ):
                    with pytest.raises(tw.TensorWireError, match="has a buffer\\(\\) block open"):
                        wrong()
                tx.write("b", np.full(4, 5, np.float32))  # another tensor: fine
            tx.write("a", np.full(4, 3, np.float32))
            got = []
            for _ in range(3):
                got.append(float(rx.wait("a", timeout=5)[0]))
                rx.release("a")
            assert got == [1.0, 2.0, 3.0]
            assert rx.wait("b", timeout=5).tolist() == [5.0] * 4  # write_many wrote nothing
            assert rx.pending("a") == 0 and rx.pending("b") == 0


BAD_WRITES = [
    ("dtype", lambda: np.zeros((4, 4), dtype=np.float64), "dtype mismatch"),
    # float32 in the other byte order: named apart from the registered type, with the remedy
    ("byteorder", lambda: np.zeros((4, 4), dtype=">f4"), r"byte order mismatch .*astype"),
    ("shape", lambda: np.zeros((2, 8), dtype=np.float32), "shape mismatch"),
    ("rank", lambda: np.zeros(16, dtype=np.float32), "shape mismatch"),
    ("strided", lambda: np.zeros((4, 8), dtype=np.float32)[:, ::2], "not C-contiguous"),
    ("list", lambda: [[1.0] * 4] * 4, "dtype mismatch"),
    # its mask cannot travel (before, shm sent the raw values, grpc the fill value, and tcp
    # raised a bare ValueError)
    (
        "masked",
        lambda: np.ma.masked_array(np.zeros((4, 4), np.float32), mask=np.eye(4, dtype=bool)),
        r"masked array.*filled",
    ),
]


@pytest.mark.parametrize(("case", "make", "message"), BAD_WRITES, ids=[c[0] for c in BAD_WRITES])
def test_bad_static_write_refused_and_buffer_untouched(
    transport: str, case: str, make: object, message: str
) -> None:
    good = np.arange(16, dtype=np.float32).reshape(4, 4)
    with tw.Receiver() as rx:
        rx.register("w", (4, 4), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as tx:
            tx.write("w", good)
            view = rx.wait("w", timeout=5)
            before = view.copy()
            rx.release("w")
            with pytest.raises(tw.SpecMismatchError, match=message) as err:
                tx.write("w", make())  # type: ignore[operator]
            assert "'w'" in str(err.value)
            with pytest.raises(tw.WireTimeoutError):
                rx.wait("w", timeout=0.1)
            assert np.array_equal(view, before)
            tx.write("w", good + 1)  # the connection is still good
            assert np.array_equal(rx.wait("w", timeout=5), good + 1)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_numpy_subclasses_land_as_their_plain_arrays(transport: str, tmp_path: Path) -> None:
    """A ``np.matrix`` stays two-dimensional when flattened, which the tcp writer read as a
    one-row payload (before: an IndexError, then the receiver cut the connection for a header
    of 1 byte); a ``np.memmap`` is a file's memory. Each lands byte-exact through ``write``
    and ``write_many``, static and dynamic, and the connection stays good."""
    src = np.arange(12, dtype=np.float32).reshape(4, 3)
    mapped = np.memmap(tmp_path / "m.bin", dtype=np.float32, mode="w+", shape=(4, 3))
    mapped[:] = src + 100
    with tw.Receiver() as rx:
        rx.register("s", (4, 3), "float32")
        rx.register("d", (None, 3), "float32", max_bytes=1024)
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as tx:
            for made in (np.matrix(src), mapped):
                tx.write("s", made)
                tx.write_many({"s": made, "d": made})
                tx.write("s", src)  # a plain one after it: the connection is still good
                for expected in (made, made, src):
                    assert np.array_equal(rx.wait("s", timeout=5), expected)
                    rx.release("s")
                assert np.array_equal(rx.wait("d", timeout=5), made)
                rx.release("d")


def test_non_contiguous_written_from_a_copy_when_asked(transport: str) -> None:
    src = np.arange(32, dtype=np.int32).reshape(4, 8)[:, ::2]
    with tw.Receiver() as rx:
        rx.register("w", (4, 4), "int32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as tx:
            tx.write("w", src, allow_copy=True)
            assert np.array_equal(rx.wait("w", timeout=5), src)


def test_dynamic_over_capacity_refused_never_truncated(transport: str) -> None:
    with tw.Receiver() as rx:
        rx.register("ids", (None, 4), "int32", max_bytes=4 * 4 * 10)
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as tx:
            with pytest.raises(tw.SpecMismatchError, match="exceed the registered capacity"):
                tx.write("ids", np.zeros((11, 4), dtype=np.int32))
            with pytest.raises(tw.SpecMismatchError, match="shape mismatch"):
                tx.write("ids", np.zeros((3, 5), dtype=np.int32))
            with pytest.raises(tw.WireTimeoutError):
                rx.wait("ids", timeout=0.1)
            tx.write("ids", np.ones((10, 4), dtype=np.int32))
            assert rx.wait("ids", timeout=5).shape == (10, 4)


def test_no_torn_tensor_under_concurrent_consumption(transport: str, children: Children) -> None:
    """Every message the receiver hands out is whole: all elements carry the same number."""
    count = 200
    with tw.Receiver() as rx:
        rx.register("u", (256, 1024), "int32")  # 1 MiB
        proc = children.start(send_uniform, rx.address, transport, "u", count)
        for k in range(1, count + 1):
            view = rx.wait("u", timeout=30)
            assert view[0, 0] == k and view.min() == k and view.max() == k
            rx.release("u")
        children.join_ok(proc)


def test_write_handle_and_timeout_on_full_ring(transport: str) -> None:
    with tw.Receiver(ring=2) as rx:
        rx.register("t", (8,), "uint8")
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as tx:
            h1 = tx.write("t", np.full(8, 1, np.uint8))
            h2 = tx.write("t", np.full(8, 2, np.uint8))
            assert h2.seq == h1.seq + 1 and h2.nbytes == 8 and h1.name == "t"
            with pytest.raises(tw.WireTimeoutError, match="released"):
                tx.write("t", np.full(8, 3, np.uint8), timeout=0.2)
            with pytest.raises(tw.WireTimeoutError):
                tx.write("t", np.full(8, 3, np.uint8), timeout=0)
            assert rx.wait("t", timeout=5)[0] == 1
            rx.release("t")
            tx.write("t", np.full(8, 3, np.uint8), timeout=5)
            assert [rx.wait("t", timeout=5)[0] for _ in range(1)] == [2]


def test_close_right_after_writing_loses_nothing(transport: str, children: Children) -> None:
    """A sender that writes and exits at once: its goodbye travels behind its data, so every
    message lands and the receiver reports no loss."""
    with tw.Receiver(ring=4) as rx:
        rx.register("t", (1 << 18,), "float32")  # 1 MiB: still in flight when the sender exits
        plan = [("t", "float32", (1 << 18,), s) for s in range(4)]
        proc = children.start(send_plan, rx.address, transport, plan)
        children.join_ok(proc)  # the sender has exited before we consume anything
        for s in range(4):
            assert np.array_equal(rx.wait("t", timeout=30), make_array("float32", (1 << 18,), s))
            rx.release("t")


@pytest.mark.parametrize("transport", ["grpc", "grpc-stream"])
def test_grpc_lifts_the_4_mib_message_cap(transport: str) -> None:
    """gRPC refuses messages over 4 MiB by default; the baseline must carry 256 MiB tensors."""
    n = 64 << 20  # float32 elements: 256 MiB
    with tw.Receiver(ring=1) as rx:
        rx.register("huge", (n,), "float32")
        src = np.arange(n, dtype=np.float32)
        with tw.Sender.connect(rx.address, transport=transport, timeout=120) as tx:
            tx.write("huge", src)
        got = rx.wait("huge", timeout=120)
        assert np.array_equal(got, src)


def test_a_grpc_message_past_protobufs_2_gib_is_refused_before_a_copy_and_the_session_goes_on() -> (
    None
):
    """One protobuf message cannot reach 2 GiB: grpcio raised its own `_InactiveRpcError`
    ("Exception serializing request!") after copying the whole tensor into bytes, outside the
    library's errors. Now a write or a buffer() block of such a message is refused by name
    before a byte is copied, and the next write of the same tensor (smaller: dynamic) lands."""
    limit = (1 << 31) - 1 - 1024
    with tw.Receiver(ring=1) as rx:
        rx.register("t", (None,), "uint8", max_bytes=limit + 1)
        with tw.Sender.connect(rx.address, transport="grpc", timeout=60) as tx:
            too_big = np.empty(limit + 1, np.uint8)  # its pages never touched: nothing copied
            with pytest.raises(tw.TransportError, match="more than one grpc call carries"):
                tx.write("t", too_big)
            refused = pytest.raises(tw.TransportError, match="grpc-stream, tcp or shm")
            with refused, tx.buffer("t", shape=(limit + 1,)):
                pass
            tx.write("t", np.arange(5, dtype=np.uint8))
            np.testing.assert_array_equal(rx.wait("t", timeout=30), np.arange(5))


def test_tensor_in_parts_is_one_array_written_by_several_senders(transport: str) -> None:
    """register_parts: each part has its own writer, the whole is one contiguous view."""
    full = np.arange(10 * 6, dtype=np.float32).reshape(10, 6)
    with tw.Receiver() as rx:
        parts = rx.register_parts("w", (10, 6), "float32", rows=[3, 0, 7])
        assert [p.name for p in parts] == ["w@0", "w@1", "w@2"]
        assert [p.static_shape for p in parts] == [(3, 6), (0, 6), (7, 6)]
        whole = rx.array("w")
        assert whole.shape == (10, 6) and not whole.flags.writeable
        with (
            tw.Sender.connect(rx.address, transport=transport, timeout=5) as a,
            tw.Sender.connect(rx.address, transport=transport, timeout=5) as b,
        ):
            a.write("w@0", full[:3])
            a.write("w@1", full[3:3])
            b.write("w@2", full[3:])
            for p in parts:
                rx.wait(p.name, timeout=5)
            assert np.array_equal(whole, full)  # no gather: the parts landed side by side
            for p in parts:
                rx.release(p.name)
            b.write("w@2", full[3:] * 2)  # one part updated alone, in place
            rx.wait("w@2", timeout=5)
            assert np.array_equal(whole[3:], full[3:] * 2) and np.array_equal(whole[:3], full[:3])
        with pytest.raises(tw.SpecMismatchError, match="do not add up"):
            rx.register_parts("v", (10, 6), "float32", rows=[3, 3])
        with pytest.raises(tw.UnknownTensorError):
            rx.array("nope")


def test_a_scalar_in_parts_is_one_part_of_one_row(transport: str) -> None:
    """A scalar registered in parts (a model's temperature, as the parameter server's plan
    counts it: one row) is one part, ``s@0``, of shape (). Before, register_parts refused every
    scalar, and a PSClient of a model with one could not join."""
    with tw.Receiver() as rx:
        (part,) = rx.register_parts("s", (), "float32", rows=[1])
        assert part.name == "s@0" and part.static_shape == ()
        whole = rx.array("s")
        assert whole.shape == () and not whole.flags.writeable
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as tx:
            tx.write("s@0", np.float32(2.5) * np.ones((), np.float32))
            rx.wait("s@0", timeout=5)
            assert float(whole) == 2.5
        for rows in ([2], [0, 1], [1, 0]):
            with pytest.raises(tw.SpecMismatchError, match=r"a scalar is one part of one row"):
                rx.register_parts("t", (), "float32", rows=rows)
        assert "t" not in rx.specs and "t@0" not in rx.specs


def test_negative_dynamic_shape_is_refused_before_any_byte_moves(transport: str) -> None:
    with tw.Receiver() as rx:
        rx.register("d", (None, None), "float32", max_bytes=1024)
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
            refused = pytest.raises(tw.SpecMismatchError, match="negative dimension")
            with refused, tx.buffer("d", shape=(-2, -3)) as out:
                out[...] = 1.0
            with tx.buffer("d", shape=(2, 3)) as out:  # the sender is still usable
                out[...] = 7.0
        got = rx.wait("d", timeout=10)
        assert got.shape == (2, 3) and (got == 7.0).all()
        rx.release("d")
        with pytest.raises(tw.WireTimeoutError):
            rx.wait("d", timeout=0.2)  # the refused message never landed


def test_a_waiting_consumer_sees_a_goodbye_as_a_clean_end(transport: str) -> None:
    """The consumer is waiting (and, over tcp and nixl, reading the connection itself) when
    its sender's goodbye arrives: whichever thread reads the goodbye, the session ends cleanly,
    never as a lost sender. Repeated, as the goodbye races the connection's own thread."""

    def send_three(first: int) -> None:
        with tw.Sender.connect(rx.address, transport=transport, timeout=30) as tx:
            for k in range(first, first + 3):
                tx.write("t", np.full(16, k, np.int64))

    with tw.Receiver() as rx:
        rx.register("t", (16,), "int64")
        for round_ in range(12):
            sender = threading.Thread(target=send_three, args=(3 * round_,))
            sender.start()
            try:
                for k in range(3 * round_, 3 * round_ + 3):
                    assert int(rx.wait("t", timeout=10)[0]) == k
                    rx.release("t")
                # waiting while the goodbye arrives: a lost sender would raise PeerLostError
                with pytest.raises(tw.WireTimeoutError):
                    rx.wait("t", timeout=0.2)
            finally:
                sender.join(30)
            assert not sender.is_alive()


def test_a_polling_first_write_makes_its_claim(transport: str) -> None:
    """``write(timeout=0)`` polls for a free slot; a tensor's first write makes its claim first,
    one round trip, which no time at all never fits. Before, that claim was given none: every
    polling write failed ("did not answer a claim request within 0 s ... has it exited?"),
    then "no connection could be made in that time", so a caller polling again and again never
    wrote at all."""
    with tw.Receiver(ring=2) as rx:
        rx.register("a", (4,), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
            _poll_through_a_ring_of_two(rx, lambda x: tx.write("a", x, timeout=0))


def _poll_through_a_ring_of_two(rx: tw.Receiver, write: Any) -> None:
    """Fill tensor ``a``'s two slots with polling writes, be refused a third, and write it
    once the consumer releases one."""
    for k in range(2):
        write(np.full(4, k, np.float32))
    with pytest.raises(tw.WireTimeoutError, match="no free slot"):
        write(np.full(4, 2, np.float32))
    assert rx.wait("a", timeout=10).tolist() == [0.0] * 4
    rx.release("a")
    for _ in range(1000):  # bounded: the release's credit reaches the sender at once
        try:
            write(np.full(4, 2, np.float32))
            break
        except tw.WireTimeoutError:
            time.sleep(0.01)
    for k in (1, 2):
        assert rx.wait("a", timeout=10).tolist() == [float(k)] * 4
        rx.release("a")


def test_a_sender_whose_timeout_is_0_connects_claims_and_polls(transport: str) -> None:
    """``Sender(timeout=0)``: every write polls, while the round trips the receiver must
    answer (the handshake, the claim, a ping) still get time. Before, the connect failed
    ("did not answer a hello request within 0 s ... does a firewall let the port through?"),
    and a sender connected with ``add_peer(connect_timeout=...)`` never wrote: each claim
    timed out "within 0 s", then each resume."""
    with tw.Receiver(ring=2) as rx:
        rx.register("a", (4,), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=0) as tx:
            tx.ping()
            _poll_through_a_ring_of_two(rx, lambda x: tx.write("a", x))


def test_an_infinite_timeout_waits_as_none_does(transport: str) -> None:
    """``math.inf`` as a timeout waits without end, as None: for the connect, a write waiting
    for a slot, and a wait. Before, a `tcp` connect raised OverflowError and a `grpc` write
    timed out at once."""
    with tw.Receiver(ring=1) as rx:
        rx.register("a", (4,), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=math.inf) as tx:
            tx.write("a", np.zeros(4, np.float32), timeout=math.inf)
            assert rx.wait("a", timeout=math.inf).tolist() == [0.0] * 4
            releaser = threading.Timer(0.3, rx.release, args=("a",))
            releaser.start()
            try:
                start = time.monotonic()
                tx.write("a", np.ones(4, np.float32), timeout=math.inf)  # waits for the release
                assert time.monotonic() - start >= 0.2
            finally:
                releaser.join(10)
            assert rx.wait("a", timeout=math.inf).tolist() == [1.0] * 4


@pytest.mark.parametrize("bad", [float("nan"), -1.0, "5"])
def test_a_bad_wait_timeout_is_refused_with_a_message_there_too(
    transport: str, bad: object
) -> None:
    """A NaN, negative or string timeout is refused by ``wait`` whether or not its message has
    arrived, and the message stays for the next wait. Before, a message already there was
    handed out, the bad timeout unseen."""
    with tw.Receiver() as rx:
        rx.register("a", (4,), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
            tx.write("a", np.ones(4, np.float32))
            for _ in range(1000):  # bounded: until it has landed
                if rx.pending("a"):
                    break
                time.sleep(0.01)
            with pytest.raises(ValueError, match="timeout must be"):
                rx.wait("a", timeout=bad)  # type: ignore[arg-type]
            assert rx.pending("a") == 1
            assert rx.wait("a", timeout=10).tolist() == [1.0] * 4
