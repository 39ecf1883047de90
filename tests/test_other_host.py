"""Peers on another host: senders as a receiver sees them, and receivers as a sender does.

Every other test's peers share one host, where a peer's death is told by its process (a pidfd)
and a dropped `nixl` writer is fenced by its process. Here the sender, or the receiver, runs in a
pid and mount namespace of its own (``unshare``), so its host identity differs from its peer's,
as a process on another machine or in another container does: only what crosses hosts is left,
the connections, the heartbeats, and the fences on the receiver's own side.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import tensorwire as tw
from tensorwire import wire
from tensorwire.errors import RemoteProtocolError

from .conftest import (
    free_port,
    freeze,
    hold_region_creation,
    in_pid_namespace,
    namespaced_pid,
    needs_pid_namespaces,
    shm_entries,
)

pytestmark = needs_pid_namespaces

#: writes message k of tensor "t" (1024 int64, all k) from ``start`` on, until it fails; exits 3
#: on PeerLostError, 4 on any other TensorWireError, saying which on stdout
_WRITE_FOREVER = """
import sys, numpy as np, tensorwire as tw
address, transport, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    with tw.Sender.connect(address, transport=transport, timeout=30) as tx:
        while True:
            tx.write("t", np.full(1024, k, np.int64), timeout=30)
            k += 1
except tw.PeerLostError as exc:
    print("PeerLostError:", exc, flush=True)
    sys.exit(3)
except tw.TensorWireError as exc:
    print(type(exc).__name__ + ":", exc, flush=True)
    sys.exit(4)
"""

HEARTBEAT_TIMEOUT = 1.0


def _writer(address: str, transport: str, start: int) -> subprocess.Popen[str]:
    return in_pid_namespace(
        ["-c", _WRITE_FOREVER, address, transport, str(start)], stdout=subprocess.PIPE
    )


def _stop(proc: subprocess.Popen[str]) -> str:
    """Kill ``proc`` if it still runs; what it printed."""
    if proc.poll() is None:
        proc.kill()
    out, _ = proc.communicate(timeout=30)
    return out


def _fault(proc: subprocess.Popen[str], fault: str) -> int:
    """SIGKILL (``kill``) or freeze (``freeze``) the process ``proc`` started in a namespace;
    its pid here. A kill goes to unshare, which kills it at once (``--kill-child``; killed
    itself, unshare printed a line of its own failure: bench.common.signal_target)."""
    pid = namespaced_pid(proc)
    if fault == "kill":
        proc.kill()
    else:
        freeze(pid)
    return pid


def test_a_shm_sender_on_another_host_is_told_so() -> None:
    """A `shm` sender in another pid namespace cannot write the receiver's segments by pid:
    its connect fails, saying the receiver is on another host."""
    with tw.Receiver() as rx:
        rx.register("t", (1024,), "int64")
        proc = _writer(rx.address, "shm", 0)
        try:
            assert proc.wait(60) == 4
        finally:
            out = _stop(proc)
        assert "TransportError" in out and "another host" in out, out
        with pytest.raises(tw.WireTimeoutError):
            rx.wait("t", timeout=0.2)


@pytest.mark.parametrize("fault", ["kill", "freeze"])
@pytest.mark.parametrize("transport", ["tcp", "grpc", "grpc-stream", "nixl"])
def test_a_sender_on_another_host_that_dies_or_freezes_is_dropped_and_taken_over(
    transport: str, fault: str
) -> None:
    """A sender on another host, writing numbered messages, is SIGKILLed or frozen (SIGSTOP):
    the receiver gets its messages whole and in order up to the fault, then PeerLostError
    within the heartbeat timeout (nothing of its host can tell it sooner, but a closed
    connection). A new sender from another host then takes the tensor over; a frozen one,
    resumed once that claim is made, stops with PeerLostError, and every message after the
    takeover is the new sender's, whole and in order."""
    with tw.Receiver(heartbeat_timeout=HEARTBEAT_TIMEOUT) as rx:
        rx.register("t", (1024,), "int64")
        first = _writer(rx.address, transport, 0)
        second = None
        try:
            for k in range(50):
                got = rx.wait("t", timeout=30)
                assert got[0] == got[-1] == k, f"message {k}: {got[0]}..{got[-1]}"
                rx.release("t")
            pid = _fault(first, fault)
            faulted = time.monotonic()
            last = 49
            for _ in range(100_000):  # what it wrote before the fault (bounded by its credits)
                try:
                    got = rx.wait("t", timeout=HEARTBEAT_TIMEOUT * 10)
                except tw.PeerLostError:
                    break
                assert got[0] == got[-1] == last + 1, f"after {last}: {got[0]}..{got[-1]}"
                last += 1
                rx.release("t")
            lost_after = time.monotonic() - faulted
            assert lost_after < HEARTBEAT_TIMEOUT * 5, f"told of the loss {lost_after:.1f} s after"

            second = _writer(rx.address, transport, 1_000_000)
            got = rx.wait("t", timeout=30)  # its claim was granted: its first message
            # resumed while the new sender streams (a `nixl` one frozen between reading its
            # notifications and posting its WRITE posts it now, into the ring it knew: the
            # claim moved the tensor's ring away from it)
            if fault == "freeze":
                os.kill(pid, signal.SIGCONT)
            for k in range(200):
                assert got[0] == got[-1] == 1_000_000 + k, f"message {k} of the new sender"
                rx.release("t")
                got = rx.wait("t", timeout=30)
            rx.release("t")
            if fault == "freeze":
                assert first.wait(30) == 3, _stop(first)
                assert "PeerLostError" in _stop(first)
        finally:
            _stop(first)  # a frozen one too: SIGKILL ends a stopped process
            if second is not None:
                _stop(second)


