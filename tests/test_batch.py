"""The batch API: ``Sender.write_many``, ``Receiver.wait_all`` / ``wait_each`` / ``release_many``,
over every transport, and the ring depth a receiver chooses by size.

A batch is checked whole before a byte moves, and a wait for several tensors takes all of them
or none: these tests hold both ends to that, with real sender processes and real sockets.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorwire as tw
from tensorwire import control
from tensorwire.layout import auto_depth
from tensorwire.ring import SlotChooser

from .conftest import Children
from .peers import make_array, send_batches

#: a model-like mix: small and large, every kind of dtype, 16-bit floats through ml_dtypes
PLAN = [
    (f"t{i}", dt, shape, 100 * i)
    for i, (dt, shape) in enumerate(
        [
            ("float32", (64,)),
            ("float32", (256, 64)),
            ("bfloat16", (33,)),
            ("int64", (4,)),
            ("uint8", (70000,)),
            ("float16", (3, 5, 7)),
            ("complex64", (16,)),
            ("float64", ()),
            ("bool", (9,)),
            ("float8_e4m3fn", (100,)),
        ]
        * 3
    )
]
ROUNDS = 3


def test_write_many_then_wait_all_byte_exact(transport: str, children: Children) -> None:
    names = [name for name, *_ in PLAN]
    with tw.Receiver(ring=1) as rx:  # one slot: every round waits for the last one's credits
        for name, dt, shape, _ in PLAN:
            rx.register(name, shape, dt)
        proc = children.start(send_batches, rx.address, transport, PLAN, ROUNDS)
        for r in range(ROUNDS):
            got = rx.wait_all(names, timeout=30)
            assert list(got) == names
            for name, dt, shape, seed in PLAN:
                assert got[name].tobytes() == make_array(dt, shape, seed + r).tobytes(), name
                assert not got[name].flags.writeable
            rx.release_many(names)
        children.join_ok(proc)
        assert all(rx.pending(n) == 0 for n in names)


def test_wait_each_yields_every_tensor_once(transport: str, children: Children) -> None:
    names = [name for name, *_ in PLAN]
    with tw.Receiver(ring=1) as rx:
        for name, dt, shape, _ in PLAN:
            rx.register(name, shape, dt)
        proc = children.start(send_batches, rx.address, transport, PLAN, ROUNDS)
        for r in range(ROUNDS):
            seen = []
            for name, view in rx.wait_each(names, timeout=30):
                _, dt, shape, seed = PLAN[names.index(name)]
                assert view.tobytes() == make_array(dt, shape, seed + r).tobytes(), name
                rx.release(name)  # each as soon as it is done with: the sender may go on
                seen.append(name)
            assert sorted(seen) == sorted(names)
        children.join_ok(proc)


def test_a_wait_for_several_that_runs_out_names_what_did_not_come() -> None:
    """The timeout of wait_each and wait_all says how many had no message and the first of
    them ("1 tensors" read oddly before)."""
    with tw.Receiver() as rx:
        rx.register_many([(n, (4,), "float32") for n in ("a", "b", "c")])
        with tw.Sender.connect(rx.address, transport="shm", timeout=5) as tx:
            tx.write("a", np.ones(4, np.float32))
            taken = []
            with pytest.raises(tw.WireTimeoutError, match=r"^1 tensor \(first 'b'\) had no"):
                for name, _ in rx.wait_each(["a", "b"], timeout=0.2):
                    taken.append(name)
            assert taken == ["a"]
            rx.release("a")
            with pytest.raises(tw.WireTimeoutError, match=r"^2 of 2 tensors \(first 'b'\)"):
                rx.wait_all(["b", "c"], timeout=0.2)


def test_a_bad_item_writes_nothing(transport: str) -> None:
    with tw.Receiver() as rx:
        for k in range(4):
            rx.register(f"a{k}", (8,), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
            good = np.ones(8, np.float32)
            for bad, error in (
                (np.ones(9, np.float32), tw.SpecMismatchError),
                (np.ones(8, np.float64), tw.SpecMismatchError),
                (np.ones((2, 8), np.float32)[:, 0], tw.SpecMismatchError),
            ):
                with pytest.raises(error, match="'a3'"):
                    tx.write_many([("a0", good), ("a1", good), ("a2", good), ("a3", bad)])
            with pytest.raises(tw.UnknownTensorError, match="nope"):
                tx.write_many({"a0": good, "nope": good})
            with pytest.raises(TypeError, match="got an item of type ndarray"):
                tx.write_many([("a0", good), np.ones(3, np.float32)])  # not a pair
            with pytest.raises(TypeError, match="got an item of type tuple of 4"):
                tx.write_many([("a0", good, None, 1)])
            # nothing landed: the next batch's messages are the first of each tensor
            handles = tx.write_many({f"a{k}": good * k for k in range(4)})
            assert [h.seq for h in handles] == [1, 1, 1, 1]
            got = rx.wait_all([f"a{k}" for k in range(4)], timeout=10)
            for k in range(4):
                assert np.array_equal(got[f"a{k}"], good * k)
                assert rx.pending(f"a{k}") == 0


def test_one_tensor_twice_in_a_batch(transport: str) -> None:
    with tw.Receiver(ring=2) as rx:
        rx.register("x", (4,), "int32")
        rx.register("y", (4,), "int32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
            a, b, c = (np.full(4, k, np.int32) for k in (1, 2, 3))
            handles = tx.write_many([("x", a), ("y", c), ("x", b)])
            assert [(h.name, h.seq) for h in handles] == [("x", 1), ("y", 1), ("x", 2)]
            assert np.array_equal(rx.wait("x", timeout=10), a)
            assert np.array_equal(rx.wait("x", timeout=10), b)
            assert np.array_equal(rx.wait("y", timeout=10), c)
            rx.release_many(["x", "x", "y"])


def _claims() -> dict[str, float]:
    from tensorwire import metrics

    return {how: metrics.counter("tensorwire_claims_total", how) for how in ("alone", "batched")}


def test_a_batch_s_first_writes_claim_together_and_each_claim_stands_alone(transport: str) -> None:
    """A write_many's first writes made their claims one round trip each (75 ms for 200
    tensors over shm on one host). They now go in one request (claim-many), each granted or
    refused as its own claim would be: over 1500 tensors (two requests), with one written
    before, one given twice, and one that another sender holds, whose refusal is the batch's
    error while the others are claimed, and which the batch writes once it is free."""
    names = [f"p{k}" for k in range(1500)]
    with tw.Receiver(ring=2) as rx:
        rx.register_many([(n, (2,), "int32") for n in [*names, "held"]])
        with tw.Sender.connect(rx.address, transport=transport, timeout=30) as tx:
            tx.write("p0", np.zeros(2, np.int32))  # claimed alone
            before = _claims()
            with tw.Sender.connect(rx.address, transport=transport, timeout=30) as other:
                other.write("held", np.full(2, -1, np.int32))
                batch = [(n, np.full(2, k, np.int32)) for k, n in enumerate(names)]
                with pytest.raises(tw.RemoteProtocolError, match="already written by") as busy:
                    tx.write_many([*batch, ("held", np.ones(2, np.int32))], timeout=1)
                assert busy.value.held_by_another
                assert all(rx.pending(n) == (1 if n == "p0" else 0) for n in names)
            assert rx.wait("held", timeout=10).tolist() == [-1, -1]  # the other sender's
            rx.release("held")
            counted = _claims()
            assert counted["batched"] - before["batched"] == len(names) - 1  # p0 was claimed
            tx.write_many(
                [*batch, ("p7", np.full(2, 77, np.int32)), ("held", np.ones(2, np.int32))]
            )
            assert _claims()["alone"] - counted["alone"] == 1  # held: alone, after the batch
            rx.wait("p0", timeout=10)  # the single write's
            rx.release("p0")
            got = rx.wait_all([*names, "held"], timeout=30)
            assert [int(got[n][0]) for n in names] == list(range(len(names)))
            assert got["held"].tolist() == [1, 1]
            rx.release_many([*names, "held"])
            assert rx.wait("p7", timeout=10).tolist() == [77, 77]


def test_an_address_book_too_large_to_send_is_refused_in_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A receiver whose address book was larger than a control message may be (16 MiB: 50,000
    small tensors, before books were compact) said nothing: the sender's socket dropped the
    reply, and its connect waited out its whole timeout ("did not answer a lookup request
    within 60 s: has it exited, or stopped?"). It now says why at once; here the limit is
    lowered to 64 KiB, which a book of 500 tensors of long names passes."""
    monkeypatch.setattr(control, "MAX_CONTROL_MESSAGE", 64 << 10)
    with tw.Receiver("tcp://127.0.0.1:0") as rx:
        rx.register_many([(f"{'n' * 200}{i}", (4,), "float32") for i in range(500)])
        started = time.monotonic()
        with pytest.raises(tw.RemoteProtocolError, match="address book of 500 tensors") as got:
            tw.Sender.connect(rx.address, transport="tcp", connect_timeout=20)
        assert time.monotonic() - started < 10
        assert "spread the tensors over several receivers" in str(got.value)


