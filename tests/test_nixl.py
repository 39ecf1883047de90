"""What is particular to the ``nixl`` transport (the conformance suite covers what it shares).

NIXL runs here over UCX's cross-memory-attach and TCP transports (there is no RDMA fabric on this
machine); the same code paths post real NIXL WRITEs and notifications.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import tensorwire as tw
from tensorwire import wire
from tensorwire.rdma import NixlOptions, cuda_devices_present

from .conftest import Children, free_port, freeze
from .peers import (
    count_empty_messages,
    echo_over,
    run_conformance_hiding,
    run_hiding,
    run_receiver_slow_to_start_nixl,
)

NIXL_PACKAGES = ("nixl_cu12", "nixl_cu13", "nixl")


def _run_without_nixl(body: str, *args: str) -> list[str]:
    return run_hiding(NIXL_PACKAGES, body, *args)


def _peer(tx: tw.Sender, address: str):  # type: ignore[no-untyped-def]
    return tx._peers[address]


@pytest.mark.nixl  # (the receiver in this process serves nixl: the sender's own lack is said)
def test_without_nixl_every_side_says_how_to_install_it_in_one_line() -> None:
    with tw.Receiver() as rx:
        rx.register("t", (4,), "float32")
        lines = _run_without_nixl(
            """
            try:
                tw.Receiver(nixl=True)
            except tw.TransportError as exc:
                print("receiver:", exc)
            try:
                tw.Sender.connect(sys.argv[1], transport="nixl", timeout=10)
            except tw.TransportError as exc:
                print("sender:", exc)
            with tw.Receiver() as rx:  # serves the other transports, and says nixl is absent
                rx.register("t", (4,), "float32")
                try:
                    tw.Sender.connect(rx.address, transport="nixl", timeout=10)
                except tw.TransportError as exc:
                    print("receiver without:", exc)
                with tw.Sender.connect(rx.address, timeout=10) as tx:
                    print("auto:", tx.transport_of())
            """,
            rx.address,
        )
    assert len(lines) == 4, lines
    assert lines[0].startswith("receiver: ") and "tensorwire[nixl]" in lines[0]
    assert lines[1].startswith("sender: ") and "pip install --no-deps 'nixl-cu12==" in lines[1]
    assert lines[2].startswith("receiver without: ") and "does not serve nixl" in lines[2]
    assert lines[3] == "auto: shm"


@pytest.mark.nixl
def test_auto_never_picks_nixl_and_a_receiver_may_refuse_it() -> None:
    with tw.Receiver() as rx:
        rx.register("t", (4,), "float32")
        with tw.Sender.connect(rx.address, timeout=10) as tx:
            assert tx.transport_of() == "shm"
        assert "nixl" not in rx._servers  # served on demand: nobody attached, so no agent started
    with tw.Receiver(nixl=False) as rx:
        rx.register("t", (4,), "float32")
        with pytest.raises(tw.TransportError, match="does not serve nixl"):
            tw.Sender.connect(rx.address, transport="nixl", timeout=10)


@pytest.mark.nixl
def test_ucx_over_tcp_byte_exact() -> None:
    """The path a second host would take: UCX's TCP transport instead of cross-memory attach."""
    over_tcp = NixlOptions(tls="tcp")
    src = np.random.default_rng(1).standard_normal(1 << 20).astype(np.float32)  # 4 MiB
    with tw.Receiver(nixl=over_tcp) as rx:
        rx.register("big", src.shape, "float32")
        rx.register("dyn", (None, 3), "int64", max_bytes=1 << 16)
        with tw.Sender.connect(rx.address, transport="nixl", timeout=30, nixl=over_tcp) as tx:
            for k in range(3):
                tx.write("big", src + k)
                assert np.array_equal(rx.wait("big", timeout=30), src + k)
                rx.release("big")
            tx.write("dyn", np.arange(21, dtype=np.int64).reshape(7, 3))
            got = rx.wait("dyn", timeout=30)
            assert got.shape == (7, 3) and got[-1, -1] == 20
            rx.release("dyn")