#: A `nixl` writer of tensor "t" (1024 int64) that writes messages 0..9, then prepares WRITEs of
#: -7s into every slot it takes for free (its message released, as far as it knows) and waits for
#: a line on stdin before posting them: what a writer stalled between reading its notifications
#: and posting its WRITE holds (the test freezes it there). Given the line, it posts them at
#: once, says how they ended ("posted: DONE": they landed) and exits without a goodbye. It
#: reaches into the sender's channel for that: no public call stops between the two.
_STALE_WRITE = """
import os, sys, time, numpy as np, tensorwire as tw
tx = tw.Sender.connect(sys.argv[1], transport="nixl", timeout=30)
for k in range(10):
    tx.write("t", np.full(1024, k, np.int64), timeout=30)
peer = next(iter(tx._peers.values()))
channel, writer = peer.channel, next(iter(peer.writers.values()))
agent, remote = channel._agent, channel._remote
garbage = np.full(1024, -7, np.int64)
src = channel.staging(garbage.view(np.uint8))
local = agent.get_xfer_descs([(src.address, garbage.nbytes, 0)], "DRAM")
released = channel.released(writer._tid)
requests = [
    agent.initialize_xfer(
        "WRITE", local, agent.get_xfer_descs([(slot, garbage.nbytes, 0)], "DRAM"), remote
    )
    for slot, seq in zip(writer._addresses, writer._slots.seqs)
    if seq <= released
]
print("ready", len(requests), flush=True)
sys.stdin.readline()
states = set()
for request in requests:
    state, give_up = agent.transfer(request), time.monotonic() + 15
    while state == "PROC" and time.monotonic() < give_up:
        state = agent.check_xfer_state(request)
    states.add(state)
print("posted:", ",".join(sorted(states)), flush=True)
os._exit(0)
"""


def _gauge(rx: tw.Receiver, name: str, *labels: str) -> float:
    return {(n, ls): v for n, ls, v in rx.metric_gauges()}[(name, labels)]


def _moves() -> float:
    """``tensorwire_rings_moved_total{transport="nixl"}`` of this process."""
    return tw.metrics.counter("tensorwire_rings_moved_total", "nixl")