def test_wait_all_takes_nothing_when_one_is_missing() -> None:
    with tw.Receiver() as rx:
        rx.register("here", (4,), "float32")
        rx.register("late", (4,), "float32")
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            tx.write("here", np.arange(4, dtype=np.float32))
            with pytest.raises(tw.WireTimeoutError, match="'late'"):
                rx.wait_all(["here", "late"], timeout=0.2)
            assert rx.pending("here") == 1  # still there for the next wait
            with pytest.raises(tw.TensorWireError, match="nothing released"):
                rx.release_many(["here"])
            tx.write("late", np.ones(4, np.float32))
            got = rx.wait_all(["here", "late"], timeout=10)
            assert np.array_equal(got["here"], np.arange(4, dtype=np.float32))
            with pytest.raises(tw.TensorWireError, match="named once"):
                rx.wait_all(["here", "here"], timeout=0)
            rx.release_many(["here", "late"])


def test_release_many_checks_every_name_first() -> None:
    with tw.Receiver(ring=1) as rx:
        rx.register("a", (2,), "uint8")
        rx.register("b", (2,), "uint8")
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            tx.write("a", np.zeros(2, np.uint8))
            rx.wait("a", timeout=10)
            with pytest.raises(tw.TensorWireError, match="'b'"):
                rx.release_many(["a", "b"])
            with pytest.raises(tw.WireTimeoutError):
                tx.write("a", np.ones(2, np.uint8), timeout=0)  # 'a' is still held
            rx.release_many(["a"])
            tx.write("a", np.ones(2, np.uint8), timeout=5)