_NOTIFY_LANE = """
import sys
import time
import numpy as np
import tensorwire as tw
opts = tw.NixlOptions(env=dict(a.split("=", 1) for a in sys.argv[1:]))
with tw.Receiver(nixl=opts) as rx:
    rx.register("t", (4,), "float32")
    with tw.Sender.connect(rx.address, transport="nixl", timeout=30, nixl=opts) as tx:
        tx.write("t", np.ones(4, np.float32))
        assert rx.wait("t", timeout=30)[0] == 1
        rx.release("t")
"""


def _notification_lanes(*env: str) -> set[str]:
    """The UCX transports that carry small active messages (NIXL's notifications) between two
    agents of a child process, as UCX itself reports them (``UCX_PROTO_INFO``)."""
    proc = subprocess.run(
        [sys.executable, "-c", _NOTIFY_LANE, *env],
        env={**os.environ, "UCX_PROTO_INFO": "y"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lanes: set[str] = set()
    table = False
    for line in (proc.stdout + proc.stderr).splitlines():
        if "active message by ucp_am_send* from host memory" in line:
            table = True
        elif table and "| short " in line:
            lanes.add(line.rsplit("|", 2)[-2].strip())  # the Config column
            table = False
    assert lanes, "UCX printed no protocol table for active messages"
    return lanes


@pytest.mark.nixl
def test_notifications_between_processes_of_one_host_go_over_tcp_unless_asked() -> None:
    """By default the headers and credits between two processes of one host travel over tcp/lo:
    through UCX's shared-memory FIFO (UCX_MM_ERROR_HANDLING=y, which NIXL's peer-failure
    handling needs there) a peer SIGKILLed mid-notification leaves the receiving agent deaf to
    every process of the host for good (python -m tensorwire.bench.notifier_kills). Asked for,
    they take shared memory."""
    assert "UCX_MM_ERROR_HANDLING" not in NixlOptions().environment(True)
    kept = NixlOptions(env={"UCX_MM_ERROR_HANDLING": "y"}).environment(True)
    assert kept["UCX_MM_ERROR_HANDLING"] == "y"
    assert all(lane.startswith("tcp/") for lane in _notification_lanes())
    assert all(lane.endswith("/memory") for lane in _notification_lanes("UCX_MM_ERROR_HANDLING=y"))


@pytest.mark.nixl
def test_the_notifier_kills_probe_runs_and_the_default_keeps_the_receiver_hearing() -> None:
    """``python -m tensorwire.bench.notifier_kills`` with the default setting: two peers
    SIGKILLed mid-notification, and the receiver still hears the peer connected all along (with
    ``y`` it stopped hearing it after a few kills in each run made; too slow and too random for a
    test: the figures are in docs/rdma.md)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tensorwire.bench.notifier_kills", "--rounds", "2", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == (
        "UCX_MM_ERROR_HANDLING=n: the receiver heard the peer after each of 2 kills"
    )


@pytest.mark.nixl
def test_the_fence_probe_sees_a_dropped_writers_write_land_over_tcp() -> None:
    """``python -m tensorwire.bench.nixl_fence --tls tcp`` (UCX's transport between hosts
    without InfiniBand): a WRITE the writer posts after the receiver removed its agent, as
    tensorwire does when it drops a session, still lands, and so does one after the receiver
    deregistered the memory: over tcp UCX does not check the target's registration. This is
    why a receiver moves the ring of a tensor whose `nixl` writer it dropped on another host
    (`test_other_host.py -k cannot_store`); should a UCX release fence it, this fails, and the
    move could be left to the fabrics that need it."""
    proc = subprocess.run(
        [sys.executable, "-m", "tensorwire.bench.nixl_fence", "--tls", "tcp", "--size", "65536"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines == [
        f"UCX_TLS=tcp, {after}: the dropped writer's WRITE landed (its transfer: DONE)"
        for after in (
            "with nothing done",
            "after remove_remote_agent",
            "after deregister_memory",
        )
    ], proc.stdout


@pytest.mark.nixl
def test_ends_that_disagree_on_shared_memory_error_handling_are_refused_not_crashed() -> None:
    """Two agents of one host with and without UCX_MM_ERROR_HANDLING find no transport to each
    other, and NIXL 1.5.1 then crashed the process that loaded the other's metadata. The receiver
    refuses such a sender at attach, with the setting's name; ends that agree work."""
    on = NixlOptions(env={"UCX_MM_ERROR_HANDLING": "y"})
    with tw.Receiver(nixl=on) as rx:
        rx.register("t", (4,), "float32")
        with pytest.raises(tw.ProtocolError, match="UCX_MM_ERROR_HANDLING=n and this receiver"):
            tw.Sender.connect(rx.address, transport="nixl", timeout=10)
        with tw.Sender.connect(rx.address, transport="nixl", timeout=10, nixl=on) as tx:
            tx.write("t", np.full(4, 7, np.float32))
            assert rx.wait("t", timeout=10)[0] == 7
            rx.release("t")


@pytest.mark.nixl
def test_two_processes_that_connect_to_each_other_at_once(children: Children) -> None:
    """Each side's receiver starts its agent (on demand, on a thread of its own) while the main
    thread creates the sender's agents. An agent created while another's UCX settings were
    exported for the moment once took those for the user's own and was created with none of
    them: without ``lo`` for a loopback endpoint, and without the shared-memory error handling
    its peer had, so that UCX found no transport between them and NIXL crashed the process."""
    here, there = children.pipe()
    proc = children.start(echo_over, there, "nixl", 50)
    with tw.Receiver() as rx:
        rx.register("pong", (1024,), "float32")
        assert here.poll(30)
        peer = here.recv()
        here.send(rx.address)  # the echo connects to us now, while we connect to it
        with tw.Sender.connect(peer, transport="nixl", timeout=30) as tx:
            for k in range(50):
                tx.write("ping", np.full(1024, k, np.float32))
                got = rx.wait("pong", timeout=30)
                assert got[0] == k and got[-1] == k
                rx.release("pong")
        children.join_ok(proc)


@pytest.mark.nixl
def test_a_receiver_answers_heartbeats_while_its_nixl_server_starts(children: Children) -> None:
    """A receiver starts its NIXL server when the first sender attaches. Creating the agent
    takes a fresh process about 0.45 s here and over a second on a GPU host; it used to run on
    the receiver's control thread, which then answered nobody, so a sender heartbeating every
    0.2 s (lost after 3 missed) gave the receiver up during the attach on an H100 host. Now the
    server starts on a thread of its own, the attach is answered "starting" and asked again,
    and the heartbeats are answered meanwhile. The receiver's agent takes 2 s longer here, as
    on a slow host: a sender heartbeating every 0.05 s instead, on this host's own creation
    time, gave the receiver up in a suite run on a slow day, NIXL's creation holding the GIL
    for stretches beyond its 0.2 s of silence."""
    here, there = children.pipe()
    proc = children.start(run_receiver_slow_to_start_nixl, there, [("t", (1024,), "float32")], 2.0)
    assert here.poll(60)
    address = here.recv()["address"]
    with tw.Sender.connect(address, transport="nixl", timeout=30, heartbeat=0.2) as tx:
        assert tx.transport_of() == "nixl"
        tx.write("t", np.full(1024, 2.0, np.float32))
        here.send(("t", 30))
        assert here.poll(30) and here.recv() == ("ok", 2048.0)
    here.send("stop")
    children.join_ok(proc)


@pytest.mark.nixl
def test_headers_that_could_not_leave_at_once_arrive_while_the_sender_is_quiet(
    children: Children,
) -> None:
    """Empty messages are headers alone. Written while the receiver is stopped, the first ~250
    fill its notification queue and the rest wait in UCX for progress on the sending side;
    write() has returned for all of them. The sender then makes no call at all: its idle
    progress must send them (without it, 50 of 300 were missing 5 s after the receiver
    resumed)."""
    count = 300
    here, there = children.pipe()
    proc = children.start(count_empty_messages, there, count)
    assert here.poll(30)
    with tw.Sender.connect(here.recv(), transport="nixl", timeout=30) as tx:
        tx.write("t", np.zeros(0, np.uint8))  # claimed while the receiver runs
        freeze(proc.pid)
        try:
            for _ in range(count - 1):
                tx.write("t", np.zeros(0, np.uint8))
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        here.send("go")
        assert here.poll(30)
        assert here.recv() == count  # the sender made no call meanwhile
    children.join_ok(proc)


@pytest.mark.nixl
def test_notifications_out_of_order_complete_in_order() -> None:
    with tw.Receiver(ring=2) as rx:
        rx.register("d", (None, None), "float32", max_bytes=64)
        with tw.Sender.connect(rx.address, transport="nixl", timeout=10) as tx:
            peer = _peer(tx, rx.address)
            entry = peer.entries["d"]
            writer = peer.writer(entry)
            channel = peer.channel
            first, second = writer.next_seq, writer.next_seq + 1
            gen = peer.generation
            counter = channel.counter
            h1 = wire.DataHeader(entry.tensor_id, 0, gen, first, 0, (0, 3))
            h2 = wire.DataHeader(entry.tensor_id, 1, gen, second, 0, (0, 5))
            agent = channel._notifier  # the agent the receiver knows as this sender
            agent.send_notif(channel._remote, wire.encode_notification(counter + 1, h2))
            agent.send_notif(channel._remote, wire.encode_notification(counter, h1))
            channel._absorb()  # progress: NIXL sends a notification only when we progress
            assert rx.wait("d", timeout=10).shape == (0, 3)
            assert rx.wait("d", timeout=10).shape == (0, 5)
            rx.release("d")
            rx.release("d")
            channel._counter += 2  # keep the sender's count in step with what it injected
            writer.next_seq += 2
            writer._slots.wrote(0, first)
            writer._slots.wrote(1, second)
            tx.write("d", np.ones((2, 2), np.float32))
            assert rx.wait("d", timeout=10).shape == (2, 2)


@pytest.mark.nixl
@pytest.mark.parametrize("forgery", ["wrong sequence", "garbage"])
def test_a_sender_breaking_the_rules_is_cut_off(forgery: str) -> None:
    with tw.Receiver() as rx:
        rx.register("t", (4,), "float32")
        rx.register("other", (8,), "float32")
        with tw.Sender.connect(rx.address, transport="nixl", timeout=5) as tx:
            tx.write("t", np.zeros(4, np.float32))
            rx.wait("t", timeout=5)
            rx.release("t")
            peer = _peer(tx, rx.address)
            entry = peer.entries["t"]
            if forgery == "garbage":
                raw, why = b"TWDF" + os.urandom(40), "protocol error"
            else:
                forged = wire.DataHeader(entry.tensor_id, 0, peer.generation, 99, 16, None)
                raw = wire.encode_notification(peer.channel.counter, forged)
                why = "expected message 2, got 99"
            with contextlib.suppress(tw.PeerLostError):  # the cut may be seen at once
                peer.channel.notify(raw)
            with pytest.raises(tw.PeerLostError, match=why):
                rx.wait("t", timeout=10)
            # the receiver's own account of the end follows the data plane's notice of it
            with pytest.raises(tw.PeerLostError, match=f"ended this sender's session.*says.*{why}"):
                for _ in range(200):  # bounded: the end of the session arrives within a few
                    tx.write("t", np.zeros(4, np.float32), timeout=1)
        with tw.Sender.connect(rx.address, transport="nixl", timeout=5) as tx:
            tx.write("other", np.arange(8, dtype=np.float32))
            assert rx.wait("other", timeout=5)[7] == 7


@pytest.mark.nixl
def test_a_batch_of_small_tensors_shares_notifications_and_lands_in_order() -> None:
    """write_many stages small payloads, posts their WRITEs together and sends their headers
    in one notification (at most MAX_NOTIFICATION_HEADERS each); a large payload goes on its
    own, after what was posted before it. Every message lands byte-exact, in order."""
    names = [f"s{k}" for k in range(40)]
    with tw.Receiver(ring=2) as rx:
        for name in names:
            rx.register(name, (16,), "int32")
        rx.register("big", (1 << 15,), "float32")  # 128 KiB: above copy_below, registered
        with tw.Sender.connect(rx.address, transport="nixl", timeout=10) as tx:
            channel = _peer(tx, rx.address).channel
            sent = channel.counter
            tx.write_many([(name, np.full(16, k, np.int32)) for k, name in enumerate(names)])
            assert channel.counter - sent == 2  # 32 headers, then 8
            got = rx.wait_all(names, timeout=10)
            assert all(np.array_equal(got[n], np.full(16, k)) for k, n in enumerate(names))
            rx.release_many(names)
            a, b, c, d = (np.full(16, 100 + k, np.int32) for k in range(4))
            big = np.arange(1 << 15, dtype=np.float32)
            sent = channel.counter
            tx.write_many([("s0", a), ("s1", b), ("big", big), ("s2", c), ("s0", d)])
            assert channel.counter - sent == 3  # s0 s1 | big | s2 s0 (its second slot)
            for name, want in (("s0", a), ("s0", d), ("s1", b), ("big", big), ("s2", c)):
                assert np.array_equal(rx.wait(name, timeout=10), want), name
            rx.release_many(["s0", "s0", "s1", "big", "s2"])


#: float32 elements of the large tensor below: 128 KiB, above copy_below, so written from the
#: caller's array (registered), where "small" is staged
LARGE = 1 << 15


@contextlib.contextmanager
def _large_and_small(ring: int, large: str) -> Iterator[tuple[tw.Receiver, tw.Sender, Any]]:
    """A receiver of a large tensor named ``large`` and of "small" (16 float32), a nixl sender
    to it, and the sender's channel."""
    with tw.Receiver(ring=ring) as rx:
        rx.register(large, (LARGE,), "float32")
        rx.register("small", (16,), "float32")
        with tw.Sender.connect(rx.address, transport="nixl", timeout=10) as tx:
            yield rx, tx, _peer(tx, rx.address).channel


@pytest.mark.nixl
def test_sources_stay_registered_while_the_caller_holds_them() -> None:
    with _large_and_small(4, "t") as (rx, tx, channel):
        held = np.arange(LARGE, dtype=np.float32)
        for _ in range(3):
            tx.write("t", held)
            assert np.array_equal(rx.wait("t", timeout=5), held)
            rx.release("t")
        assert len(channel._sources) == 1  # registered once, reused
        for k in range(5):  # a fresh array each time, dropped by the caller at once
            tx.write("t", np.full(LARGE, k, np.float32))
            assert rx.wait("t", timeout=5)[0] == k
            rx.release("t")
        # the dropped ones are deregistered as new ones come; the held one stays
        assert len(channel._sources) <= 2
        assert any(
            src.array is not None and np.shares_memory(src.array, held)
            for src in channel._sources.values()
        )
        before = set(channel._sources)
        for k in range(5):  # small payloads are copied into the registered staging buffer
            tx.write("small", np.full(16, k, np.float32))
            assert rx.wait("small", timeout=5)[15] == k
            rx.release("small")
        assert set(channel._sources) == before  # not among the callers' arrays
        assert len(channel._staging) == 1  # the staging buffer, once


@pytest.mark.nixl
def test_a_writing_agent_made_anew_for_cuda_writes_on_where_the_old_one_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where GPU memory comes after a sender connected, its writing agent is made anew with a
    CUDA context current (UCX opens cuda_ipc only then: docs/rdma.md). What the swap itself
    must keep is checked here, on host memory, with ``hold_context`` answering as on a GPU host
    (this host has no CUDA; the GPU case is tests/test_gpu.py -k cuda_ipc): every tensor's
    messages go on landing byte-exact in sequence, staged and registered ones alike, the
    staging buffers are registered with the new agent in place (writers hold them), the
    cache of callers' arrays starts afresh, and it happens once."""
    from tensorwire.transports import nixl as nixl_transport

    with _large_and_small(2, "big") as (rx, tx, channel):
        held = np.arange(LARGE, dtype=np.float32)

        def round_trip(k: int) -> None:
            tx.write("big", held + k)
            tx.write("small", np.full(16, k, np.float32))
            assert np.array_equal(rx.wait("big", timeout=5), held + k), k
            assert np.array_equal(rx.wait("small", timeout=5), np.full(16, k)), k
            rx.release_many(["big", "small"])

        for k in range(3):
            round_trip(k)
        old, staged = channel._agent, list(channel._staging)
        assert not channel._cuda_ready and channel._sources and staged
        monkeypatch.setattr(nixl_transport, "hold_context", lambda: True)
        channel._need_cuda()
        assert channel._agent is not old and channel._cuda_ready
        assert channel._staging == staged and not channel._sources
        del old
        for k in range(3, 8):
            round_trip(k)
        swapped = channel._agent
        channel._need_cuda()  # once only
        assert channel._agent is swapped and len(channel._staging) == len(staged)


@pytest.mark.nixl
def test_more_tensors_than_registered_sources_register_each_staging_buffer_once() -> None:
    """A step writes many small tensors in turn: each one's staging buffer stays registered
    (the cache of callers' arrays is smaller than the step), and a prefix of it of any length
    goes out byte-exact."""
    names = [f"t{k}" for k in range(6)]
    options = NixlOptions(registered_sources=2)
    with tw.Receiver(ring=2) as rx:
        for name in names:
            rx.register(name, (None,), "int32", max_bytes=64 * 4)
        with tw.Sender.connect(rx.address, transport="nixl", timeout=10, nixl=options) as tx:
            channel = _peer(tx, rx.address).channel
            for length in (64, 3, 64, 17, 1):
                items = [
                    (name, np.arange(length, dtype=np.int32) + k) for k, name in enumerate(names)
                ]
                tx.write_many(items)
                got = rx.wait_all(names, timeout=5)
                for k, name in enumerate(names):
                    assert np.array_equal(got[name], np.arange(length, dtype=np.int32) + k)
                rx.release_many(names)
            assert len(channel._staging) == len(names)
            assert not channel._sources  # nothing of the caller's was registered


@pytest.mark.nixl
def test_options_are_checked_and_applied_only_while_creating_an_agent() -> None:
    with pytest.raises(ValueError, match="UCX_"):
        NixlOptions(env={"PATH": "/tmp"})
    with pytest.raises(ValueError, match="registered_sources"):
        NixlOptions(registered_sources=0)
    with pytest.raises(ValueError, match="copy_below must be a whole number of at least 0"):
        NixlOptions(copy_below=1.5)  # int() would have taken it for 1 byte
    opts = NixlOptions(tls="cma,tcp", env={"UCX_RNDV_THRESH": "8192"})
    env = opts.environment(loopback=True)
    # on a GPU host the list gets the CUDA transport NIXL insists on (the test below)
    expected_tls = "cma,tcp,cuda_copy" if cuda_devices_present() else "cma,tcp"
    assert env["UCX_TLS"] == expected_tls
    assert env["UCX_RNDV_THRESH"] == "8192"
    assert env.get("UCX_NET_DEVICES", "lo") == "lo"  # loopback stays on lo unless told otherwise
    assert "UCX_NET_DEVICES" not in NixlOptions().environment(loopback=False)
    assert NixlOptions(net_devices="mlx5_0:1").environment(True)["UCX_NET_DEVICES"] == "mlx5_0:1"
    before = os.environ.get("UCX_TLS")
    with tw.Receiver(nixl=opts) as rx:
        rx.register("t", (4,), "float32")
        with tw.Sender.connect(rx.address, transport="nixl", timeout=10, nixl=opts) as tx:
            tx.write("t", np.ones(4, np.float32))
            assert rx.wait("t", timeout=10)[0] == 1
    assert os.environ.get("UCX_TLS") == before


def test_the_suite_runs_without_nixl() -> None:
    """NIXL is optional: where it cannot be imported, the suite is collected and the nixl tests
    are skipped with the reason, while the other transports' tests still run."""
    out = run_conformance_hiding(NIXL_PACKAGES, "every_dtype_byte_exact and (nixl or tcp)")
    assert "1 passed, 1 skipped" in out, out
    assert "NIXL is not installed" in out


def test_an_explicit_tls_list_gets_a_cuda_transport_on_a_gpu_host() -> None:
    """NIXL refuses a UCX_TLS without a CUDA transport where GPUs are present (seen on an H100
    host); the list is completed there and left alone elsewhere. (Which case applies here is
    decided by whether the driver lists a GPU; both are computed explicitly below.)"""
    from tensorwire.rdma import with_cuda_transport

    assert NixlOptions(tls="cma,tcp").environment(True, gpus=True)["UCX_TLS"] == "cma,tcp,cuda_copy"
    assert NixlOptions(tls="cma,tcp").environment(True, gpus=False)["UCX_TLS"] == "cma,tcp"
    assert NixlOptions(env={"UCX_TLS": "rc"}).environment(False, gpus=True)["UCX_TLS"] == (
        "rc,cuda_copy"
    )
    for kept in ("rc,cuda_copy", "tcp,cuda_ipc", "^ud", "all"):
        assert with_cuda_transport(kept) == kept
    assert "UCX_TLS" not in NixlOptions().environment(True, gpus=True)  # UCX's own choice


@pytest.mark.nixl
def test_credits_to_a_killed_sender_leave_one_error_line_not_one_per_release(
    children: Children, tmp_path: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """A sender SIGKILLed with the receiver's ring full of its messages: the consumer then
    takes and releases each one, and each release's credit goes to an agent that is gone.
    NIXL logs every failed notification on stderr (``genNotif ... NIXL_ERR_REMOTE_DISCONNECT``,
    17 lines for a ring of 16 before); the receiver stops notifying an agent once NIXL said it
    is disconnected, so an operator's log says it once."""
    from .peers import write_numbered

    depth = 16
    with tw.Receiver(nixl=True) as rx:
        rx.register("t", (64,), "int64", ring=depth)
        count = tmp_path / "acked"
        count.write_bytes(bytes(8))
        proc = children.start(write_numbered, rx.address, "nixl", "t", 0, str(count), 60.0)
        deadline = time.monotonic() + 30
        while int(np.fromfile(count, np.int64)[0]) < depth:  # the ring is full (bounded)
            assert time.monotonic() < deadline and proc.is_alive(), "the sender never filled it"
            time.sleep(0.01)
        time.sleep(0.2)  # it waits for a credit now
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        capfd.readouterr()
        taken = 0
        with contextlib.suppress(tw.PeerLostError):
            for _ in range(depth + 1):  # its messages, then the loss (bounded)
                view = rx.wait("t", timeout=10)
                assert int(view[0]) == taken
                taken += 1
                rx.release("t")
        time.sleep(0.5)  # the credits' sends (the polling thread's too)
        failures = [ln for ln in capfd.readouterr().err.splitlines() if "genNotif" in ln]
    assert taken == depth
    assert len(failures) <= 1, failures


@pytest.mark.nixl
def test_a_receiver_closed_as_it_answers_the_attach_is_a_lost_peer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A receiver that closes just after it answered a sender's attach takes its NIXL agent
    with it: loading the metadata it sent fails (UCX finds nobody at the agent's address). A
    parameter server ending its job does so, and opens another receiver at its endpoint to say
    that the job is done (--linger): a worker rejoining it then exited 1, "cannot load the NIXL
    metadata" (`bench chaos --steps`, nixl, seed 4535), where a lost peer is reached anew.
    The receiver is closed at that very moment here, from the sender's own request."""
    from tensorwire import sender as sender_module

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    rx = tw.Receiver(bind=endpoint)
    rx.register("t", (4,), "float32")
    successor: list[tw.Receiver] = []
    request = sender_module._Peer._request

    def closing_as_it_answers(peer: Any, msg: wire.Message, timeout: float | None) -> Any:
        reply = request(peer, msg, timeout)
        if isinstance(msg, wire.Attach) and not successor:
            rx.close()
            successor.append(tw.Receiver(bind=endpoint))  # as a lingering server's
        return reply

    monkeypatch.setattr(sender_module._Peer, "_request", closing_as_it_answers)
    try:
        with pytest.raises(tw.PeerLostError, match="gone"):
            tw.Sender.connect(endpoint, transport="nixl", timeout=20)
    finally:
        rx.close()
        for other in successor:
            other.close()
    assert successor, "the sender never attached"