def _until(what: str, done: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"not {what} within {timeout} s"
        time.sleep(0.01)


@pytest.mark.nixl
@pytest.mark.parametrize(
    ("successor", "left"), [("nixl", "nothing"), ("tcp", "messages unread and one held")]
)
def test_a_nixl_writer_dropped_on_another_host_cannot_store_into_its_successor_s_slots(
    successor: str, left: str
) -> None:
    """A `nixl` writer on another host stalls between reading its notifications and posting its
    WRITE (here: frozen there), is dropped for its silence, and a new writer takes the tensor
    over and fills every free slot. Resumed, the stalled writer posts WRITEs of -7s into every
    slot it took for free, and they land (UCX over TCP does not stop them: `test_nixl.py -k
    fence_probe`). The new writer's messages are untouched: the receiver moved the tensor's ring
    to fresh memory when it granted the claim, so the old writer's WRITEs land in a ring nobody
    reads. Before, they overwrote the new writer's landed messages. What the dropped writer
    left (messages not read yet, one held by the consumer; a dynamic tensor's shapes) moves
    with the ring, whole."""
    with tw.Receiver(heartbeat_timeout=HEARTBEAT_TIMEOUT) as rx:
        if left == "nothing":
            rx.register("t", (1024,), "int64", ring=16)
        else:  # a dynamic tensor: its shape words move too
            rx.register("t", (None,), "int64", max_bytes=8192, ring=16)
        stale = in_pid_namespace(
            ["-c", _STALE_WRITE, rx.address], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        second = None
        try:
            read = 10 if left == "nothing" else 4
            for k in range(read):
                got = rx.wait("t", timeout=30)
                assert got[0] == got[-1] == k, f"message {k}: {got[0]}..{got[-1]}"
                rx.release("t")
            held = None if left == "nothing" else rx.wait("t", timeout=30)
            assert stale.stdin is not None and stale.stdout is not None
            assert stale.stdout.readline().startswith("ready"), _stop(stale)
            pid = _fault(stale, "freeze")
            _until("dropped", lambda: _gauge(rx, "peers", "receiver") == 0)

            second = _writer(rx.address, successor, 1_000_000)
            # its claim was granted once a message of its own landed (the consumer holds
            # back: it fills every free slot)
            _until("claimed", lambda: rx.pending("t") > 10 - read - (held is not None))
            time.sleep(0.5)
            stale.stdin.write("go\n")
            stale.stdin.flush()
            os.kill(pid, signal.SIGCONT)
            assert stale.wait(30) == 0, _stop(stale)
            assert "posted: DONE" in _stop(stale)
            if held is not None:
                assert np.array_equal(held, np.full(1024, read, np.int64)), held
                rx.release("t")
                for k in range(read + 1, 10):  # what it left unread
                    got = rx.wait("t", timeout=30)
                    assert np.array_equal(got, np.full(1024, k, np.int64)), f"{k}: {got}"
                    rx.release("t")
            with pytest.raises(tw.PeerLostError):  # its loss, before its successor's messages
                rx.wait("t", timeout=30)
            for k in range(200):
                got = rx.wait("t", timeout=30)
                expected = np.full(1024, 1_000_000 + k, np.int64)
                assert np.array_equal(got, expected), f"message {k} of the new writer: {got}"
                rx.release("t")
            assert second.poll() is None, _stop(second)
        finally:
            _stop(stale)
            if second is not None:
                _stop(second)


def _a_nixl_writer_of_t_lost(rx: tw.Receiver) -> None:
    """A `nixl` writer of tensor "t" (1024 int64) on another host killed: dropped by ``rx``,
    which has handed out what it wrote and then its loss. The next claim of "t" moves its
    ring."""
    first = _writer(rx.address, "nixl", 0)
    try:
        assert rx.wait("t", timeout=30)[0] == 0
        rx.release("t")
        _fault(first, "kill")
        _until("dropped", lambda: _gauge(rx, "peers", "receiver") == 0)
    finally:
        _stop(first)
    with pytest.raises(tw.PeerLostError):  # what it wrote before it died, then its loss
        for _ in range(100):
            rx.wait("t", timeout=10)
            rx.release("t")


@pytest.mark.nixl
def test_a_ring_moved_into_a_region_of_its_own_holds_up_no_other_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A claim that moves a ring (its `nixl` writer on another host was dropped) into memory
    that needs a region of its own makes that region outside the receiver's lock: while the
    allocation is held midway, another sender connects and writes another tensor. Before, the
    region was made under the lock, and every other sender and the consumer waited for it."""
    # the first region made once ``hold`` is set: held until the other sender wrote
    hold = threading.Event()
    allocating, go_on = hold_region_creation(monkeypatch, lambda size: hold.is_set())
    with tw.Receiver(heartbeat_timeout=HEARTBEAT_TIMEOUT, region_bytes=64 << 10) as rx:
        rx.register("t", (1024,), "int64", ring=16)  # 128 KiB: larger than a region
        rx.register("s", (4,), "float32")
        _a_nixl_writer_of_t_lost(rx)
        placed = rx._table.by_name["t"].ring.layout
        hold.set()
        second = _writer(rx.address, "nixl", 1_000_000)
        try:
            assert allocating.wait(30), _stop(second)  # its claim moves the ring
            with tw.Sender.connect(rx.address, transport="tcp", timeout=10) as tx:
                tx.write("s", np.full(4, 5, np.float32))
                assert rx.wait("s", timeout=10).tolist() == [5.0] * 4
            go_on.set()
            assert rx.wait("t", timeout=30)[0] == 1_000_000
            assert rx._table.by_name["t"].ring.layout.region != placed.region
        finally:
            go_on.set()
            _stop(second)


@pytest.mark.nixl
def test_a_region_made_for_a_move_that_no_claim_takes_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The region made on a thread of its own for a claim that moves a ring is the claim's
    only while it asks again; one whose sender died meanwhile left it made, as large as the
    ring, until the receiver closed. The control thread's tick now closes it once it has
    been unused for ``SPARE_KEPT`` seconds, and a later claim moves the ring all the same."""
    from tensorwire.receiver import tensors

    monkeypatch.setattr(tensors, "SPARE_KEPT", 0.5)
    hold = threading.Event()
    allocating, go_on = hold_region_creation(monkeypatch, lambda size: hold.is_set())
    with tw.Receiver(heartbeat_timeout=HEARTBEAT_TIMEOUT, region_bytes=64 << 10) as rx:
        rx.register("t", (1024,), "int64", ring=16)  # 128 KiB: larger than a region
        _a_nixl_writer_of_t_lost(rx)
        before = shm_entries()
        hold.set()
        second = _writer(rx.address, "nixl", 1_000_000)
        try:
            assert allocating.wait(30), _stop(second)  # its claim moves the ring
            _fault(second, "kill")  # and never asks again
            _until("dropped", lambda: _gauge(rx, "peers", "receiver") == 0)
        finally:
            go_on.set()
            _stop(second)
        _until("made", lambda: len(shm_entries()) > len(before), timeout=10)
        _until("closed unused", lambda: shm_entries() == before, timeout=10)
        third = _writer(rx.address, "nixl", 2_000_000)
        try:
            assert rx.wait("t", timeout=30)[0] == 2_000_000
        finally:
            _stop(third)
        assert len(shm_entries()) == len(before) + 1  # the region the ring moved into


#: writes message k of tensors "a" and "b" (1024 int64 each, all k and -k) together
#: (write_many: their claims in one claim-many) from ``start`` on, until it fails
_WRITE_BOTH_FOREVER = """
import sys, numpy as np, tensorwire as tw
address, transport, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
with tw.Sender.connect(address, transport=transport, timeout=30) as tx:
    while True:
        tx.write_many({"a": np.full(1024, k, np.int64), "b": np.full(1024, -k, np.int64)})
        k += 1
"""


@pytest.mark.nixl
def test_tensors_moved_again_and_again_from_dropped_nixl_writers_keep_every_message() -> None:
    """`nixl` writers on other hosts, each killed in turn and followed by the next: every
    takeover moves both tensors' rings (the answers of one claim-many say where), the third
    back into the first ring's memory (RETIRED_RINGS kept), and each writer's messages arrive
    whole and in order, read with wait_any among 66 tensors (which then finds landed messages
    by every ring's words at once: its index of them is made anew after a move)."""
    moved_before = _moves()
    with tw.Receiver(heartbeat_timeout=HEARTBEAT_TIMEOUT) as rx:
        rx.register("a", (1024,), "int64")
        rx.register("b", (1024,), "int64")
        rx.register_many([(f"idle{k}", (1,), "int64") for k in range(64)])
        placed = []  # where "a"'s ring lay in each round
        for round_ in range(4):
            start = 1_000_000 * (round_ + 1)
            writer = in_pid_namespace(
                ["-c", _WRITE_BOTH_FOREVER, rx.address, "nixl", str(start)],
                stdout=subprocess.PIPE,
            )
            try:
                _until("connected", lambda: _gauge(rx, "peers", "receiver") == 1)
                expected = {"a": start, "b": -start}
                for _ in range(40):
                    name, got = rx.wait_any(timeout=30)
                    want = np.full(1024, expected[name], np.int64)
                    assert np.array_equal(got, want), (round_, name, expected[name], got)
                    expected[name] += 1 if name == "a" else -1
                    rx.release(name)
                assert abs(expected["a"] - start) + abs(expected["b"] + start) == 40
                placed.append(rx._table.by_name["a"].ring.layout)
                _fault(writer, "kill")
                _until("dropped", lambda: _gauge(rx, "peers", "receiver") == 0)
                for name in ("a", "b"):  # what it wrote before it died, then its loss
                    with pytest.raises(tw.PeerLostError):
                        for _ in range(100):
                            rx.wait(name, timeout=10)
                            rx.release(name)
            finally:
                _stop(writer)
        # a sender older than moves (its claim does not say it reads where the ring lies) is
        # refused a moved tensor, not let write where nobody reads
        with tw.Sender.connect(rx.address, transport="tcp", timeout=10) as tx:
            peer = tx._peers[rx.address]
            assert peer.control is not None
            old_claim = wire.Claim(peer.generation, peer.entries["a"].tensor_id, "tcp")
            with pytest.raises(RemoteProtocolError, match="predates such moves"):
                peer.control.request(old_claim, 10)
            tx.write("a", np.full(1024, 7, np.int64))  # this one's own claim is granted
            assert rx.wait("a", timeout=30)[0] == 7
            rx.release("a")
    # both tensors at each of the three takeovers, and "a" once more: the old sender's claim
    # came after the last writer was dropped (the move is made, then that claim refused)
    assert _moves() - moved_before == 7
    assert len(set(placed[:3])) == 3 and placed[3] == placed[0], placed


@pytest.mark.parametrize("transport", ["grpc", "grpc-stream", "nixl"])
def test_a_sender_restarted_on_another_host_waits_for_its_dead_self_to_be_dropped(
    transport: str,
) -> None:
    """A sender on another host is SIGKILLed and a new one started at once, as an orchestrator
    restarts a process, before the receiver drops the dead one (nothing of its host tells it;
    over these transports no connection does either): the new one's claim is asked again
    ("silent-owner") until the heartbeat timeout drops the dead one, and its messages arrive.
    Before, it was refused "busy" and the new sender failed (a parameter server restarted so
    exited 1: `bench chaos --hosts separate`, seeds 2321, 2322, 2324, 2325). Over nixl the
    receiver's pings find a killed sender's agent gone within a second or so
    (``-k ends_at_once_the_session``): there the first sender is frozen instead (SIGSTOP),
    which nothing tells the receiver either."""
    timeout = 3.0  # the new sender, starting (about 1 s), claims well before it
    with tw.Receiver(heartbeat_timeout=timeout) as rx:
        rx.register("t", (1024,), "int64")
        first = _writer(rx.address, transport, 0)
        second = None
        try:
            assert rx.wait("t", timeout=30)[0] == 0
            rx.release("t")
            _fault(first, "freeze" if transport == "nixl" else "kill")
            killed = time.monotonic()
            second = _writer(rx.address, transport, 1_000_000)
            for _ in range(100_000):  # the dead one's messages, then its loss (bounded)
                try:
                    got = rx.wait("t", timeout=30)
                except tw.PeerLostError:
                    break
                assert got[0] < 1_000_000, "the new sender wrote while the dead one held it"
                rx.release("t")
            dropped = time.monotonic() - killed
            for k in range(100):
                got = rx.wait("t", timeout=30)
                assert got[0] == got[-1] == 1_000_000 + k, f"message {k} of the new sender"
                rx.release("t")
            assert second.poll() is None, _stop(second)
            assert dropped > 1.0, f"dropped {dropped:.1f} s after: the claim met no dead owner"
        finally:
            _stop(first)
            if second is not None:
                _stop(second)


#: a receiver of tensor "t" (1024 int64) that prints its address, then reads message k == k
#: for ever; exits 5 on a message out of order
_RECEIVE_FOREVER = """
import sys, tensorwire as tw
with tw.Receiver(bind="tcp://127.0.0.1:0") as rx:
    rx.register("t", (1024,), "int64")
    print(rx.address, flush=True)
    k = 0
    while True:
        got = rx.wait("t", timeout=120)
        if not got[0] == got[-1] == k:
            sys.exit(5)
        rx.release("t")
        k += 1
"""


@pytest.mark.parametrize("fault", ["kill", "freeze"])
@pytest.mark.parametrize("transport", ["tcp", "grpc", "grpc-stream", "nixl"])
def test_a_receiver_on_another_host_that_dies_or_freezes_ends_its_sender_s_writes(
    transport: str, fault: str
) -> None:
    """A receiver on another host is SIGKILLed or frozen while a sender here streams to it.
    The sender cannot look at its process (that pid names nothing, or another process, here),
    so a write raises PeerLostError once the connection closes or the heartbeats go unanswered,
    within seconds (0.01-0.02 s after a kill, the connection reset; 0.7-0.9 s after a freeze,
    three heartbeats of 0.2 s missed), and `lost()` says why from then on."""
    receiver = in_pid_namespace(["-c", _RECEIVE_FOREVER], stdout=subprocess.PIPE)
    try:
        assert receiver.stdout is not None
        address = receiver.stdout.readline().strip()
        assert address.startswith("tcp://"), address
        with tw.Sender.connect(address, transport=transport, timeout=10, heartbeat=0.2) as tx:
            for k in range(50):
                tx.write("t", np.full(1024, k, np.int64))
            pid = _fault(receiver, fault)
            faulted = time.monotonic()
            with pytest.raises(tw.PeerLostError):
                for k in range(50, 100_000):  # bounded: its credits run out after a few
                    tx.write("t", np.full(1024, k, np.int64), timeout=10)
                    time.sleep(0.001)
            lost_after = time.monotonic() - faulted
            assert lost_after < 5, f"told of the loss {lost_after:.1f} s after"
            why = tx.lost() or ""
            # Over tcp it said None after a hang-up's PeerLostError (its reason is kept now).
            assert why, "lost() names no reason after a PeerLostError"
            assert "died" not in why, why  # no verdict on a process it cannot see
            if fault == "freeze":
                assert "missed 3 heartbeats" in why, why
        if fault == "freeze":
            os.kill(pid, signal.SIGCONT)
    finally:
        _stop(receiver)


@pytest.mark.parametrize("transport", ["tcp", "nixl", "grpc", "grpc-stream"])
def test_lost_sees_at_once_a_receiver_killed_on_another_host_without_a_write(
    transport: str,
) -> None:
    """``Sender.lost()`` looks at the data channel where no call holds it: a receiver killed
    on another host (its kernel closes the connections) is named gone within a few seconds by
    an idle sender, whose heartbeats (30 s apart here) have not missed one yet: over tcp by
    the connection's end, over nixl by a ping NIXL refuses. Before, lost() said None until
    three heartbeats went unanswered, and a parameter server that asks it of a worker killed
    on another host before its first push waited that long (20 s with the daemons' 5 s
    heartbeats, measured). Over gRPC, by a connection attempt refused once gRPC saw its
    connection end (before, the same 20 s)."""
    receiver = in_pid_namespace(["-c", _RECEIVE_FOREVER], stdout=subprocess.PIPE)
    try:
        assert receiver.stdout is not None
        address = receiver.stdout.readline().strip()
        assert address.startswith("tcp://"), address
        with tw.Sender.connect(address, transport=transport, timeout=10, heartbeat=30) as tx:
            tx.write("t", np.zeros(1024, np.int64))
            assert tx.lost() is None
            _fault(receiver, "kill")
            deadline = time.monotonic() + 5
            while (why := tx.lost()) is None and time.monotonic() < deadline:
                time.sleep(0.02)
            # tcp: its hang-up, or its reset where data it had not read was left in its socket
            expected = {"tcp": "data connection", "nixl": "NIXL notification"}.get(
                transport, "could not be made"
            )
            assert why is not None and expected in why, why
    finally:
        _stop(receiver)


#: a nixl sender that writes messages 0, 1 and 2 of "t", says so, and idles
_SEND_THREE_AND_IDLE = """
import sys, time, numpy as np, tensorwire as tw
tx = tw.Sender.connect(sys.argv[1], transport="nixl", timeout=30, heartbeat=1)
for k in range(3):
    tx.write("t", np.full(1024, k, np.int64))
print("sent", flush=True)
time.sleep(600)
"""


@contextlib.contextmanager
def _three_sent_from_another_host() -> Iterator[tuple[tw.Receiver, subprocess.Popen[str]]]:
    """A nixl receiver (heartbeat timeout 30 s) of "t" (4 slots), and a nixl sender in a pid
    namespace of its own that wrote its messages 0, 1 and 2 and idles; stopped at the end."""
    with tw.Receiver(heartbeat_timeout=30, nixl=True) as rx:
        rx.register("t", (1024,), "int64", ring=4)
        sender = in_pid_namespace(["-c", _SEND_THREE_AND_IDLE, rx.address], stdout=subprocess.PIPE)
        try:
            assert sender.stdout is not None
            assert sender.stdout.readline().strip() == "sent"
            yield rx, sender
        finally:
            _stop(sender)


@pytest.mark.nixl
def test_a_receiver_ends_at_once_the_session_of_a_nixl_sender_killed_on_another_host() -> None:
    """A nixl sender on another host writes three messages and is SIGKILLed: the receiver
    (heartbeat timeout 30 s) hands out all three, and the next wait raises PeerLostError
    within a second or so: its NIXL server pings its senders each second, and NIXL refuses
    the notification to an agent UCX found disconnected. Before, the session ended at the
    heartbeat timeout (30.0 s, by hand): the credits of the three releases left before UCX
    saw the connection's end, and nothing else was sent there."""
    with _three_sent_from_another_host() as (rx, sender):
        _fault(sender, "kill")
        start = time.monotonic()
        for k in range(3):  # every message it wrote, whole
            assert int(rx.wait("t", timeout=10)[0]) == k
            rx.release("t")
        with pytest.raises(tw.PeerLostError, match="NIXL agent is disconnected"):
            rx.wait("t", timeout=20)
        assert time.monotonic() - start < 10, "seen only by the heartbeat timeout"


@pytest.mark.nixl
def test_a_consumer_that_polls_without_rest_still_sees_a_nixl_sender_killed_on_another_host() -> (
    None
):
    """As above, but the consumer never rests: it polls (``wait(timeout=0)``, as a loop that
    looks for a message between chunks of its own work), and its polls drive the NIXL server
    while the server's own thread stands back. The session still ends within a second or so
    of the kill: whoever polls makes the pings and the look at disconnected senders, the
    consumer too. Before, only the server's thread made them, and a consumer that never
    rested held them off: the session ended at the heartbeat timeout (30 s)."""
    with _three_sent_from_another_host() as (rx, sender):
        for k in range(3):
            assert int(rx.wait("t", timeout=10)[0]) == k
            rx.release("t")
        _fault(sender, "kill")
        start = time.monotonic()
        lost = None
        polls = 0
        while lost is None and time.monotonic() - start < 20 and polls < 50_000_000:
            polls += 1
            try:
                rx.wait("t", timeout=0)
                pytest.fail("a message of a killed sender came")
            except tw.WireTimeoutError:
                continue
            except tw.PeerLostError as exc:
                lost = exc
        assert lost is not None, f"not seen within 20 s of polling ({polls} polls)"
        assert "NIXL agent is disconnected" in str(lost)
        assert time.monotonic() - start < 10, "seen only by the heartbeat timeout"


#: like _RECEIVE_FOREVER at a given address, saying each message's first value on stdout
_RECEIVE_AND_SAY = """
import sys, tensorwire as tw
with tw.Receiver(bind=sys.argv[1]) as rx:
    rx.register("t", (1024,), "int64")
    print(rx.address, flush=True)
    while True:
        got = rx.wait("t", timeout=120)
        print(int(got[0]) if got[0] == got[-1] else "torn", flush=True)
        rx.release("t")
"""


@pytest.mark.parametrize("transport", ["tcp", "grpc", "grpc-stream", "nixl"])
def test_a_sender_with_reconnect_writes_on_into_a_receiver_restarted_on_another_host(
    transport: str,
) -> None:
    """A receiver on another host is SIGKILLed and started again at its address (as an
    orchestrator restarts it): a sender with ``reconnect=True`` writes on, its next writes
    landing whole in the new receiver (a new generation), none lost after the restart."""
    bind = f"tcp://127.0.0.1:{free_port()}"
    first = in_pid_namespace(["-c", _RECEIVE_AND_SAY, bind], stdout=subprocess.PIPE)
    second = None
    try:
        assert first.stdout is not None
        address = first.stdout.readline().strip()
        with tw.Sender.connect(
            address, transport=transport, timeout=10, heartbeat=0.2, reconnect=True
        ) as tx:
            for k in range(10):
                tx.write("t", np.full(1024, k, np.int64))
            _fault(first, "kill")
            _stop(first)
            second = in_pid_namespace(["-c", _RECEIVE_AND_SAY, bind], stdout=subprocess.PIPE)
            assert second.stdout is not None
            assert second.stdout.readline().strip() == address
            for k in range(10, 20):
                tx.write("t", np.full(1024, k, np.int64), timeout=20)
            said = [second.stdout.readline().strip() for _ in range(10)]
            assert said == [str(k) for k in range(10, 20)]
    finally:
        _stop(first)
        if second is not None:
            _stop(second)