def test_a_str_is_refused_where_a_list_of_names_is_asked_for() -> None:
    """A str is an iterable of one-letter names: before, ``wait_all("ab")`` took the messages
    of tensors "a" and "b" (another thread may have been waiting for them). Refused, and
    nothing is taken or released."""
    with tw.Receiver() as rx:
        rx.register("a", (1,), "int64")
        rx.register("b", (1,), "int64")
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            tx.write_many({"a": np.array([1]), "b": np.array([2])})
            for call in (rx.wait_all, rx.release_many, lambda n: list(rx.wait_each(n))):
                with pytest.raises(TypeError, match="give a list of tensor names, not the str"):
                    call("ab")
            assert rx.pending("a") == 1 and rx.pending("b") == 1
            got = rx.wait_all(["a", "b"], timeout=5)
            assert int(got["a"][0]) == 1 and int(got["b"][0]) == 2


def test_a_tcp_batch_longer_than_one_sendmsg_takes() -> None:
    count = 700  # 1400 buffers: more than IOV_MAX (1024) in one sendmsg
    names = [f"s{k}" for k in range(count)]
    with tw.Receiver() as rx:
        for n in names:
            rx.register(n, (4,), "int32")
        with tw.Sender.connect(rx.address, transport="tcp", timeout=30) as tx:
            tx.write_many({n: np.full(4, k, np.int32) for k, n in enumerate(names)})
            got = rx.wait_all(names, timeout=30)
            assert all(int(got[n][0]) == k for k, n in enumerate(names))
            rx.release_many(names)


