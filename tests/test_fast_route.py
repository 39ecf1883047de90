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

#: the transports with a fast route: every static host tensor over shm and tcp, small ones over
#: nixl
FAST = ["shm", "tcp", "nixl"]


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

            with pytest.raises(tw.SpecMismatchError, match="byte order mismatch"):
                tx.write("t", good.astype(">f4"))
            with pytest.raises(ValueError, match="timeout must be"):
                tx.write("t", good, timeout=-1)
            with pytest.raises(ValueError, match="timeout must be"):
                tx.write("t", good, timeout=float("nan"))  # a deadline that never passes
            # the fast route (the tensor written before) raised "'>=' not supported between
            # instances of 'str' and 'int'" for a string, and took True for 1 s
            for odd in ("1", True):
                with pytest.raises(ValueError, match="timeout must be None, 0 or positive"):
                    tx.write("t", good, timeout=odd)
            with pytest.raises(ValueError, match="timeout must be"):
                rx.wait("t", timeout=float("nan"))  # before: waited for ever
            with pytest.raises(ValueError, match="timeout must be"):
                rx.wait("t", timeout="5")  # before: "'>=' not supported between ..."
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


@pytest.mark.parametrize("transport", FAST)
@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float16", "complex64", "bool"])
def test_every_dtype_takes_the_fast_route_byte_exact(transport: str, dtype: str) -> None:
    """numpy exports no buffer of ml_dtypes' formats (bfloat16, float8): the fast route reaches
    their bytes another way, and every message lands as written."""
    rng = np.random.default_rng(7)
    with tw.Receiver() as rx:
        rx.register("t", (3, 5), dtype)
        with tw.Sender.connect(rx.address, transport=transport, timeout=5) as tx:
            for _ in range(4):  # the first write sets the route up, the others take it
                raw = rng.integers(0, 256, 3 * 5 * rx.specs["t"].dtype.itemsize, dtype=np.uint8)
                if dtype == "bool":
                    raw &= 1  # a bool byte is 0 or 1
                sent = raw.view(rx.specs["t"].dtype).reshape(3, 5)
                tx.write("t", sent)
                got = rx.wait("t", timeout=5)
                assert got.dtype == sent.dtype
                assert bytes(got.view(np.uint8)) == bytes(raw)
                rx.release("t")


def test_tcp_fast_frames_the_socket_takes_in_parts_land_whole() -> None:
    """A tcp frame larger than the socket can take at once (8 MiB) leaves its fast route part
    way and is finished by the write's deadline; every message lands whole, in order."""
    count, size = 6, 2 << 20
    with tw.Receiver() as rx:
        rx.register("big", (size,), "float32", ring=2)
        with tw.Sender.connect(rx.address, transport="tcp", timeout=10) as tx:
            got: list[float] = []

            def consume() -> None:
                for _ in range(count):
                    view = rx.wait("big", timeout=10)
                    assert view[0] == view[-1] == view[size // 2]
                    got.append(float(view[0]))
                    rx.release("big")

            reader = threading.Thread(target=consume)
            reader.start()
            for k in range(count):
                tx.write("big", np.full(size, k, np.float32))
            reader.join(30)
            assert not reader.is_alive()
            assert got == [float(k) for k in range(count)]


def test_a_tcp_fast_write_polls_again_after_a_pause_and_sees_a_closed_receiver() -> None:
    """A tcp write with credit in hand skips the poll for credits and hang-ups while the last
    one is younger than ``ABSORB_EVERY``. A stream of many times the ring's depth still takes
    every credit it needs and lands whole, in order; after a pause the poll comes again, so the
    first write after the receiver closed raises, where a write without the poll would go into
    the closed connection and return as if written (it does, with the poll taken out)."""
    from tensorwire.transports.tcp import ABSORB_EVERY

    rx = tw.Receiver()
    try:
        rx.register("t", (1024,), "float32", ring=8)
        with tw.Sender.connect(rx.address, transport="tcp", timeout=10) as tx:
            for k in range(200):  # 25 times the depth: credits must keep coming in
                tx.write("t", np.full(1024, k, np.float32))
                got = rx.wait("t", timeout=10)
                assert got[0] == got[-1] == k
                rx.release("t")
            time.sleep(0.05)  # the credits held back go out; the next write takes them in
            tx.write("t", np.ones(1024, np.float32))
            rx.wait("t", timeout=10)
            rx.release("t")
            writer = tx._fast["t"][0]  # the case under test: the next write has its credit
            assert writer._channel.released(writer._tid) >= writer.next_seq - writer._depth
            rx.close()  # everything consumed: a clean hang-up, which a send does not notice
            time.sleep(ABSORB_EVERY + 0.2)
            with pytest.raises(tw.PeerLostError):
                tx.write("t", np.zeros(1024, np.float32))
    finally:
        rx.close()


def test_fast_routes_follow_names_to_their_receivers_and_end_at_close() -> None:
    """Two receivers, a tensor each: every name's writes land at its own receiver, in order;
    an explicit ``peer`` takes a route of its own beside them; a closed sender refuses."""
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


@pytest.mark.parametrize("transport", FAST)
def test_a_name_two_receivers_publish_has_a_fast_route_to_each(transport: str) -> None:
    """Two receivers publish the same name (as a parameter server's workers do): writes
    naming each (``peer=``) take a fast route of their own and land at their own receiver, in
    order; the name alone stays refused as ambiguous; a ``buffer()`` block at one drops its
    route and the writes after it land in order; a receiver removed ends its route (a write
    naming it is refused), and the other's goes on."""

    def taken(rx: tw.Receiver) -> int:
        value = int(rx.wait("t", timeout=5)[0])
        rx.release("t")
        return value

    with tw.Receiver() as a, tw.Receiver() as b:
        for rx in (a, b):
            rx.register("t", (4,), "int64")
        with tw.Sender(transport=transport, timeout=5) as tx:
            tx.add_peer(a.address)
            tx.add_peer(b.address)
            got: dict[str, list[int]] = {"a": [], "b": []}
            for k in range(6):
                tx.write("t", np.full(4, k, np.int64), peer=a.address)
                tx.write("t", np.full(4, 100 + k, np.int64), peer=b.address)
                got["a"].append(taken(a))
                got["b"].append(taken(b))
                assert ("t", a.address) in tx._fast and ("t", b.address) in tx._fast
                if k == 3:
                    with tx.buffer("t", peer=a.address) as out:
                        out[:] = 50
                    assert ("t", a.address) not in tx._fast  # (made again by the next write)
                    got["a"].append(taken(a))
            assert got == {"a": [0, 1, 2, 3, 50, 4, 5], "b": [100, 101, 102, 103, 104, 105]}
            with pytest.raises(tw.TensorWireError, match="published by several receivers"):
                tx.write("t", np.zeros(4, np.int64))
            tx.remove_peer(b.address)
            with pytest.raises(tw.TensorWireError, match="not connected to"):
                tx.write("t", np.zeros(4, np.int64), peer=b.address)
            tx.write("t", np.full(4, 7, np.int64), peer=a.address)
            assert taken(a) == 7
            assert b.pending("t") == 0
