"""``Sender.write``'s fast route: a tensor written once before takes a shorter path (no route
lookup, the spec's checks inline, no deadline unless it must wait). Whatever that path does not
take must still reach the general one, with the same answers: these tests write once to set the
route up, then give it every case it hands on.

Refused arrays, restarted and closed receivers and revoked claims after a first write are in
the conformance, fault and fencing suites; here are the cases only this path has."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import tensorwire as tw

#: the transports with a fast route: every static host tensor over shm, small ones over nixl
FAST = ["shm", "nixl"]


@pytest.mark.parametrize("transport", FAST)
def test_a_full_ring_is_waited_for_after_a_fast_write(transport: str) -> None:
    """No credit: the fast route hands over, the write waits (bounded) and lands when a slot
    comes back, and a timeout writes nothing."""
    with tw.Receiver() as rx:
        rx.register("t", (8,), "int64", ring=2)
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as tx:
            for k in range(2):
                tx.write("t", np.full(8, k, np.int64))
            held = [rx.wait("t", timeout=5).copy() for _ in range(2)]
            with pytest.raises(tw.WireTimeoutError, match="no free slot"):
                tx.write("t", np.full(8, 9, np.int64), timeout=0.2)
            assert rx.pending("t") == 0  # the refused write left nothing behind

            released = threading.Timer(0.2, rx.release, ("t",))
            released.start()
            start = time.monotonic()
            handle = tx.write("t", np.full(8, 2, np.int64), timeout=5)
            waited = time.monotonic() - start
            released.join(5)
            assert handle.seq == 3
            assert waited > 0.1, "the write went ahead without a free slot"
            assert [h.tolist()[0] for h in held] == [0, 1]
            rx.release("t")
            assert rx.wait("t", timeout=5).tolist() == [2] * 8


@pytest.mark.parametrize("transport", FAST)
def test_arrays_the_fast_route_does_not_take_still_land_or_are_refused(transport: str) -> None:
    """After a fast write: a subclass of ndarray and an array that is not contiguous (with
    ``allow_copy``) land through the general path, byte-exact; the other byte order and a
    negative timeout are refused and leave the slot as it was. A received view (the fast
    route takes it: an echo writes what it got) lands byte-exact too."""

    class Tagged(np.ndarray):  # type: ignore[type-arg]
        pass

    with tw.Receiver() as rx:
        rx.register("t", (4, 4), "float32")
        rx.register("echo", (4, 4), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as tx:
            good = np.arange(16, dtype=np.float32).reshape(4, 4)
            tx.write("t", good)
            assert np.array_equal(rx.wait("t", timeout=5), good)
            rx.release("t")

            tx.write("t", (good + 1).view(Tagged))
            assert np.array_equal(rx.wait("t", timeout=5), good + 1)
            rx.release("t")

            wide = np.arange(32, dtype=np.float32).reshape(4, 8)
            tx.write("t", wide[:, ::2], allow_copy=True)
            assert np.array_equal(rx.wait("t", timeout=5), wide[:, ::2])
            rx.release("t")

            with pytest.raises(tw.SpecMismatchError, match="dtype mismatch"):
                tx.write("t", good.astype(">f4"))
            with pytest.raises(ValueError, match="timeout must be"):
                tx.write("t", good, timeout=-1)
            with pytest.raises(tw.WireTimeoutError):
                rx.wait("t", timeout=0.1)
            tx.write("t", good + 2)
            for k in range(3):  # the first write sets the route up, the others take it
                got = rx.wait("t", timeout=5)
                assert np.array_equal(got, good + 2 + k)
                tx.write("echo", got)
                rx.release("t")
                tx.write("t", good + 3 + k)
                assert np.array_equal(rx.wait("echo", timeout=5), good + 2 + k)
                rx.release("echo")


def test_fast_routes_follow_names_to_their_receivers_and_end_at_close() -> None:
    """Two receivers, a tensor each: every name's writes land at its own receiver, in order;
    an explicit ``peer`` takes the general path beside them; a closed sender refuses."""
    with tw.Receiver() as rx_a, tw.Receiver() as rx_b:
        rx_a.register("a", (4,), "int32")
        rx_b.register("b", (4,), "int32")
        tx = tw.Sender(transport="shm", timeout=5)
        try:
            tx.add_peer(rx_a.address)
            tx.add_peer(rx_b.address)
            for k in range(5):
                tx.write("a", np.full(4, k, np.int32))
                tx.write("b", np.full(4, 10 + k, np.int32), peer=rx_b.address if k % 2 else None)
                assert rx_a.wait("a", timeout=5).tolist() == [k] * 4
                assert rx_b.wait("b", timeout=5).tolist() == [10 + k] * 4
                rx_a.release("a")
                rx_b.release("b")
        finally:
            tx.close()
        with pytest.raises(tw.ClosedError):
            tx.write("a", np.zeros(4, np.int32))
        assert rx_a.pending("a") == 0