@pytest.mark.parametrize(
    ("nbytes", "depth"), [(4096, 32), (64 << 10, 16), (128 << 10, 8), (256 << 10, 4), (1 << 20, 2)]
)
def test_ring_depth_by_size(nbytes: int, depth: int) -> None:
    assert auto_depth(nbytes) == depth
    with tw.Receiver() as rx:  # no ring given: chosen by size
        rx.register("t", (nbytes,), "uint8")
        rx.register("mine", (nbytes,), "uint8", ring=3)  # the user's choice wins
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            data = np.zeros(nbytes, np.uint8)
            for name, slots in (("t", depth), ("mine", 3)):
                tx.write(name, data)  # the first write claims the tensor (a round trip)
                for _ in range(slots - 1):
                    tx.write(name, data, timeout=0)  # every slot free: no wait
                with pytest.raises(tw.WireTimeoutError, match=f"ring depth {slots}"):
                    tx.write(name, data, timeout=0)


@given(st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=200))
@settings(max_examples=200, deadline=None)
def test_slot_choice_is_a_free_slot_and_the_last_one_when_it_is_free(lags: list[int]) -> None:
    """A writer of a 32-slot ring whose consumer lags by a changing amount: every slot chosen
    is free (its message released), it is the slot written last whenever that one is free, and
    the ring never refuses a write that has a credit."""
    depth = 32
    chooser = SlotChooser([0] * depth)
    held = [0] * depth
    released = 0
    for seq, lag in enumerate(lags, start=1):
        released = max(released, seq - 1 - min(lag, depth - 1))  # credits come back in order
        slot = chooser.choose(released)
        assert held[slot] <= released, "a slot still holding an unreleased message was chosen"
        if held[chooser.last] <= released:
            assert slot == chooser.last
        chooser.wrote(slot, seq)
        held[slot] = seq


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_deep_ring_hands_out_every_message_in_order_whatever_the_lag(transport: str) -> None:
    """A 32-slot ring whose consumer falls behind by 0 to 31 messages and catches up again, over
    and over: every message comes out once, in order (the consumer's guess of the next slot is
    checked against the slots' sequence numbers, never trusted)."""
    rng = np.random.default_rng(7)
    with tw.Receiver() as rx:
        rx.register("t", (4,), "int64", ring=32)
        with tw.Sender.connect(rx.address, transport=transport, timeout=30) as tx:
            sent = got = 0
            for _ in range(60):
                burst = int(rng.integers(0, 33 - (sent - got)))  # never more than the credits
                for _ in range(burst):
                    tx.write("t", np.full(4, sent, np.int64), timeout=10)
                    sent += 1
                for _ in range(int(rng.integers(0, sent - got + 1))):
                    assert int(rx.wait("t", timeout=10)[0]) == got
                    rx.release("t")
                    got += 1
            while got < sent:
                assert int(rx.wait("t", timeout=10)[0]) == got
                rx.release("t")
                got += 1


def test_a_released_slot_reaches_a_writer_in_the_same_thread(transport: str) -> None:
    """Credits of a small tensor may travel in batches, yet a writer never waits for a slot its
    consumer has given back: one thread fills the ring, then over and over takes and releases
    one message and at once writes into the freed slot (no other release is coming)."""
    with tw.Receiver() as rx:
        rx.register("t", (4,), "int64", ring=8)
        with tw.Sender.connect(rx.address, transport=transport, timeout=30) as tx:
            for k in range(8):
                tx.write("t", np.full(4, k, np.int64), timeout=5)
            for k in range(8, 40):
                assert int(rx.wait("t", timeout=5)[0]) == k - 8
                rx.release("t")
                tx.write("t", np.full(4, k, np.int64), timeout=5)
            for k in range(32, 40):
                assert int(rx.wait("t", timeout=5)[0]) == k
                rx.release("t")
