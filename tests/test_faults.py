"""Faults injected for real: killed senders and receivers, garbage on live ports, wrong secrets,
restarted receivers."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

import tensorwire as tw
from tensorwire import wire
from tensorwire.bench.soak import WRITE_IS_DELIVERY

from .conftest import (
    Children,
    free_port,
    freeze,
    needs_pid_namespaces,
    peer_count,
    shm_entries,
)
from .peers import (
    ask_across_own_stop,
    die_mid_write,
    receiver_lost_in_set_up,
    run_receiver,
    send_plan,
    write_after_own_stop,
    write_numbered,
)

BIG = (4096, 4096)  # 64 MiB of float32
BIND = "tcp://127.0.0.1:0"  # a receiver of its own, on loopback


def _healthy(rx: tw.Receiver, transport: str, name: str = "other") -> None:
    """The receiver still serves a fresh sender end to end."""
    with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
        tx.write(name, np.arange(8, dtype=np.float32))
    assert np.array_equal(rx.wait(name, timeout=10), np.arange(8, dtype=np.float32))
    rx.release(name)


def test_sender_killed_mid_write_is_never_complete(transport: str, children: Children) -> None:
    with tw.Receiver() as rx:
        rx.register("big", BIG, "float32")
        rx.register("other", (8,), "float32")
        here, there = children.pipe()
        proc = children.start(die_mid_write, rx.address, transport, "big", there)
        assert here.poll(60) and here.recv() == "half"
        proc.join(30)
        assert proc.exitcode == -signal.SIGKILL
        # Never handed out as complete: the loss is reported (or the wait times out).
        with pytest.raises((tw.PeerLostError, tw.WireTimeoutError)):
            rx.wait("big", timeout=5)
        with pytest.raises(tw.WireTimeoutError):
            rx.wait("big", timeout=0.2)
        _healthy(rx, transport)
        # Another sender may take the tensor over; its message lands whole.
        proc = children.start(send_plan, rx.address, transport, [("big", "float32", BIG, 5)])
        got = rx.wait("big", timeout=60)
        from .peers import make_array

        assert np.array_equal(got, make_array("float32", BIG, 5))
        children.join_ok(proc)


def test_receiver_killed_sender_gets_peer_lost(transport: str, children: Children) -> None:
    here, there = children.pipe()
    proc = children.start(run_receiver, there, [("t", (1024,), "float32")])
    assert here.poll(30)
    info = here.recv()
    with tw.Sender.connect(info["address"], transport=transport, timeout=5) as tx:
        tx.write("t", np.zeros(1024, np.float32))
        here.send(("t", 10))
        assert here.recv()[0] == "ok"
        assert tx.lost() is None
        proc.kill()
        proc.join(10)
        # Sender.lost() looks at the receiver's process on this host, without waiting
        assert f"(pid {proc.pid}) died" in (tx.lost() or "")
        start = time.monotonic()
        with pytest.raises(tw.PeerLostError):
            for _ in range(100):  # bounded: the loss must show within a few writes
                tx.write("t", np.zeros(1024, np.float32))
        assert time.monotonic() - start < 5.0  # within the sender's timeout
    # the killed receiver's segments are reaped by the next receiver on this host
    with tw.Receiver():
        assert not set(info["regions"]) & set(os.listdir("/dev/shm"))


def test_a_request_a_stopped_receiver_left_unanswered_does_not_end_the_session(
    transport: str, children: Children
) -> None:
    """A write whose control request (here a claim) times out, the receiver being stopped
    (SIGSTOP), closes the sender's control socket, so that a late reply cannot pass for the
    next request's; the next request opens a new socket, which the receiver took for a
    stranger's: "say hello (and authenticate) first", raised as AuthenticationError (a wrong
    secret). That ended a parameter server in a chaos run (shm, asp, 3 x 3, seed 111: an owed
    offer's 50 ms claim met a worker just thawed). The session now goes on over the new socket
    (it resumes by its token): the writes go on, claims and all."""
    here, there = children.pipe()
    specs = [("a", (4,), "float32"), ("b", (4,), "float32")]
    proc = children.start(run_receiver, there, specs, "s3cret")
    assert here.poll(30)
    address = here.recv()["address"]
    with tw.Sender.connect(address, transport=transport, timeout=10, secret="s3cret") as tx:
        tx.write("a", np.full(4, 1, np.float32))
        freeze(proc.pid)
        try:
            with pytest.raises(tw.WireTimeoutError):
                tx.write("b", np.full(4, 2, np.float32), timeout=0.3)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        tx.write("b", np.full(4, 2, np.float32))
        tx.write("a", np.full(4, 3, np.float32))
        for name, total in (("a", 4.0), ("b", 8.0), ("a", 12.0)):
            here.send((name, 10))
            assert here.recv() == ("ok", total), name
    here.send("stop")
    children.join_ok(proc)


def _cut_connections_to(port: int) -> int:
    """Reset every TCP connection to loopback ``port`` as a firewall or a dying NAT entry would
    (``ss -K``: root, and a kernel with socket destruction); how many were cut."""
    out = subprocess.run(
        ["ss", "-K", "-t", "-n", "dst", "127.0.0.1", "dport", "=", str(port)],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    if out.returncode != 0:
        pytest.skip(f"ss -K cannot cut connections here: {out.stderr.strip()}")
    return sum(1 for line in out.stdout.splitlines() if line.startswith("ESTAB"))


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs iproute2's ss")
def test_a_control_connection_cut_and_made_again_by_zeromq_keeps_the_session(
    transport: str,
) -> None:
    """The control connection cut under a sender (a TCP reset): ZeroMQ connects the socket
    again by itself, and the receiver's ROUTER knows it under a new identity, not as the
    session's. The next claim was refused "say hello (and authenticate) first", raised as
    AuthenticationError (a wrong secret): a worker of a parameter-server job exited 1 so at its
    first claim in a `make test` run (test_ps -k "sixteen_bit[bfloat16-shm]"; reproduced with
    this cut). The session now moves to the new connection by its token, and the claim and
    every write after it go through."""
    with tw.Receiver(bind="tcp://127.0.0.1:0", secret="s3cret") as rx:
        rx.register_many([("a", (4,), "float32"), ("b", (4,), "float32")])
        port = int(rx.address.rsplit(":", 1)[1])
        with tw.Sender.connect(
            rx.address, transport=transport, timeout=10, secret="s3cret", heartbeat=None
        ) as tx:
            tx.write("a", np.full(4, 1, np.float32))
            assert rx.wait("a", timeout=10).tolist() == [1] * 4
            rx.release("a")
            assert _cut_connections_to(port) >= 1
            time.sleep(0.3)  # ZeroMQ connects again within its reconnect interval (0.1 s)
            tx.write("b", np.full(4, 2, np.float32))  # its first claim
            tx.write("a", np.full(4, 3, np.float32))
            assert rx.wait("b", timeout=10).tolist() == [2] * 4
            assert rx.wait("a", timeout=10).tolist() == [3] * 4
            rx.release_many(["a", "b"])


def test_a_receiver_s_own_stop_is_no_sender_s_silence(children: Children) -> None:
    """A receiver stopped (SIGSTOP) for longer than its heartbeat timeout heard no sender
    meanwhile; once it runs again, it dropped every sender as silent at its first look, before
    the heartbeats that came in while it was stopped were read (a chaos run: a worker frozen
    for 2.4 s dropped two of its servers, "silent for 3.0 s", and they had to join it again).
    The time the receiver itself did not run is no longer counted as its senders' silence.
    (The receiver's sessions are the same whatever the transport: tcp here.)"""
    transport = "tcp"
    here, there = children.pipe()
    options = {"heartbeat_timeout": 1.0}
    proc = children.start(run_receiver, there, [("t", (4,), "float32")], None, BIND, options)
    assert here.poll(30)
    address = here.recv()["address"]
    # the sender's own verdict on a silent receiver comes after 3 of its 5 s intervals
    with tw.Sender.connect(address, transport=transport, timeout=10, heartbeat=5.0) as tx:
        tx.write("t", np.full(4, 1, np.float32))
        here.send(("t", 10))
        assert here.recv() == ("ok", 4.0)
        freeze(proc.pid)
        try:
            time.sleep(2.0)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.5)  # its first looks at the sessions, and the heartbeats since
        tx.write("t", np.full(4, 2, np.float32))
        here.send(("t", 10))
        assert here.recv() == ("ok", 8.0)
        assert tx.lost() is None
    here.send("stop")
    children.join_ok(proc)


def test_a_sender_s_own_stop_is_no_receiver_s_silence(children: Children) -> None:
    """The sender's twin of the test above. A sender stopped (SIGSTOP) past the deadline of a
    control request took it for unanswered at once when it ran again, though the reply may have
    come meanwhile (its own I/O thread had not yet read it: 1 in 8 tries of a probe); so did the
    heartbeat in flight, and a receiver that had missed one before the stop was lost. Now a
    request gives its receiver the time it had left again. Here the receiver is frozen first
    and runs again just after the sender (0.2 s): before, the request timed out at once."""
    here, there = children.pipe()
    receiver = children.start(run_receiver, there, [("t", (4,), "float32")])
    assert here.poll(30)
    address = here.recv()["address"]
    ask, asked = children.pipe()
    sender = children.start(ask_across_own_stop, address, asked)
    assert ask.poll(30) and ask.recv() == "ready"
    freeze(receiver.pid)
    try:
        ask.send("go")  # the request waits for the frozen receiver (3 s)
        time.sleep(1.1)  # at least one heartbeat missed (0.5 s each), not yet the verdict (1.5 s)
        freeze(sender.pid)
        try:
            time.sleep(2.0)  # past the request's deadline and the heartbeats' verdict
        finally:
            os.kill(sender.pid, signal.SIGCONT)
        time.sleep(0.2)
    finally:
        os.kill(receiver.pid, signal.SIGCONT)
    assert ask.poll(30)
    assert ask.recv() == "ok"  # answered once the receiver ran, not a timeout
    ask.send("write")
    assert ask.poll(30)
    assert ask.recv() == (None, "ok")
    children.join_ok(sender)
    here.send(("t", 10))
    assert here.recv() == ("ok", 4.0)
    here.send(("t", 10))
    assert here.recv() == ("ok", 8.0)
    here.send("stop")
    children.join_ok(receiver)


def test_closing_a_sender_whose_receiver_was_killed_is_quick(
    transport: str, children: Children
) -> None:
    """No goodbye waits for a receiver known dead (its pidfd, on this host): closing took 10 s
    over `nixl` before (two goodbyes of 5 s, data plane and control plane, each waited out)."""
    here, there = children.pipe()
    proc = children.start(run_receiver, there, [("t", (16,), "float32")])
    assert here.poll(30)
    tx = tw.Sender.connect(here.recv()["address"], transport=transport, timeout=30)
    try:
        tx.write("t", np.zeros(16, np.float32))
        proc.kill()
        proc.join(10)
    finally:
        start = time.monotonic()
        tx.close()
    assert time.monotonic() - start < 2.0


def test_closing_a_sender_of_several_frozen_receivers_takes_one_goodbye(
    children: Children,
) -> None:
    """Three receivers frozen (SIGSTOP): their goodbyes go out at once, so closing the sender
    takes one GOODBYE_TIMEOUT (5 s), not one for each (15.0 s measured before)."""
    from tensorwire.sender import GOODBYE_TIMEOUT

    pipes, procs = [], []
    for k in range(3):
        here, there = children.pipe()
        procs.append(children.start(run_receiver, there, [(f"t{k}", (4,), "float32")]))
        pipes.append(here)
    tx = tw.Sender(transport="tcp", timeout=30)
    try:
        for k, here in enumerate(pipes):
            assert here.poll(30)
            tx.add_peer(here.recv()["address"])
            tx.write(f"t{k}", np.zeros(4, np.float32))
        for proc in procs:
            freeze(proc.pid)
        # one removed without a goodbye (a caller that knows it frozen): at once
        first = tx.peers[0]
        start = time.monotonic()
        tx.remove_peer(first, goodbye=False)
        assert time.monotonic() - start < 1.0 and first not in tx.peers
    finally:
        start = time.monotonic()
        tx.close()
    assert time.monotonic() - start < GOODBYE_TIMEOUT + 2
    for proc in procs:
        os.kill(proc.pid, signal.SIGKILL)


def test_a_session_left_without_a_goodbye_ends_when_its_sender_connects_again(
    transport: str,
) -> None:
    """``remove_peer(goodbye=False)``, then ``add_peer`` of the same receiver: the new session
    ends the old one first (resumed by its token, then said goodbye to), and writes the
    tensor the old one held at once, the receiver's heartbeat timeout 30 s. Before, over
    `shm` (whose data plane the receiver does not see end) and where the receiver had not
    yet seen the data plane's end, the new session's claim was refused until that timeout,
    "already written by" this very sender. Where the receiver does see it end (a closed
    connection), its consumer is told once that the writer was lost, as before; over `shm`
    the old session now ends cleanly, and nothing is told."""
    losses = 0

    def take(rx: tw.Receiver) -> list[int]:
        nonlocal losses
        for _ in range(2):
            try:
                got = rx.wait("t", timeout=5).tolist()
            except tw.PeerLostError:  # the session before, lost at its data plane's end
                losses += 1
                continue
            rx.release("t")
            return [int(x) for x in got]
        raise AssertionError("no message after the loss")

    with tw.Receiver(heartbeat_timeout=30) as rx:
        rx.register("t", (4,), "int32")
        with tw.Sender(transport=transport, timeout=10) as tx:
            for k in range(3):
                tx.add_peer(rx.address)
                tx.write("t", np.full(4, k, np.int32), timeout=5)
                assert take(rx) == [k] * 4
                tx.remove_peer(rx.address, goodbye=False)
            tx.add_peer(rx.address)
            tx.write("t", np.full(4, 9, np.int32), timeout=5)
            assert take(rx) == [9] * 4
            assert peer_count(rx) == 1  # (the sessions left were ended, not kept to time out)
    if transport == "shm":
        assert losses == 0


def test_a_receiver_frozen_past_the_senders_verdict_is_written_to_again_at_once(
    transport: str, children: Children
) -> None:
    """A receiver frozen (SIGSTOP) for 2 s, past its sender's heartbeat verdict (0.6 s) but
    not its own heartbeat timeout (30 s), then running again: a write with
    ``reconnect=True`` connects anew, ends the session lost first, and lands. Before, over
    `shm` (whose data plane the receiver does not see end), the new session's claim was
    refused until the receiver dropped the old one, "already written by" this very sender."""
    here, there = children.pipe()
    proc = children.start(
        run_receiver, there, [("t", (4,), "int32")], None, BIND, {"heartbeat_timeout": 30}
    )
    assert here.poll(30)
    address = here.recv()["address"]
    with tw.Sender.connect(
        address, transport=transport, timeout=10, heartbeat=0.2, reconnect=True
    ) as tx:
        tx.write("t", np.zeros(4, np.int32))
        here.send(("t", 10))
        assert here.recv() == ("ok", 0.0)
        freeze(proc.pid)
        try:
            deadline = time.monotonic() + 10
            while tx.lost() is None:  # (the heartbeats' verdict: 0.6 s)
                assert time.monotonic() < deadline, "no verdict on the frozen receiver"
                time.sleep(0.05)
            time.sleep(1.0)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        tx.write("t", np.ones(4, np.int32), timeout=10)
        for _ in range(2):  # (the consumer may be told first of the session lost)
            here.send(("t", 10))
            answer = here.recv()
            if answer != ("error", "PeerLostError"):
                break
        assert answer == ("ok", 4.0), answer
    here.send("stop")
    children.join_ok(proc)


def test_a_goodbye_not_waited_for_reaches_a_frozen_receiver_when_it_runs_again(
    children: Children, transport: str
) -> None:
    """``remove_peer(wait=False)`` returns at once where a frozen (SIGSTOP) receiver makes a
    goodbye wait GOODBYE_TIMEOUT (5 s): a parameter server dropping a frozen worker held every
    other worker's step that long. The goodbye reaches the receiver when it runs again and ends
    the session cleanly, so the same sender's next session writes the tensor the old one held
    at once; a session ended as a loss (``goodbye=False``) keeps it claimed until the
    receiver's heartbeat timeout (30 s). Over the gRPC baselines the data plane's Close, given
    0.5 s, times out on the frozen receiver: the control plane's goodbye follows, as over the
    other transports. Before, the goodbye ended there, and the new session's claim was refused
    (a chaos run: grpc-stream, ssp, seed 184, a server exited 1 on "refused claim")."""
    from tensorwire.sender import GOODBYE_TIMEOUT

    here, there = children.pipe()
    proc = children.start(run_receiver, there, [("t", (4,), "float32")])
    assert here.poll(30)
    address = here.recv()["address"]
    tx = tw.Sender(transport=transport, timeout=30)
    try:
        tx.add_peer(address)
        tx.write("t", np.ones(4, np.float32))
        here.send(("t", 10))
        assert here.recv() == ("ok", 4.0)
        freeze(proc.pid)
        try:
            start = time.monotonic()
            tx.remove_peer(address, wait=False)
            assert time.monotonic() - start < 1.0 and address not in tx.peers
            time.sleep(0.5)  # the goodbye waits for the frozen receiver meanwhile
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        start = time.monotonic()
        tx.add_peer(address)  # a new session, once the old one's goodbye was answered
        assert time.monotonic() - start < GOODBYE_TIMEOUT
        tx.write("t", np.full(4, 2.0, np.float32), timeout=2)  # claimed: not held by the old
        here.send(("t", 10))
        assert here.recv() == ("ok", 8.0)
    finally:
        tx.close()


def test_garbage_on_control_port_keeps_serving(transport: str) -> None:
    with tw.Receiver() as rx:
        rx.register("other", (8,), "float32")
        host, port = rx.address.rsplit("/", 1)[1].split(":")
        for blob in (b"\x00" * 64, os.urandom(4096), b"GET / HTTP/1.1\r\n\r\n"):
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(blob)
                time.sleep(0.05)
        ctx = zmq.Context()
        try:
            dealer = ctx.socket(zmq.DEALER)
            dealer.linger = 0
            dealer.connect(rx.address)
            for frame in (
                b"\xc1garbage",
                msgpack.packb({"v": 1, "t": "claim"}),
                msgpack.packb({"v": 1, "t": "lookup", "generation": 1}),
            ):
                dealer.send(frame)
                assert dealer.poll(5000)
                reply = msgpack.unpackb(dealer.recv())
                assert reply["t"] == "error"
            dealer.send_multipart([b"a", b"b", b"c"])  # wrong frame count: dropped silently
            dealer.close()
        finally:
            ctx.term()
        _healthy(rx, transport)


def test_garbage_from_many_peers_leaves_a_bounded_log(caplog: pytest.LogCaptureFixture) -> None:
    """Fifty peers each sending a malformed control message: each is refused (an error reply),
    the log shows the first few in full and then one line with the count of the rest, and the
    metrics count every one."""
    import logging

    from tensorwire import control, metrics
    from tensorwire.quietlog import BURST

    def counted() -> tuple[float, float]:
        return (
            metrics.counter("tensorwire_bad_input_total", "malformed_control_messages"),
            metrics.counter("tensorwire_control_errors_total", "protocol"),
        )

    before = counted()
    peers = 50
    control.quiet.flush()  # earlier tests' windows: start this one afresh
    caplog.clear()
    with tw.Receiver() as rx:
        rx.register("other", (8,), "float32")
        ctx = zmq.Context()
        try:
            with caplog.at_level(logging.WARNING, logger="tensorwire"):
                for _ in range(peers):
                    dealer = ctx.socket(zmq.DEALER)
                    dealer.linger = 0
                    dealer.connect(rx.address)
                    dealer.send(b"\xc1" + os.urandom(64))
                    assert dealer.poll(5000)
                    assert msgpack.unpackb(dealer.recv())["t"] == "error"
                    dealer.close()
                control.quiet.flush()
        finally:
            ctx.term()
        _healthy(rx, "tcp")
    lines = [r.getMessage() for r in caplog.records if r.name == "tensorwire.control"]
    shown = [m for m in lines if m.startswith("refusing a malformed control message")]
    counts = [m for m in lines if m.startswith("malformed control messages: ")]
    assert len(shown) == BURST and len(lines) == BURST + 1, lines
    assert counts == [counts[0]] and f": {peers - BURST} more in the last" in counts[0], counts
    after = counted()
    assert (after[0] - before[0], after[1] - before[1]) == (peers, peers)


def test_a_quiet_log_reports_each_period() -> None:
    """The rate limit itself, on a clock the test moves: a burst per period, then a count."""
    import logging

    from tensorwire.quietlog import QuietLog

    now = [0.0]
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("tensorwire.test-quietlog")
    logger.addHandler(Keep())
    logger.propagate = False
    quiet = QuietLog(logger, burst=2, period=10.0, clock=lambda: now[0])
    for i in range(5):
        quiet.warning("bad", "bad input %d", i)
    quiet.warning("other", "other input")
    now[0] = 11.0
    quiet.warning("bad", "bad input again")
    for i in range(3):
        quiet.warning("bad", "bad input %d", i)
    quiet.report_due()  # the new period is not over: nothing yet
    now[0] = 21.5
    quiet.report_due()  # it is now, with no warning to trigger it (the control tick calls this)
    quiet.flush()
    assert records == [
        "bad input 0",
        "bad input 1",
        "other input",
        "bad: 3 more in the last 11 s, not logged one by one",
        "bad input again",
        "bad input 0",
        "bad: 2 more in the last 10 s, not logged one by one",
    ]


def test_garbage_on_data_port_keeps_serving(transport: str) -> None:
    with tw.Receiver(grpc=True) as rx:  # (its gRPC server now, not at its first gRPC sender)
        rx.register("other", (8,), "float32")
        rx.register("t", (8,), "float32")
        ports = [rx._servers["tcp"].port, rx._servers["grpc"].port]  # as published in the welcome
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
            tx.write("t", np.ones(8, np.float32))
            for port in ports:
                for blob in (os.urandom(48), b"TWDH" + os.urandom(44), b"x" * 10):
                    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                        s.sendall(blob)
                        s.shutdown(socket.SHUT_WR)
                        s.settimeout(5)
                        while s.recv(4096):  # refused: the receiver ends the connection
                            pass
            assert np.array_equal(rx.wait("t", timeout=5), np.ones(8, np.float32))
            rx.release("t")
            tx.write("t", np.full(8, 2, np.float32))  # the real sender is unaffected
            assert rx.wait("t", timeout=5)[0] == 2
        _healthy(rx, transport)


def test_wrong_secret_is_refused_and_nothing_written(transport: str) -> None:
    with tw.Receiver(secret="right") as rx:
        rx.register("t", (4,), "int32")
        with pytest.raises(tw.AuthenticationError, match="wrong secret"):
            tw.Sender.connect(rx.address, transport=transport, secret="wrong", timeout=5)
        with pytest.raises(tw.AuthenticationError, match="requires a shared secret"):
            tw.Sender.connect(rx.address, transport=transport, timeout=5)
        with pytest.raises(tw.TensorWireError, match="not a CURVE public key"):
            tw.Sender.connect(rx.address, timeout=0.5, curve_server_key=b"garbage")
        assert rx.pending("t") == 0
        with pytest.raises(tw.WireTimeoutError):
            rx.wait("t", timeout=0.1)
        with tw.Sender.connect(rx.address, transport=transport, secret="right", timeout=5) as tx:
            tx.write("t", np.arange(4, dtype=np.int32))
        assert rx.wait("t", timeout=5).tolist() == [0, 1, 2, 3]


def test_secret_given_to_an_open_receiver_is_refused() -> None:
    with tw.Receiver() as rx, pytest.raises(tw.AuthenticationError, match="does not use a secret"):
        tw.Sender.connect(rx.address, secret="s", timeout=5)


def test_restarted_receiver_has_new_generation(transport: str) -> None:
    bind = f"tcp://127.0.0.1:{free_port()}"
    rx = tw.Receiver(bind, info={"incarnation": 1})
    rx.register("t", (4,), "int32")
    first = rx.generation
    with (
        tw.Sender.connect(bind, transport=transport, timeout=5) as tx,
        tw.Sender.connect(bind, transport=transport, timeout=5, reconnect=True) as tx2,
    ):
        rx.register("u", (4,), "int32")
        tx.write("t", np.arange(4, dtype=np.int32))
        tx2.write("u", np.arange(4, dtype=np.int32))
        assert tx2.receiver_info() == {"incarnation": 1}
        rx.close()
        with tw.Receiver(bind, info={"incarnation": 2}) as rx_new:
            assert rx_new.generation != first
            rx_new.register("t", (4,), "int32")
            rx_new.register("u", (4,), "int32")
            with pytest.raises(tw.PeerLostError):
                tx.write("t", np.arange(4, dtype=np.int32))
            assert rx_new.pending("t") == 0
            tx2.write("u", np.arange(4, dtype=np.int32) + 10)  # re-resolves transparently
            assert rx_new.wait("u", timeout=5).tolist() == [10, 11, 12, 13]
            assert tx2.receiver_info() == {"incarnation": 2}  # read anew at the reconnect


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def _until_refused(address: str) -> None:
    """Until a connection to ``address`` (tcp://HOST:PORT) is refused: ZeroMQ lets go of a
    closed socket's port on its I/O thread, after the close returned (a fresh clone's suite met
    a write's reconnect whose handshake the closing socket cut: "closed the connection during
    the ZeroMQ handshake", where nothing listened a moment later)."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as probe:
            if probe.connect_ex((host, int(port))) != 0:
                return
        assert time.monotonic() < deadline, f"{address} still accepts connections"
        time.sleep(0.01)


def test_writes_after_a_failed_reconnect_try_again_and_say_why(transport: str) -> None:
    """A receiver gone for good before its restart: a sender with ``reconnect=True`` fails to
    connect anew at a write; its next writes try again, each within its bound, and say why
    (before, every later write raised a bare AssertionError, the peer left without a
    session); lost() and ping() say so too; once a receiver runs at the address, a write
    connects and lands."""
    bind = f"tcp://127.0.0.1:{free_port()}"
    rx = tw.Receiver(bind)
    rx.register("t", (4,), "int32")
    with tw.Sender.connect(
        bind, transport=transport, timeout=1, reconnect=True, heartbeat=None
    ) as tx:
        tx.write("t", np.arange(4, dtype=np.int32))
        assert rx.wait("t", timeout=5).tolist() == [0, 1, 2, 3]
        rx.close()
        _until_refused(bind)
        for _ in range(2):  # the reconnect's failure, then a write that tries again
            # (its first request: the lost session's end, then the hello: 9c2a918)
            with pytest.raises(tw.WireTimeoutError, match="nothing accepted a connection there"):
                tx.write("t", np.arange(4, dtype=np.int32))
        why = tx.lost()
        assert why is not None and "connecting to it again failed" in why, why
        with pytest.raises(tw.PeerLostError, match="connecting to it again failed"):
            tx.ping()
        with tw.Receiver(bind) as rx_new:
            rx_new.register("t", (4,), "int32")
            tx.write("t", np.arange(4, dtype=np.int32) + 10)
            assert rx_new.wait("t", timeout=5).tolist() == [10, 11, 12, 13]
            assert tx.lost() is None


def test_a_sender_whose_receivers_are_gone_closes_without_waiting_out_a_goodbye(
    transport: str, children: Children
) -> None:
    """One receiver closed, another killed, before their sender closes: the close finds both
    gone and says no goodbye. Over gRPC it waited the control plane's whole GOODBYE_TIMEOUT
    (5.0 s measured), though its data plane's Close call was refused at once."""
    from tensorwire.sender import GOODBYE_TIMEOUT

    here, there = children.pipe()
    proc = children.start(run_receiver, there, [("k", (4,), "int32")])
    assert here.poll(30)
    killed = here.recv()["address"]
    rx = tw.Receiver(BIND)
    rx.register("c", (4,), "int32")
    tx = tw.Sender(transport=transport, timeout=30)
    try:
        tx.add_peer(rx.address)
        tx.add_peer(killed)
        tx.write("c", np.arange(4, dtype=np.int32))
        tx.write("k", np.arange(4, dtype=np.int32))
        assert rx.wait("c", timeout=10).tolist() == [0, 1, 2, 3]
    finally:
        rx.close()
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        start = time.monotonic()
        tx.close()
    assert time.monotonic() - start < GOODBYE_TIMEOUT / 2


_INTERRUPTED_WRITE = """
import os, signal, sys, threading, numpy as np, tensorwire as tw
# a shell that starts the suite in the background leaves SIGINT ignored: no KeyboardInterrupt
signal.signal(signal.SIGINT, signal.default_int_handler)
def take_until(rx, got, value):
    while not got or got[-1] != value:
        got.append(int(rx.wait("a", timeout=10)[0]))
        rx.release("a")


for _ in range(3):  # the interrupted write lands in some rounds, not in others
    got = []
    with tw.Receiver(ring=2) as rx:
        rx.register("a", (4,), "int64")
        with tw.Sender.connect(rx.address, transport=sys.argv[1], timeout=30, reconnect=True) as tx:
            tx.write("a", np.full(4, 0))
            tx.write("a", np.full(4, 5))
            try:  # (the timer inside: a SIGINT before the write still lands in this try)
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
                tx.write("a", np.full(4, 10))  # waits for a slot: the receiver holds both
                print("not interrupted")
            except KeyboardInterrupt:
                print("interrupted")
            take_until(rx, got, 5)  # frees both slots: one for the interrupted write, if it lands
            for k in (20, 30):
                tx.write("a", np.full(4, k), timeout=10)
                take_until(rx, got, k)
    print(*got)
"""


def test_a_write_interrupted_while_it_waits_leaves_the_sender_able_to_go_on(
    transport: str,
) -> None:
    """Ctrl-C (KeyboardInterrupt) while a write waits for the slot the receiver holds; the
    sender, with ``reconnect=True``, writes on. Every message after it lands, in order, and
    none twice; the interrupted one may have landed or not. Before, over ``grpc`` and
    ``grpc-stream`` the interrupted call went on in gRPC's threads and landed once the slot
    freed, and the next write reused its sequence number: the receiver dropped the session
    as a protocol error ("expected message 3, got 2"), which no reconnect acts on."""
    out = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_WRITE, transport],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 6, out.stdout
    for said, got in zip(lines[::2], lines[1::2], strict=True):
        assert said == "interrupted"
        assert got in ("0 5 20 30", "0 5 10 20 30"), out.stdout


def test_a_reconnect_is_not_ended_by_a_heartbeat_of_the_session_before(transport: str) -> None:
    """A sender heartbeating often (every 30 ms: it is lost after 90 ms unanswered, which a
    loaded machine reaches at 10 ms) reconnects to a receiver restarted at its address, eight
    times. Before, the heartbeat thread went on presenting the old session's token while the
    sender reconnected; the new receiver refused it ("unknown session token") and that
    verdict ended the new session's set-up, so the write after a restart raised PeerLostError
    with ``reconnect=True`` (found by CI, over nixl, whose set-up is longest; this test failed
    3 of 10 transport runs before the fix).

    Over nixl every 150 ms: its set-up (three NIXL agents made, a second or more) still meets
    several heartbeats, and NIXL's agent creation holds the GIL at stretches (63-69 ms idle),
    which under load left this one process, receiver and sender, answering no heartbeat for
    90 ms (3 runs of 3 beside ten busy loops failed so, "missed 3 heartbeats (0.1 s without an
    answer)"; docs/soak-clock-2026-12-02/)."""
    bind = f"tcp://127.0.0.1:{free_port()}"
    rx = tw.Receiver(bind)
    try:
        rx.register("t", (4,), "int32")
        every = 0.15 if transport == "nixl" else 0.03
        with tw.Sender.connect(
            bind, transport=transport, timeout=5, heartbeat=every, reconnect=True
        ) as tx:
            tx.write("t", np.arange(4, dtype=np.int32))
            assert rx.wait("t", timeout=5).tolist() == [0, 1, 2, 3]
            for k in range(1, 9):
                rx.close()
                rx = tw.Receiver(bind)
                rx.register("t", (4,), "int32")
                time.sleep(2 * every)  # the heartbeats find the old session gone
                tx.write("t", np.arange(4, dtype=np.int32) + 10 * k)
                assert rx.wait("t", timeout=5).tolist() == [10 * k + i for i in range(4)]
    finally:
        rx.close()


def test_a_request_of_a_restarted_receivers_sender_is_answered_stale_generation() -> None:
    """A receiver restarted at the same address knows none of its predecessor's sessions. A
    request of one of them (a claim: a sender's first write of a tensor after the restart) is
    answered 'stale-generation', which the sender takes as a loss (PeerLostError) and acts on
    (a worker joins its servers again), without the new generation. Before, it was answered
    'unauthenticated' (AuthenticationError, read as a wrong secret), and a worker that met it
    while joining a restarted server exited 1 (found by `tensorwire bench chaos`). A request
    without a hello and without an old generation is still refused as unauthenticated."""
    with tw.Receiver() as rx:
        rx.register("t", (4,), "int32")
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        try:
            dealer.linger = 0
            dealer.connect(rx.address)
            old = rx.generation ^ 1
            for generation, code in ((old, "stale-generation"), (rx.generation, "unauthenticated")):
                dealer.send(
                    msgpack.packb(
                        {
                            "v": 1,
                            "t": "claim",
                            "generation": generation,
                            "tensor_id": 0,
                            "transport": "tcp",
                        }
                    )
                )
                assert dealer.poll(5000)
                reply = msgpack.unpackb(dealer.recv())
                assert (reply["t"], reply["code"]) == ("error", code), reply
                assert str(rx.generation) not in reply["message"]
        finally:
            dealer.close()
            ctx.term()


def test_only_a_live_session_s_token_resumes_it() -> None:
    """`Resume` moves a session to a new control connection only with the token of a live
    session (which only its sender holds): a made-up token is told the session is over
    ('closed', a loss at a sender), whatever the generation."""
    with tw.Receiver() as rx:
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        try:
            dealer.linger = 0
            dealer.connect(rx.address)
            for generation in (rx.generation, rx.generation ^ 1):
                dealer.send(wire.encode(wire.Resume(generation, bytes(wire.TOKEN_BYTES))))
                assert dealer.poll(5000)
                reply = wire.decode(dealer.recv())
                assert isinstance(reply, wire.ErrorReply) and reply.code == "closed", reply
        finally:
            dealer.close()
            ctx.term()


def test_connect_to_nothing_times_out_clearly() -> None:
    """A port nothing listens at: the timeout says so, and is not ``silent`` (nothing there
    will answer later: a wrong address)."""
    with pytest.raises(
        tw.WireTimeoutError, match=r"did not answer.*nothing accepted a connection"
    ) as caught:
        tw.Sender.connect(f"tcp://127.0.0.1:{free_port()}", timeout=0.3)
    assert caught.value.silent is False


def test_a_receiver_whose_region_is_gone_as_a_sender_attaches_is_said_lost() -> None:
    """Over shm, a region the receiver published is gone when a sender opens it (the receiver
    closed and unlinked it between its answer and the sender's attach: in the test, unlinked by
    hand): PeerLostError, the receiver gone, not a TransportError, which a parameter server
    forming its job took for a wrong address and exited 1 at (a worker that quit just after
    its join, before the server reached it)."""
    with tw.Receiver() as rx:
        rx.register("t", (4,), "float32")
        for name in shm_entries():
            os.unlink(f"/dev/shm/{name}")
        with pytest.raises(tw.PeerLostError, match=r"closed: its shared-memory region .* is gone"):
            tw.Sender.connect(rx.address, transport="shm", timeout=5)


def test_connect_to_a_listener_that_never_answers_says_so() -> None:
    """A port that accepts TCP connections but never speaks ZeroMQ (a receiver frozen before it
    answered, or another service): the timeout says the connection stood and the handshake
    never came, not that nothing listens; it is ``silent``, as a stopped process is (the
    parameter server tries such a worker's address again while the job forms)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # never accepted: the kernel completes the connection by itself
        port = listener.getsockname()[1]
        with pytest.raises(
            tw.WireTimeoutError, match="accepted the connection but never"
        ) as caught:
            tw.Sender.connect(f"tcp://127.0.0.1:{port}", timeout=0.5)
    assert caught.value.silent is True


OUT_OF_DESCRIPTORS = """
import os, resource, sys, tensorwire as tw
rx = tw.Receiver()
rx.register("t", (4,), "float32")
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 1, hard))
try:
    tw.Sender.connect(rx.address, transport=sys.argv[1], timeout=2)
except tw.TensorWireError as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize("transport", ["tcp", "nixl"])
def test_a_sender_out_of_descriptors_says_so(transport: str) -> None:
    """A process with every file open that it may (its soft limit one above those it has) fails
    to connect, and the error says why and how to raise the limit; before, it said the receiver
    was not there ("nothing accepted a connection": its own connections could not be made),
    as a parameter server out of descriptors said its workers "do not answer"."""
    out = subprocess.run(
        [sys.executable, "-c", OUT_OF_DESCRIPTORS, transport],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "files open, of the" in out.stdout and "`ulimit -n`" in out.stdout, out.stdout


RECEIVER_OUT_OF_DESCRIPTORS = """
import logging, os, resource, sys, time, tensorwire as tw
logging.basicConfig()
with tw.Receiver() as rx:
    rx.register("t", (4,), "float32")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # one descriptor left: the control connection's, not the data connection's
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 1, hard))
    print(rx.address, flush=True)
    sys.stdin.readline()
"""


def test_a_receiver_out_of_descriptors_for_a_data_connection_says_so() -> None:
    """A receiver with one descriptor left: the control plane takes it, and the data connection
    cannot be accepted. The receiver says why and how to raise the limit, and waits between
    tries; before, it said nothing and its accept loop spun a core (2.0 s of CPU in 4 s) until
    the sender gave up ("did not acknowledge our token")."""
    child = subprocess.Popen(
        [sys.executable, "-c", RECEIVER_OUT_OF_DESCRIPTORS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        address = child.stdout.readline().strip()
        with pytest.raises(tw.TensorWireError):
            tw.Sender.connect(address, transport="tcp", timeout=2, connect_timeout=2)
    finally:
        _, err = child.communicate("\n", timeout=60)
    assert child.returncode == 0, err
    assert "cannot accept a data connection: [Errno 24] Too many open files" in err, err
    assert "files open, of the" in err and "`ulimit -n`" in err, err


def test_connect_to_a_zeromq_peer_that_never_replies_says_so() -> None:
    """A ZeroMQ socket that completes the handshake and never answers (a receiver whose control
    thread is stuck, or another ZeroMQ service): the timeout says the connection was made and no
    reply came."""
    silent = zmq.Context.instance().socket(zmq.ROUTER)
    try:
        port = silent.bind_to_random_port("tcp://127.0.0.1")
        with pytest.raises(
            tw.WireTimeoutError, match="accepted the connection but sent no reply"
        ) as caught:
            tw.Sender.connect(f"tcp://127.0.0.1:{port}", timeout=0.5)
        assert caught.value.silent is True
    finally:
        silent.close(linger=0)


def test_a_refresh_from_a_receiver_that_is_gone_ends_by_its_own_timeout() -> None:
    """refresh(timeout=) bounds the look-up, whatever the sender's timeout (a worker waiting
    for its servers' tensors while the job forms waits until its connect deadline, not for the
    step timeout); a receiver that closed is said gone as soon as its data connection's end
    shows (before, a WireTimeoutError at the refresh's timeout; a frozen one's timeout:
    ``-k not_yet_known``)."""
    rx = tw.Receiver()
    rx.register("t", (4,), "float32")
    with tw.Sender.connect(rx.address, transport="tcp", timeout=120) as tx:
        for bad in (-1, float("nan")):
            with pytest.raises(ValueError, match="timeout must be"):
                tx.refresh(timeout=bad)
        with pytest.raises(ValueError, match="timeout must be"):
            tw.Sender(timeout=float("nan"))
        with pytest.raises(ValueError, match="timeout must be"):
            tx.add_peer("tcp://127.0.0.1:1", connect_timeout=float("nan"))
        tx.refresh(timeout=5)
        assert "t" in tx.tensors()
        rx.close()
        start = time.monotonic()
        with pytest.raises(tw.PeerLostError, match="closed the data connection"):
            tx.refresh(timeout=30)
        assert time.monotonic() - start < 5


def test_a_ping_of_a_receiver_that_died_ends_at_once(children: Children, transport: str) -> None:
    """A receiver process SIGKILLed on this host: the sender's ping ends with PeerLostError as
    soon as its pidfd says so, not after the ping's timeout (a worker probing its servers
    while it waits for their parameters). Before, over the channels that see no hang-up
    (gRPC, NIXL), the ping waited out its timeout (10 s by hand)."""
    here, there = children.pipe()
    proc = children.start(run_receiver, there, [("t", (16,), "float32")])
    assert here.poll(30)
    info = here.recv()
    with tw.Sender.connect(info["address"], transport=transport, timeout=30) as tx:
        tx.write("t", np.zeros(16, np.float32))  # a channel to check: opened by a first write
        tx.ping(timeout=10)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        start = time.monotonic()
        with pytest.raises(tw.PeerLostError):
            tx.ping(timeout=20)
        assert time.monotonic() - start < 5


def test_a_ping_ends_when_its_check_raises_and_the_next_one_is_answered(
    children: Children,
) -> None:
    """`Sender.ping(check=...)`: a ping of a frozen receiver ends as soon as the caller's own
    check raises (a worker's look at the other servers' notices while one server holds its ping
    up: it heard another's notice 5 s late). The pings and the write after it go on (the
    abandoned request's socket is opened anew, so that its late answer is not taken for the
    next request's)."""
    here, there = children.pipe()
    proc = children.start(run_receiver, there, [("t", (16,), "float32")])
    assert here.poll(30)
    info = here.recv()
    with tw.Sender.connect(info["address"], transport="shm", timeout=30) as tx:
        tx.write("t", np.zeros(16, np.float32))
        tx.ping(timeout=10)
        looks: list[float] = []

        def check() -> None:
            looks.append(time.monotonic())
            if len(looks) >= 3:
                raise KeyError("news")

        freeze(proc.pid)
        try:
            start = time.monotonic()
            with pytest.raises(KeyError, match="news"):
                tx.ping(timeout=20, check=check)
            assert time.monotonic() - start < 5 and len(looks) == 3
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        for _ in range(3):
            tx.ping(timeout=10)
        tx.write("t", np.ones(16, np.float32))


def _close_ends(
    blocked: Callable[[], object], close: Callable[[], None], within: float
) -> list[BaseException]:
    """Run ``blocked`` in a thread, let it block, then ``close()``: the thread must end within
    ``within`` seconds of the close. Returns what it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            blocked()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.3)
    start = time.monotonic()
    close()
    thread.join(within + 5)
    assert not thread.is_alive(), "a blocked call survived close()"
    assert time.monotonic() - start < within, "close() waited behind the blocked call"
    return errors


def test_receiver_close_unblocks_waiter_and_sender(transport: str) -> None:
    rx = tw.Receiver(ring=1)
    rx.register("t", (4,), "int32")

    def waiter() -> None:
        rx.wait("t", timeout=10)  # the message already written
        rx.release("t")
        rx.wait("t", timeout=10)  # blocks until close()

    with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
        tx.write("t", np.zeros(4, np.int32))
        errors = _close_ends(waiter, rx.close, within=5)
        assert len(errors) == 1 and isinstance(errors[0], tw.ClosedError), errors
        with pytest.raises(tw.PeerLostError):
            for _ in range(50):
                tx.write("t", np.zeros(4, np.int32), timeout=5)
    with pytest.raises(tw.ClosedError):
        rx.wait("t", timeout=0)
    assert not shm_entries()


@pytest.mark.parametrize("polled", [False, True], ids=["waited", "polled"])
@pytest.mark.parametrize("cut", [20, wire.DATA_HEADER.size + 1000], ids=["header", "payload"])
def test_peer_stalling_mid_frame_is_dropped_and_others_keep_going(cut: int, polled: bool) -> None:
    """A TCP peer that stops in the middle of a frame (of its header, or of a small payload,
    which the receiver reads through its read-ahead buffer) is cut off after the frame
    timeout; nothing of the frame lands, and an idle connection between frames is no stall.
    ``polled``: a consumer polls the tensor all along (``wait(timeout=0)`` in a loop), never
    resting, so the connection's thread stands back throughout: it still looks at the clock
    of the frame (before, only when it read the socket itself, and the peer was cut off at
    no time: the test's read of the hang-up timed out after 10 s)."""
    with tw.Receiver(frame_timeout=0.3) as rx:
        rx.register("t", (1024,), "float32")
        rx.register("other", (8,), "float32")
        with tw.Sender.connect(rx.address, transport="tcp", timeout=10) as tx:
            tx.write("t", np.zeros(1024, np.float32))  # claims the tensor
            assert rx.wait("t", timeout=5).shape == (1024,)
            rx.release("t")
            stop = threading.Event()
            seen: list[BaseException] = []

            def poll() -> None:
                end = time.monotonic() + 20
                while not stop.is_set() and time.monotonic() < end:
                    try:
                        rx.wait("t", timeout=0)
                        seen.append(AssertionError("a message of the cut frame landed"))
                        return
                    except tw.WireTimeoutError:
                        continue
                    except BaseException as exc:
                        seen.append(exc)
                        return

            poller = threading.Thread(target=poll, daemon=True)
            peer = tx._peers[rx.address]  # fault injection: speak on the raw data connection
            sock = peer.channel._sock
            header = wire.encode_data_header(
                wire.DataHeader(peer.entries["t"].tensor_id, 0, peer.generation, 2, 4096, None)
            )
            frame = header + b"\x01" * 4096
            if polled:
                poller.start()
            sock.sendall(frame[:cut])  # part of the frame, then silence
            start = time.monotonic()
            sock.settimeout(10)
            while sock.recv(4096):  # credits may still arrive; then the receiver hangs up
                pass
            assert time.monotonic() - start < 5
            stop.set()
            if polled:
                poller.join(10)
            if seen:
                assert isinstance(seen[0], tw.PeerLostError), seen
            else:
                with pytest.raises(tw.PeerLostError):
                    rx.wait("t", timeout=5)
        _healthy(rx, "tcp")
        idle = tw.Sender.connect(rx.address, transport="tcp", timeout=10)
        try:  # an idle connection between frames is not a stall
            idle.write("t", np.ones(1024, np.float32))
            time.sleep(1.0)
            idle.write("t", np.full(1024, 2, np.float32))
            assert rx.wait("t", timeout=5)[0] == 1
            rx.release("t")
            assert rx.wait("t", timeout=5)[0] == 2
        finally:
            idle.close()


class _SlowControlPlane:
    """A control plane whose every request takes 30 ms to handle, and its ticks, recorded."""

    def __init__(self) -> None:
        self.ticks: list[tuple[float, float]] = []  # (when, caught_up), monotonic

    def handle(self, identity: bytes, msg: wire.Message) -> wire.Message:
        time.sleep(0.03)
        return wire.Ack(0)

    def tick(self, caught_up: float) -> None:
        self.ticks.append((time.monotonic(), caught_up))


def test_a_control_thread_behind_its_requests_judges_silence_only_up_to_what_it_read() -> None:
    """Requests that come faster than they are handled wait in the socket, a peer's heartbeat
    among them. A receiver judged silence by the clock alone, so a sender whose heartbeat
    waited there past the timeout was dropped: 64 workers joining two servers on a 2-core host
    had the servers drop them "silent for 30 s" while they waited to be answered, and set their
    sessions up again, and the job never formed. The tick now learns up to when every message
    sent had been read (the last moment none was waiting), and a session is judged up to there."""
    from tensorwire.control import ControlServer

    plane = _SlowControlPlane()
    server = ControlServer("tcp://127.0.0.1:0", plane.handle, plane.tick)
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(server.address)
        sent_at = time.monotonic()
        for _ in range(40):  # 1.2 s of work, sent at once
            dealer.send(wire.encode(wire.Heartbeat(1, b"token")))
        for _ in range(40):
            assert dealer.poll(10_000), "a request went unanswered for 10 s"
            dealer.recv()
        answered_at = time.monotonic()
        time.sleep(0.3)  # (ticks every 0.1 s)
    finally:
        dealer.close()
        ctx.term()
        server.close()
    during = [(t, c) for t, c in plane.ticks if sent_at + 0.6 < t < answered_at - 0.1]
    assert during, plane.ticks
    # behind: nothing sent after the 40 requests was known read while they waited
    assert all(c <= sent_at + 0.1 for _, c in during), (sent_at, during)
    # caught up: the ticks after the last answer judge up to their own time
    after = [(t, c) for t, c in plane.ticks if t > answered_at + 0.15]
    assert after and all(t - c < 0.15 for t, c in after), (answered_at, after)


def test_a_silent_sender_is_declared_lost(transport: str, children: Children) -> None:
    """A sender that stops answering (SIGSTOP: alive to its pidfd, silent on the wire) is dropped
    after the heartbeat timeout, and the waiter on its tensor is woken with PeerLostError."""
    from .peers import write_then_idle

    with tw.Receiver(heartbeat_timeout=1.0) as rx:
        rx.register("t", (16,), "float32")
        rx.register("other", (8,), "float32")
        here, there = children.pipe()
        proc = children.start(write_then_idle, rx.address, transport, "t", 0.2, there)
        assert here.poll(30) and here.recv() == "claimed"
        rx.wait("t", timeout=5)
        rx.release("t")
        time.sleep(1.5)  # heartbeating every 0.2 s: still there
        freeze(proc.pid)
        try:
            start = time.monotonic()
            with pytest.raises(tw.PeerLostError, match="heartbeat_timeout of 1 s"):
                rx.wait("t", timeout=10)
            assert time.monotonic() - start < 5
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        _healthy(rx, transport)


def test_a_peer_removed_while_its_heartbeat_is_out_is_not_logged_as_lost(
    transport: str, children: Children, caplog: pytest.LogCaptureFixture
) -> None:
    """A sender removes a receiver (``remove_peer``) while its heartbeat thread waits for that
    receiver's answer (the receiver frozen: each heartbeat waits out its 0.2 s): the thread
    then finds the channel closed, which is no loss, and logs nothing. Before, it logged the
    closed channel's reason as a lost receiver (over ``grpc``, a bare "closed" line: a
    parameter server's log had one each time a worker rejoined, `bench chaos --transport grpc`)
    and counted it in the metrics."""
    here, there = children.pipe()
    rounds = 3
    specs = [(f"t{k}", (4,), "float32") for k in range(rounds)]
    proc = children.start(run_receiver, there, specs)
    assert here.poll(30)
    address = here.recv()["address"]
    caplog.set_level(logging.WARNING, logger="tensorwire.heartbeat")
    with tw.Sender(heartbeat=0.2) as tx:
        try:
            for k in range(rounds):  # (bounded) each: a heartbeat out when the peer goes
                tx.add_peer(address, transport=transport, connect_timeout=10)
                tx.write(f"t{k}", np.ones(4, np.float32), timeout=10)  # (a tensor each round:
                # the one before stays claimed by the session removed without a goodbye)
                freeze(proc.pid)
                time.sleep(0.3)  # a heartbeat or two out, unanswered; the verdict takes 0.6 s
                tx.remove_peer(address, goodbye=False)
                time.sleep(0.3)  # the heartbeat that was out times out, and looks
                os.kill(proc.pid, signal.SIGCONT)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
    said = [r.getMessage() for r in caplog.records if r.name == "tensorwire.heartbeat"]
    assert not said, said


@pytest.mark.parametrize("reconnect", [False, True])
def test_a_dropped_sender_s_first_write_of_another_tensor_is_a_loss(
    transport: str, reconnect: bool
) -> None:
    """A sender whose session the receiver dropped (silent past its heartbeat timeout) writes
    a tensor it had not written before: the claim is refused as a loss that says why
    (PeerLostError, which ``reconnect=True`` acts on: the message lands over a new session),
    not as "say hello (and authenticate) first", an AuthenticationError that reads as a wrong
    secret. A parameter server met it after a worker's receiver dropped its session, and
    exited 1 (a chaos run, shm, asp, seed 101)."""
    with tw.Receiver(heartbeat_timeout=0.5) as rx:
        for name in ("a", "b"):
            rx.register(name, (4,), "float32")
        with tw.Sender.connect(
            rx.address, transport=transport, heartbeat=None, timeout=5, reconnect=reconnect
        ) as tx:
            tx.write("a", np.ones(4, np.float32))
            deadline = time.monotonic() + 10
            while peer_count(rx) and time.monotonic() < deadline:  # dropped: silent for 0.5 s
                time.sleep(0.05)
            assert peer_count(rx) == 0
            if not reconnect:
                with pytest.raises(
                    tw.PeerLostError, match=r"was dropped: silent for .* heartbeat"
                ) as lost:
                    tx.write("b", np.full(4, 2, np.float32))
                assert rx.pending("b") == 0
                # the receiver's own words, apart from the text, for a program to read
                assert lost.value.reason is not None, lost.value
                assert "was dropped: silent for" in lost.value.reason, lost.value.reason
                return
            tx.write("b", np.full(4, 2, np.float32))
            assert float(rx.wait("b", timeout=5)[0]) == 2


def test_a_sender_dropped_while_it_was_stopped_is_told_why(
    transport: str, children: Children
) -> None:
    """A sender process stopped (SIGSTOP) past the receiver's heartbeat timeout is dropped; when
    it runs again its heartbeats were refused as "unknown session token", so its next write
    said only that: not that it had been dropped, nor for what. The receiver now remembers the
    dropped session's token with the reason, and the sender's loss says it."""
    here, there = children.pipe()
    with tw.Receiver(heartbeat_timeout=0.6) as rx:
        rx.register("t", (4,), "float32")
        proc = children.start(write_after_own_stop, rx.address, transport, there)
        assert here.poll(60) and here.recv() == "ready"
        assert rx.wait("t", timeout=10).tolist() == [1.0] * 4
        rx.release("t")
        freeze(proc.pid)
        try:
            deadline = time.monotonic() + 10
            while peer_count(rx) and time.monotonic() < deadline:  # dropped: silent for 0.6 s
                time.sleep(0.05)
            assert peer_count(rx) == 0
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        here.send("write")
        assert here.poll(60)
        lost, outcome = here.recv()
        assert outcome.startswith("PeerLostError: ") and rx.pending("t") == 0, outcome
    assert "was dropped: silent for" in outcome and "heartbeat_timeout of 0.6 s" in outcome
    assert lost is not None and "unknown session token" not in lost, lost  # (also the writes')


def _write_t(
    rx: tw.Receiver, transport: str, children: Children, values: list[int]
) -> tuple[Any, Any]:
    """A writer of ``t`` (16 float32) in a child process, which has written a message filled
    with each of ``values``; with our end of its pipe (closed, it ends the writer cleanly)."""
    from .peers import write_on_request

    here, there = children.pipe()
    proc = children.start(write_on_request, rx.address, transport, "t", there)
    for k in values:
        here.send(k)
        assert here.poll(30) and here.recv() == k
    return proc, here


def _kill_until_dropped(rx: tw.Receiver, writer: tuple[Any, Any]) -> None:
    """SIGKILL the writer that ``_write_t`` started; return once this receiver has dropped it
    (bounded)."""
    proc, _ = writer
    proc.kill()
    proc.join(10)
    deadline = time.monotonic() + 10
    while peer_count(rx) > 0 and time.monotonic() < deadline:  # bounded: until it noticed
        time.sleep(0.02)
    assert peer_count(rx) == 0, "the receiver never noticed the writer's death"


@pytest.mark.parametrize("after_the_drain", ["nothing", "a message"])
def test_a_writer_drained_before_the_receiver_saw_it_die_leaves_no_stale_loss(
    transport: str, children: Children, after_the_drain: str
) -> None:
    """The application may learn of a writer's death first (the parameter server's own sender to
    that worker failed) and drain its tensor then; the receiver notices the death later. That
    notice is stale: it must not fail the first wait for the writer's successor (found under a
    CPU hog: a restarted worker was dropped again at once, its server never told it to stop,
    and it waited out its 120 s reconnect timeout). A message that landed after the drain shows
    the writer was not gone yet: then the notice stands."""
    from .peers import write_on_request

    with tw.Receiver() as rx:
        rx.register("t", (16,), "float32")
        # idle tensors beside it: a wait_any over this many reads every slot at once, and must
        # say whose writer was lost all the same (consumer.SCAN_ALL_FROM)
        rx.register_many([(f"idle{i}", (1,), "uint8") for i in range(100)])
        here, there = children.pipe()
        proc = children.start(write_on_request, rx.address, transport, "t", there)
        for k in (1, 2) if after_the_drain == "a message" else (1,):
            here.send(k)
            assert here.poll(30) and here.recv() == k
            assert np.array_equal(rx.wait("t", timeout=5), np.full(16, k, np.float32))
            rx.release("t")
            if k == 1:
                assert rx.drain("t") == 0  # nothing left behind; the writer is taken as gone
        _kill_until_dropped(rx, (proc, here))
        if after_the_drain == "a message":
            with pytest.raises(tw.PeerLostError, match="was lost") as lost:
                rx.wait_any(timeout=5)
            assert lost.value.tensor == "t"  # a wait for any tensor says whose writer it was
            return
        with pytest.raises(tw.WireTimeoutError):  # not a PeerLostError: that would be stale
            rx.wait("t", timeout=0.3)
        with tw.Sender.connect(rx.address, transport=transport, timeout=30) as successor:
            successor.write("t", np.full(16, 7, np.float32))
        assert np.array_equal(rx.wait("t", timeout=5), np.full(16, 7, np.float32))
        rx.release("t")


def test_each_lost_writer_is_told_between_its_messages_and_its_successor_s(
    transport: str, children: Children
) -> None:
    """Writers of one tensor that die one after another, each replaced before the consumer
    reads anything: the consumer reads each one's messages, then its loss, then the next
    one's. Before, a successor's claim cleared the notice, and the consumer read the dead
    writer's messages and the new one's as one stream, never told (a CI run: a sender
    restarted on another host had its first message handed out before its dead self's loss).
    Each notice is met by another way of waiting (wait, wait_all, wait_any among enough idle
    tensors to read every ring at once), each of which looks at the ring on its own."""
    with tw.Receiver() as rx:
        rx.register("t", (16,), "float32")
        rx.register_many([(f"idle{i}", (1,), "uint8") for i in range(100)])
        for first in (1, 3, 5):
            _kill_until_dropped(rx, _write_t(rx, transport, children, [first, first + 1]))
        with tw.Sender.connect(rx.address, transport=transport, timeout=30) as successor:
            successor.write("t", np.full(16, 7, np.float32))
            waits: list[Callable[[], Any]] = [
                lambda: rx.wait("t", timeout=5),
                lambda: rx.wait_all(["t"], timeout=5)["t"],
                lambda: rx.wait_any(timeout=5)[1],
            ]
            for first, wait in zip((1, 3, 5), waits, strict=True):
                for k in (first, first + 1):
                    assert np.array_equal(wait(), np.full(16, k, np.float32)), k
                    rx.release("t")
                with pytest.raises(tw.PeerLostError, match="was lost: ") as lost:
                    wait()
                assert lost.value.tensor == "t"
            assert np.array_equal(rx.wait("t", timeout=5), np.full(16, 7, np.float32))
            rx.release("t")
            with pytest.raises(tw.WireTimeoutError):  # every notice was told once
                rx.wait("t", timeout=0.2)


@pytest.mark.parametrize("transport", ["shm", "tcp"])  # (the receiver's logic alone)
def test_a_drain_discards_every_loss_owed_and_every_message(
    transport: str, children: Children
) -> None:
    """``drain`` empties the ring of every message landed and forgets every loss notice owed,
    also of writers replaced before the consumer read (the parameter server drains rank 0's
    initial values as it takes a restarted rank 0 back, values that rank 0 wrote a moment
    before: a drain that kept a successor's messages left that one-slot ring full, and the
    next restarted rank 0 waited for ever for a slot)."""
    with tw.Receiver() as rx:
        rx.register("t", (16,), "float32", ring=4)
        _kill_until_dropped(rx, _write_t(rx, transport, children, [1]))
        _kill_until_dropped(rx, _write_t(rx, transport, children, [2]))
        successor = _write_t(rx, transport, children, [3])
        deadline = time.monotonic() + 10
        while rx.pending("t") < 3 and time.monotonic() < deadline:  # (bounded)
            time.sleep(0.02)
        assert rx.drain("t") == 3
        with pytest.raises(tw.WireTimeoutError):  # no notice left
            rx.wait("t", timeout=0.2)
        successor[1].send(4)  # the ring has room again: the successor writes on
        assert successor[1].poll(30) and successor[1].recv() == 4
        assert np.array_equal(rx.wait("t", timeout=5), np.full(16, 4, np.float32))
        rx.release("t")


def test_a_job_s_words_are_read_past_the_loss_of_an_earlier_session(children: Children) -> None:
    """The daemons read their words tensors (a join, a status) with ``wait_past_losses``: the
    loss of a writer that a successor's message follows is passed over, as the parameter
    server takes a restarted worker's join (it failed "tensor 'join/1': ... was lost" when the
    notice came to be told before the successor's message); a loss with nothing after it ends
    the wait."""
    from tensorwire.job.words import wait_past_losses

    with tw.Receiver() as rx:
        rx.register("t", (16,), "float32")
        _kill_until_dropped(rx, _write_t(rx, "tcp", children, [1]))
        _kill_until_dropped(rx, _write_t(rx, "tcp", children, [2]))
        successor = _write_t(rx, "tcp", children, [3])
        deadline = time.monotonic() + 10
        while rx.pending("t") < 3 and time.monotonic() < deadline:  # (bounded)
            time.sleep(0.02)
        for k in (1, 2, 3):  # both losses passed over, each after its writer's message
            assert np.array_equal(wait_past_losses(rx, "t", 0.0), np.full(16, k, np.float32))
            rx.release("t")
        _kill_until_dropped(rx, successor)
        with pytest.raises(tw.PeerLostError, match="was lost: "):
            wait_past_losses(rx, "t", 5.0)
        with pytest.raises(tw.WireTimeoutError):
            wait_past_losses(rx, "t", 0.2)


def test_a_slow_channel_set_up_is_kept_alive(
    transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a data channel can outlast the receiver's patience with a silent session (NIXL's
    agents take over a second to create on a GPU host, seen on an H100): the sender heartbeats
    the session from its welcome on, so a set-up slower than the heartbeat timeout still works.
    The slow set-up is made here by delaying the channel's opening by 1.5 s; the sender keeps
    its default interval (5 s), so the heartbeats come as often as the receiver's welcome asks."""
    from tensorwire import transports

    real = transports.CHANNELS[transport]

    def slow(info: Any) -> Any:
        time.sleep(1.5)  # longer than the receiver's heartbeat timeout below
        return real(info)

    monkeypatch.setitem(transports.CHANNELS, transport, slow)
    with tw.Receiver(heartbeat_timeout=1.0) as rx:
        rx.register("t", (8,), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
            tx.write("t", np.arange(8, dtype=np.float32))
            assert rx.wait("t", timeout=10).tolist() == list(range(8))
            rx.release("t")


def test_heartbeats_follow_a_receiver_timeout_shorter_than_their_interval(
    transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A receiver that drops sessions silent for 0.5 s keeps a sender of the default 5 s interval
    that idles for three times that: the welcome tells the sender how often to heartbeat. (Before
    it did, every idle sender was dropped, and a NIXL set-up slowed by a busy host was cut
    mid-way and hung until its timeout.)"""
    with tw.Receiver(heartbeat_timeout=0.5) as rx:
        rx.register("t", (8,), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
            for k in range(2):
                tx.write("t", np.full(8, k, np.float32))
                assert rx.wait("t", timeout=10).tolist() == [k] * 8
                rx.release("t")
                if k == 0:
                    time.sleep(1.5)  # idle, three of the receiver's timeouts
    assert "heartbeat_timeout of" not in caplog.text


def test_the_heartbeats_say_at_once_that_a_receiver_on_this_host_died(
    children: Children, caplog: pytest.LogCaptureFixture
) -> None:
    """An idle sender (heartbeat 0.1 s) whose receiver on this host is SIGKILLed: its
    heartbeats mark the receiver lost by its process's exit at their next turn, and say that,
    not "missed 3 heartbeats" once three intervals passed unanswered (15 s at the default
    5 s: a parameter server logged it after its own line that the worker had died)."""
    here, there = children.pipe()
    proc = children.start(run_receiver, there, [("t", (4,), "float32")])
    assert here.poll(30)
    address = here.recv()["address"]
    with (
        caplog.at_level(logging.WARNING, logger="tensorwire.heartbeat"),
        tw.Sender.connect(address, transport="tcp", timeout=10, heartbeat=0.1) as tx,
    ):
        tx.write("t", np.ones(4, np.float32))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        deadline = time.monotonic() + 10
        while "died" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # five more intervals: no other verdict follows
    said = [r.getMessage() for r in caplog.records if r.name == "tensorwire.heartbeat"]
    assert said == [f"receiver at {address} (pid {proc.pid}) died"], said


def test_an_idle_sender_without_heartbeats_is_told_why_it_was_dropped(transport: str) -> None:
    """``heartbeat=None`` sends none, so a receiver that ends silent sessions drops the sender
    once it idles that long, as it should; its next write says so and what to do. Before, the
    error named only what the writer met (a closed connection, a revoked claim)."""
    with tw.Receiver(heartbeat_timeout=0.5) as rx:
        rx.register("t", (8,), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=10, heartbeat=None) as tx:
            tx.write("t", np.ones(8, np.float32))
            assert rx.wait("t", timeout=10).tolist() == [1.0] * 8
            rx.release("t")
            time.sleep(1.5)  # idle, three of the receiver's timeouts
            with pytest.raises(tw.PeerLostError, match=r"heartbeat=None.*silent for 0.5 s"):
                for _ in range(50):  # bounded: the drop reaches the writer within a write or two
                    tx.write("t", np.ones(8, np.float32))
                    rx.wait("t", timeout=10)
                    rx.release("t")


def test_a_frozen_receiver_does_not_hold_back_the_heartbeats_of_another(
    children: Children, caplog: pytest.LogCaptureFixture
) -> None:
    """One sender, two receivers: A frozen (SIGSTOP), B dropping sessions silent for 0.6 s.
    The sender's one heartbeat thread waits for A's answers no longer than B's interval, so B
    keeps the sender through 2.5 s of idling (before, each heartbeat to A held the thread for
    the sender's whole interval, 1 s here, and B dropped the sender as silent)."""
    here, there = children.pipe()
    proc = children.start(run_receiver, there, [("a", (4,), "float32")])
    assert here.poll(30)
    frozen = here.recv()["address"]
    with tw.Receiver(heartbeat_timeout=0.6) as rx:
        rx.register("b", (4,), "float32")
        with tw.Sender(timeout=10, heartbeat=1.0) as tx:
            tx.add_peer(frozen)
            tx.add_peer(rx.address)
            freeze(proc.pid)
            try:
                time.sleep(2.5)
                tx.write("b", np.ones(4, np.float32))
                assert rx.wait("b", timeout=5).tolist() == [1.0] * 4
                rx.release("b")
            finally:
                os.kill(proc.pid, signal.SIGKILL)
    assert "heartbeat_timeout of" not in caplog.text


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_receiver_lost_in_the_middle_of_a_set_up_ends_it(
    transport: str, how: str, children: Children
) -> None:
    """The receiver dies (SIGKILL) or freezes (SIGSTOP) at the first step of the sender's
    set-up that waits for it: the sender's connect ends with PeerLostError as soon as its pidfd
    (died) or its heartbeats (frozen) say so, not after its timeout for an answer that cannot
    come (a `nixl` set-up waited 65 s for its ping's answer before, with the default timeout)."""
    here, there = children.pipe()
    proc = children.start(receiver_lost_in_set_up, there, transport, how)
    assert here.poll(60)
    address = here.recv()
    start = time.monotonic()
    with pytest.raises(tw.PeerLostError, match=None if how == "kill" else "heartbeats"):
        tw.Sender.connect(address, transport=transport, timeout=60, heartbeat=0.2)
    assert time.monotonic() - start < 10
    if how == "stop":
        os.kill(proc.pid, signal.SIGKILL)


def test_a_silent_receiver_is_declared_lost(transport: str, children: Children) -> None:
    here, there = children.pipe()
    proc = children.start(run_receiver, there, [("t", (16,), "float32")])
    assert here.poll(30)
    info = here.recv()
    with tw.Sender.connect(info["address"], transport=transport, timeout=30, heartbeat=0.2) as tx:
        tx.write("t", np.zeros(16, np.float32))
        freeze(proc.pid)
        try:
            start = time.monotonic()
            with pytest.raises(tw.PeerLostError, match="missed 3 heartbeats"):
                for _ in range(100):  # bounded; the ring fills after one more write anyway
                    tx.write("t", np.zeros(16, np.float32))
                    time.sleep(0.05)
            assert time.monotonic() - start < 10
            assert "missed 3 heartbeats" in (tx.lost() or "")  # the heartbeats' verdict
        finally:
            os.kill(proc.pid, signal.SIGCONT)


def test_senders_killed_again_and_again_lose_nothing_they_wrote(
    transport: str, children: Children, tmp_path: Path
) -> None:
    """Five sender processes in turn write numbered messages into one tensor, each SIGKILLed
    at a random moment mid-stream, the next claiming the tensor after it. The consumer, reading
    all along, never sees a torn message, a duplicate, a gap within a sender's messages, or one
    of an earlier sender after a later one's; it never sees more than a sender wrote, and where
    a write returns only once delivered, every message a sender wrote before its death."""
    import random

    rng = random.Random(7)
    seen: list[int] = []  # first element of each message, in the order received
    errors: list[str] = []
    lost: list[float] = []
    stop = threading.Event()
    with tw.Receiver(heartbeat_timeout=2.0) as rx:
        rx.register("t", (512,), "int64")

        def consume() -> None:
            while not stop.is_set():
                try:
                    view = rx.wait("t", timeout=0.2)
                except tw.WireTimeoutError:
                    continue
                except tw.PeerLostError:  # said once per lost sender; the next one writes on
                    lost.append(time.monotonic())
                    continue
                first = int(view[0])
                if not (view == first).all():
                    errors.append(f"torn message: {np.unique(np.asarray(view))[:4]}")
                seen.append(first)
                rx.release("t")

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        acked = []
        try:
            for incarnation in range(5):
                count = tmp_path / f"acked-{incarnation}"
                count.write_bytes(bytes(8))

                def written(path: Path = count) -> int:
                    return int(np.fromfile(path, np.int64)[0])

                proc = children.start(
                    write_numbered, rx.address, transport, "t", incarnation, str(count), 60.0
                )
                deadline = time.monotonic() + 30
                while written() == 0:  # it claimed the tensor and wrote (bounded)
                    assert time.monotonic() < deadline, f"sender {incarnation} never wrote"
                    assert proc.is_alive(), f"sender {incarnation} exited {proc.exitcode}"
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.05, 0.4))
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(10)
                acked.append(written())
            quiet = time.monotonic()
            last = len(seen)
            while time.monotonic() - quiet < 1.0:  # until nothing more arrives for 1 s
                time.sleep(0.05)
                if len(seen) != last:
                    last, quiet = len(seen), time.monotonic()
        finally:
            stop.set()
            reader.join(10)
    assert not errors, errors[:5]
    assert 1 <= len(lost) <= len(acked), lost  # told of its lost writers, once each at most
    incarnations = [v >> 32 for v in seen]
    assert incarnations == sorted(incarnations), "an earlier sender's message after a later's"
    for k, wrote in enumerate(acked):
        got = [v & 0xFFFFFFFF for v in seen if v >> 32 == k]
        assert got == list(range(len(got))), f"sender {k}: gap or duplicate in {got[:20]}..."
        # the write in flight at the kill may have landed: at most one more than returned
        assert len(got) <= wrote + 1, (k, len(got), wrote)
        if transport in WRITE_IS_DELIVERY:
            assert len(got) >= wrote, f"sender {k} wrote {wrote} messages, {len(got)} arrived"
        assert wrote > 0


def _assert_soak_left_nothing(result: dict[str, Any]) -> None:
    """A soak's receiver kept no segment, and no descriptor beyond its warm-up's or opened
    during the run (a leak per session or per killed sender)."""
    assert result["segment_growth"] == 0 and result["fd_growth"] <= 0
    assert result["fds_left_open"] == []


def test_soak_accounts_for_every_message(tmp_path: Path) -> None:
    """The CI version of `tensorwire bench soak`: 8 s of load from three senders over shm, tcp
    and grpc (12 s until the suite neared its 10 minutes); every message exactly once and
    whole, and nothing leaked. The 8 s count from every sender's first message (its start,
    however long, is reported apart)."""
    from .jobs import bench_job

    out, result = bench_job(tmp_path, "soak", "--duration", "8", timeout=240)
    assert result["problems"] == []
    assert result["startup_s"] > 0 and result["duration_s"] >= 8, result
    assert f"(every sender writing {result['startup_s']:.1f} s after the start)" in out
    assert {s["transport"] for s in result["senders"]} == {"shm", "tcp", "grpc"}
    for s in result["senders"]:
        assert s["sent"] == s["received"] > 0
    _assert_soak_left_nothing(result)
    assert result["rss_growth_bytes"] < 64 << 20  # flat: a leak per message would be far more
    # and the memory in use, once glibc's allocator has handed back what it keeps for reuse
    assert result["rss_growth_trimmed_bytes"] < 64 << 20


def test_a_soak_report_says_where_returned_writes_did_not_all_arrive() -> None:
    """The report of a real run (docs/soak-2026-11-29: three nixl senders frozen 36 times, of
    which 4 lost the message of a write that had returned) names the transport of that
    shortfall and why it is no problem there. Before, it printed the totals alone (596,268
    returned, 596,265 arrived) above "OK", and which transport it was took runs by hand."""
    from tensorwire.bench.soak import render

    runs = Path(__file__).resolve().parent.parent / "docs" / "soak-2026-11-29"
    path = runs / "nixl-frozen.json"
    text = render(json.loads(path.read_text()))
    assert "  4 of them (nixl 4) lost messages their writes returned for: over tcp and nixl" in text
    assert text.endswith("OK: nothing lost, duplicated or torn"), text
    # a run where every returned write arrived says nothing of the kind
    path = runs / "grpc-stream-tcp-delivery.json"
    assert "lost messages" not in render(json.loads(path.read_text()))


def test_a_soak_report_without_a_warm_up_says_nothing_was_measured() -> None:
    """A soak whose warm-up point never came (a sender's stream received nothing in the run)
    has no memory or descriptor figures: the report says so. Before, it printed "+0.00 MiB
    after warm-up" and "descriptors +0", as if measured (a run of this session, its problem
    lines lost, showed only that)."""
    from tensorwire.bench.soak import render

    result = {
        "senders": [],
        "messages": 12,
        "duration_s": 1.0,
        "rss_after_warmup": None,
        "rss_growth_bytes": 0,
        "fd_growth": 0,
        "segment_growth": 0,
        "problems": ["s1: sender 0 (tcp): TransportError after 0 messages: refused"],
    }
    text = render(result)
    assert "not measured: no warm-up point" in text and "MiB" not in text, text
    assert "PROBLEMS:\n  s1: sender 0 (tcp)" in text
    result["rss_after_warmup"] = 1 << 30
    result["rss_growth_bytes"] = 1 << 20
    assert "resident memory +1.00 MiB after warm-up" in render(result)


def test_soak_with_senders_that_come_and_go(tmp_path: Path) -> None:
    """`tensorwire bench soak --reconnect-every 50`: each sender (tcp, shm, grpc) closes its
    session and connects again every 50 messages for 5 s. Every message arrives once, in
    order and whole across the sessions, and nothing is left behind: before 914d9a7 the
    receiver kept every tcp session's link and buffers (by hand: +180 MiB in 20 s over tcp,
    1025 sessions; +13 MiB, flat from then on, after)."""
    from .jobs import bench_job

    _, result = bench_job(
        tmp_path, "soak", "--duration", "5", "--reconnect-every", "50", timeout=240
    )
    assert result["problems"] == []
    for s in result["senders"]:
        assert s["sent"] == s["received"] > 50 and s["sessions"] > 1, s
    _assert_soak_left_nothing(result)
    assert result["rss_growth_bytes"] < 64 << 20


def _assert_fault_accounted(transport: str, fault: dict[str, Any]) -> None:
    """At most one more of a killed or frozen sender's messages arrived than its writes
    returned for (the write in flight), tensor by tensor where it wrote several, and over the
    transports whose write returns on delivery none fewer."""
    each = fault.get("received_each", [fault["received"]])
    assert max(each) <= fault["acked"] + 1, (transport, fault)
    if transport in WRITE_IS_DELIVERY:
        assert min(each) >= fault["acked"], (transport, fault)


def _assert_soak_ended_whole(result: dict[str, Any]) -> None:
    """Every last sender's messages arrived, and the receiver kept nothing."""
    for s in result["senders"]:
        assert s["sent"] == s["received"] > 0, s
    _assert_soak_left_nothing(result)


def _assert_kills_accounted(result: dict[str, Any]) -> None:
    """A soak with kills: at least 3 of them; every killed sender taken over and accounted
    for (:func:`_assert_fault_accounted`); the last senders' messages all arrived; nothing
    left."""
    kills = [k for s in result["senders"] for k in s["killed"]]
    assert len(kills) >= 3, result["senders"]
    for s in result["senders"]:
        for k in s["killed"]:
            assert "takeover_s" in k, k  # its successor's messages came
            _assert_fault_accounted(s["transport"], k)
    _assert_soak_ended_whole(result)


@pytest.mark.nixl
def test_soak_with_senders_killed_mid_stream(tmp_path: Path) -> None:
    """`tensorwire bench soak --kill-every 0.7`: four senders (shm, tcp, grpc, nixl), each
    SIGKILLed at random moments for 8 s and a new process taking its tensor over. Nothing
    torn or out of order, no killed sender's message after its successor's, at most one more
    than its writes returned for, and over shm and grpc every one they did; the last senders'
    messages all arrive, and the receiver's descriptors and segments are flat through the
    kills. (By hand, 49 kills in 30 s over the five transports: all held; NIXL logged a line
    per credit sent to a killed sender, now one: `test_nixl.py -k credits_to_a_killed`.)"""
    from .jobs import bench_job

    _, result = bench_job(
        tmp_path,
        "soak",
        *("--duration", "8", "--kill-every", "0.7", "--seed", "3", "--senders", "4"),
        *("--transports", "shm,tcp,grpc,nixl", "--heartbeat-timeout", "3"),
        timeout=240,
    )
    assert result["problems"] == []
    _assert_kills_accounted(result)


@needs_pid_namespaces
@pytest.mark.nixl
def test_soak_with_senders_on_hosts_of_their_own_killed_mid_stream(tmp_path: Path) -> None:
    """`tensorwire bench soak --hosts separate --kill-every 1`: four senders (tcp, grpc,
    grpc-stream, nixl), each in a pid namespace of its own, so that the receiver sees them as
    on other machines and tells a death by the connection or the heartbeat timeout (2 s here),
    never by the process; each successor, started at once, claims while its dead predecessor
    may still hold the tensor ("silent-owner": asked again until it is dropped). Nothing lost,
    torn or out of order, and the last senders' messages all arrive. (At 1 s, a fresh clone's
    suite once saw a new nixl sender, starting in its namespace beside the suite's load, send
    no heartbeat for 1.1 s while it set up its channel: dropped before its first message.)"""
    from .jobs import bench_job

    _, result = bench_job(
        tmp_path,
        "soak",
        *("--duration", "8", "--kill-every", "1", "--seed", "4", "--senders", "4"),
        *("--transports", "tcp,grpc,grpc-stream,nixl", "--heartbeat-timeout", "2"),
        *("--hosts", "separate"),
        timeout=240,
    )
    assert result["problems"] == [] and result["hosts"] == "separate"
    _assert_kills_accounted(result)


@pytest.mark.nixl
def test_soak_of_dynamic_shapes_with_senders_killed_mid_stream(tmp_path: Path) -> None:
    """`tensorwire bench soak --dynamic --kill-every 0.7`: every message of a length of its own
    (1 to 512 int64, told from its counter), its shape words written with it, over shm, tcp,
    grpc-stream and nixl, senders SIGKILLed at random: each message arrives with the shape it
    was written with, untorn, in order. (By hand, 40 s of kills and 60 s of kills and freezes
    at 1 MiB over the five transports: 37 kills, then 32 kills and 23 freezes, all held.)
    Kills begin only before the run's last 3 s: 6 s left 3 s for three, which a loaded machine
    (the suite beside a CPU-bound probe) once missed; 9 s leave 6."""
    from tensorwire.bench.soak import message_length

    from .jobs import bench_job

    lengths = {message_length(c, 512) for c in range(1 << 20, (1 << 20) + 4096)}
    assert min(lengths) >= 1 and max(lengths) <= 512 and len(lengths) > 400
    _, result = bench_job(
        tmp_path,
        "soak",
        *("--duration", "9", "--kill-every", "0.7", "--seed", "4", "--senders", "4"),
        *("--transports", "shm,tcp,grpc-stream,nixl", "--heartbeat-timeout", "3"),
        *("--size", "4K", "--dynamic"),
        timeout=240,
    )
    assert result["problems"] == []
    assert result["dynamic"] is True and result["size"] == 4096
    _assert_kills_accounted(result)


@pytest.mark.nixl
def test_soak_with_senders_frozen_and_taken_over(tmp_path: Path) -> None:
    """`tensorwire bench soak --freeze-every 1.5`: five senders (shm, tcp, grpc, grpc-stream,
    nixl) are SIGSTOPped at random moments for 18 s; a new process takes each one's tensor
    over once the receiver drops it (its 2 s heartbeat timeout), and the frozen one then runs
    again. Each frozen one is fenced: at most its write in flight at the freeze returns after
    it, its next raises PeerLostError, none of its messages lands after its successor's, and
    over shm and grpc every one its writes returned for arrived. Over nixl the successor's
    claim waits until the frozen process has exited (its RDMA write cannot be revoked).
    A freeze may begin only in the first 7 s less than the run (it must end, the takeover's
    heartbeat timeout and all, before the run's quiet end): 12 s left 5 s, of which the five
    senders' starts took most under the whole suite's load, and twice in a day only one sender
    was frozen."""
    from .jobs import bench_job

    _, result = bench_job(
        tmp_path,
        "soak",
        *("--duration", "18", "--freeze-every", "1.5", "--seed", "5", "--senders", "5"),
        *("--transports", "shm,tcp,grpc,grpc-stream,nixl", "--heartbeat-timeout", "2"),
        timeout=240,
    )
    assert result["problems"] == []
    frozen = [(s["transport"], f) for s in result["senders"] for f in s["frozen"]]
    assert len(frozen) >= 2, result["senders"]
    for transport, f in frozen:
        if f.get("held"):  # shm stopped inside a write, or nixl: held until it ran again
            assert transport in ("shm", "nixl") and f["ended"].startswith("PeerLostError"), f
            continue
        assert f["takeover_s"] < f["resumed_after_s"], f  # it ran again after its successor
        assert f["acked"] <= f["acked_at_freeze"] + 1, (transport, f)
        assert f["ended"].startswith("PeerLostError"), (transport, f)
        _assert_fault_accounted(transport, f)
    _assert_soak_ended_whole(result)


@pytest.mark.nixl
def test_soak_of_messages_made_in_place_with_senders_killed_and_frozen(tmp_path: Path) -> None:
    """`tensorwire bench soak --api buffer`: each 1 MiB message filled in place
    (`Sender.buffer`: over shm, in the receiver's slot), senders SIGKILLed and SIGSTOPped at
    random, so that faults land mid-fill. Its first runs at 4 MiB met a frozen shm sender's
    returned message lost, two of its successor's, and the ring stuck: a dropped writer trying
    again had wiped its successor's WRITING announcement (`test_revoked_writer.py -k
    announcement`). Nothing lost, torn or out of order, over shm (two senders), tcp and nixl."""
    from .jobs import bench_job

    _, result = bench_job(
        tmp_path,
        "soak",
        *("--duration", "12", "--freeze-every", "1", "--kill-every", "1", "--seed", "8"),
        *("--senders", "4", "--transports", "shm,tcp,shm,nixl", "--heartbeat-timeout", "2"),
        *("--api", "buffer", "--size", "1M"),
        timeout=240,
    )
    assert result["problems"] == []
    assert result["api"] == "buffer"
    faults = [f for s in result["senders"] for f in (*s["frozen"], *s["killed"])]
    assert len(faults) >= 3, result["senders"]
    _assert_soak_ended_whole(result)


@pytest.mark.nixl
def test_soak_of_batches_with_senders_killed_and_frozen(tmp_path: Path) -> None:
    """`tensorwire bench soak --api write_many --tensors 3`: each sender writes its three
    tensors in one `write_many` a step (claimed in one claim-many, one doorbell over shm, one
    `sendmsg` over tcp, one notification over nixl), senders SIGKILLed and SIGSTOPped at
    random, so that faults land mid-batch and each successor claims three tensors back at
    once. Every tensor is accounted for on its own: nothing lost, torn or out of order, no
    message in another tensor's ring, at most one step more of a dead writer than its
    writes returned for (over shm and grpc, none fewer). Before, no fault test wrote batches."""
    from .jobs import bench_job

    _, result = bench_job(
        tmp_path,
        "soak",
        *("--duration", "12", "--freeze-every", "1", "--kill-every", "1", "--seed", "9"),
        *("--senders", "4", "--transports", "shm,tcp,grpc,nixl", "--heartbeat-timeout", "2"),
        *("--api", "write_many", "--tensors", "3", "--size", "16K"),
        timeout=240,
    )
    assert result["problems"] == []
    assert result["api"] == "write_many" and result["tensors"] == 3
    faults = [(s["transport"], f) for s in result["senders"] for f in (*s["frozen"], *s["killed"])]
    assert len(faults) >= 3, result["senders"]
    for transport, f in faults:
        if f.get("held"):  # (a frozen shm writer stopped inside its batch: held, as designed)
            continue
        assert len(f["received_each"]) == 3, f
        _assert_fault_accounted(transport, f)
    _assert_soak_ended_whole(result)


@pytest.mark.nixl
@pytest.mark.parametrize("consume", ["each", "all"])
def test_soak_of_batches_taken_with_wait_each_or_wait_all(tmp_path: Path, consume: str) -> None:
    """`tensorwire bench soak --api write_many --consume each|all`: the receiver takes each
    sender's three tensors with `wait_each` or `wait_all` and hands them back with
    `release_many` (credits of a batch in one frame train), while senders are SIGKILLed at
    random, so that lost writers' notices, partial steps and credits owed to the dead meet
    the batch consumer API. Under `all`, a dead writer's partial step is read alone until its
    tensors are in line again (`read_alone`). Nothing lost, torn or out of order. Before, every
    soak took its messages with `wait_any` and `release` only."""
    from .jobs import bench_job

    _, result = bench_job(
        tmp_path,
        "soak",
        # 12 s at 0.5: kills begin only once a sender writes and end 3 s before the end; 9 s at
        # 0.7 made 2 kills in a fresh clone's suite, where the assertion wants 3
        *("--duration", "12", "--kill-every", "0.5", "--seed", "12", "--senders", "4"),
        *("--transports", "shm,tcp,grpc,nixl", "--heartbeat-timeout", "2"),
        *("--api", "write_many", "--tensors", "3", "--consume", consume),
        timeout=240,
    )
    assert result["problems"] == []
    assert result["consume"] == consume and result["read_alone"] >= 0
    if consume == "each":
        assert result["read_alone"] == 0  # (each tensor is taken on its own anyway)
    _assert_kills_accounted(result)


def test_soak_of_large_batches_with_shm_writers_frozen_mid_copy(tmp_path: Path) -> None:
    """`tensorwire bench soak --api write_many --size 4M` over shm, senders SIGSTOPped at random:
    most freezes land inside a tensor's copy, whose ring the stopped writer holds (its WRITING
    announcement) until it runs again, as designed; that write then completes, and the step's
    next tensor finds the claim revoked. The report counts such a writer as held, not as a
    receiver that failed to drop it: before, it looked for one more returned write, which a
    batch's failing step never gives (a 480 s run at 9dba412 reported two such holds as
    problems).

    Where a freeze lands is chance: about two in five land inside a copy on an idle machine
    (2 of 5 or 6 a run), fewer under the suite's load (a run of the suite saw none), so the
    soak runs again, with another seed, until one has (three runs at most)."""
    from .jobs import bench_job

    frozen: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []
    for seed in ("11", "12", "13"):  # bounded: three soaks of 14 s at most
        _, result = bench_job(
            tmp_path,
            "soak",
            *("--duration", "14", "--freeze-every", "0.7", "--seed", seed, "--senders", "2"),
            *("--transports", "shm", "--heartbeat-timeout", "1"),
            *("--api", "write_many", "--tensors", "4", "--size", "4M"),
            timeout=240,
        )
        assert result["problems"] == []
        _assert_soak_ended_whole(result)
        frozen += [f for s in result["senders"] for f in s["frozen"]]
        held += [f for s in result["senders"] for f in s["frozen"] if f.get("held")]
        if held:
            break
    assert held, frozen
    for f in held:  # its write in flight landed once it ran again; no step returned after it
        assert f["landed_after_resume"] >= 1 and f["acked"] <= f["acked_at_freeze"] + 1, f
        assert f["ended"].startswith("PeerLostError"), f


def test_curve_encrypted_control_plane(tmp_path: Path, transport: str) -> None:
    from tensorwire import curve

    curve.generate(str(tmp_path / "keys"))
    keys = curve.load(str(tmp_path / "keys"))
    assert (
        keys.secret is not None and os.stat(tmp_path / "keys/server.key_secret").st_mode & 0o77 == 0
    )
    with tw.Receiver(curve_keys=keys) as rx:
        rx.register("t", (4,), "int32")
        with tw.Sender.connect(
            rx.address, transport=transport, timeout=5, curve_server_key=keys.public
        ) as tx:
            tx.write("t", np.arange(4, dtype=np.int32))
        assert rx.wait("t", timeout=5).tolist() == [0, 1, 2, 3]
        # The wrong key: the receiver closes every handshake, and the timeout says so.
        with pytest.raises(tw.WireTimeoutError, match="during the CURVE handshake"):
            tw.Sender.connect(
                rx.address,
                transport=transport,
                timeout=0.5,
                curve_server_key=zmq.curve_keypair()[0],
            )
        # No key: ZeroMQ never tries again after a mechanism mismatch, so the connect fails at
        # once rather than when its timeout runs out (it waited the whole 60 s by default).
        started = time.monotonic()
        with pytest.raises(tw.AuthenticationError, match="encrypts its control plane with CURVE"):
            tw.Sender.connect(rx.address, transport=transport, timeout=30)
        assert time.monotonic() - started < 10
        assert rx.pending("t") == 0
    with tw.Receiver() as plain:  # and a key given for a receiver without CURVE
        started = time.monotonic()
        with pytest.raises(tw.AuthenticationError, match="does not encrypt its control plane"):
            tw.Sender.connect(plain.address, timeout=30, curve_server_key=keys.public)
        assert time.monotonic() - started < 10


def test_a_refused_curve_handshake_never_outlasts_the_timeout(tmp_path: Path) -> None:
    """Once in CI a connect whose CURVE handshake the receiver refused hung in the DEALER's send
    (no connection to queue on between reconnects) until pytest's timeout; the send now waits
    within the request's deadline. (40 tries here did not reproduce the hang on the old code:
    this checks the bound every time.)"""
    from tensorwire import curve

    curve.generate(str(tmp_path / "keys"))
    keys = curve.load(str(tmp_path / "keys"))
    with tw.Receiver(curve_keys=keys) as rx:
        for i in range(20):  # bounded: 20 tries of 0.3 s
            key = None if i % 2 else zmq.curve_keypair()[0]
            started = time.monotonic()
            # no key fails at once (a mechanism mismatch), the wrong one at the timeout
            with pytest.raises((tw.WireTimeoutError, tw.AuthenticationError)):
                tw.Sender.connect(rx.address, transport="tcp", timeout=0.3, curve_server_key=key)
            assert time.monotonic() - started < 5.0


def test_a_tcp_write_interrupted_mid_frame_closes_the_connection(children: Children) -> None:
    """Ctrl-C while a large tcp write is part way onto the wire (the receiver stopped): the frame
    can never be finished, so the connection is closed. Were it left open, the next write's bytes
    would finish the interrupted payload, and the receiver would complete a message made of two
    (found in review: the GPU path closed it, the host path did not)."""
    import _thread

    here, there = children.pipe()
    proc = children.start(run_receiver, there, [("a", BIG, "float32")])
    assert here.poll(30)
    address = here.recv()["address"]
    tx = tw.Sender.connect(address, transport="tcp", timeout=None, heartbeat=None)
    # made before the interrupt is set off: under load, making 64 MiB took long enough that the
    # interrupt came before the write had begun its frame (the suite in 3 processes, once)
    second, third = np.full(BIG, 2, np.float32), np.full(BIG, 3, np.float32)
    try:
        tx.write("a", np.full(BIG, 1, np.float32))  # lands whole in one of the two slots
        freeze(proc.pid)
        # a shell that starts pytest in the background leaves SIGINT ignored, and then
        # interrupt_main() does nothing: this test is about Ctrl-C, so it installs Python's own
        interrupt = threading.Timer(1.0, _thread.interrupt_main)
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        interrupt.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                # blocks: 64 MiB fit no buffer; the deadline only bounds a failure of the test
                tx.write("a", second, timeout=60)
        finally:
            interrupt.cancel()
            interrupt.join(5)
            signal.signal(signal.SIGINT, previous)
        os.kill(proc.pid, signal.SIGCONT)
        with pytest.raises(tw.PeerLostError, match="interrupted part way"):
            tx.write("a", third, timeout=10)
        here.send(("a", 10))
        assert here.poll(30)
        assert here.recv() == ("ok", float(np.prod(BIG)))  # the first message, whole
        here.send(("a", 2))
        assert here.poll(30)
        reply = here.recv()
        assert reply[0] == "error", f"a message was completed from two frames: {reply}"
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        tx.close()


@pytest.mark.parametrize(
    "forge",
    [
        {"nbytes": 1 << 40},  # oversized length
        {"generation_delta": 1},  # a replayed or forged generation
        {"seq_delta": 5},  # out of order
        {"slot": 99},  # a slot that does not exist (rings have at most 8 unless asked)
        {"tensor_id": 999},  # a tensor never claimed
    ],
    ids=["oversized", "generation", "sequence", "slot", "tensor"],
)
def test_forged_headers_on_a_live_data_connection(forge: dict[str, int]) -> None:
    """An authenticated TCP peer that lies in a header is cut off before a byte reaches a slot;
    the slot keeps its contents and other senders keep going."""
    with tw.Receiver() as rx:
        rx.register("t", (256,), "float32")
        rx.register("other", (8,), "float32")
        with tw.Sender.connect(rx.address, transport="tcp", timeout=10) as tx:
            tx.write("t", np.full(256, 3, np.float32))
            view = rx.wait("t", timeout=5)
            rx.release("t")
            peer = tx._peers[rx.address]  # fault injection on the raw data connection
            entry = peer.entries["t"]
            header = wire.DataHeader(
                forge.get("tensor_id", entry.tensor_id),
                forge.get("slot", 0),
                peer.generation + forge.get("generation_delta", 0),
                2 + forge.get("seq_delta", 0),
                forge.get("nbytes", 1024),
                None,
            )
            sock = peer.channel._sock
            sock.sendall(wire.encode_data_header(header) + b"\x7f" * 1024)
            sock.settimeout(10)
            with contextlib.suppress(ConnectionResetError):
                while sock.recv(4096):  # the receiver hangs up
                    pass
            assert np.all(view == 3)  # the slot is untouched
            del view
            with pytest.raises(tw.PeerLostError, match="protocol error"):
                rx.wait("t", timeout=5)  # the cheat is reported, never a message
            with pytest.raises(tw.WireTimeoutError):
                rx.wait("t", timeout=0.2)
        _healthy(rx, "tcp")


@pytest.mark.parametrize("transport", ["tcp", "grpc", "grpc-stream", "nixl"])
def test_a_large_write_to_a_frozen_receiver_ends_by_its_deadline(
    transport: str, children: Children
) -> None:
    """64 MiB do not fit in any socket buffer: a write to a SIGSTOPped receiver must still end by
    its timeout (or by the heartbeat's verdict), and (tcp, nixl) close() from another thread must
    not wait behind a write that has no deadline and no heartbeat to end it."""
    here, there = children.pipe()
    proc = children.start(run_receiver, there, [("a", BIG, "float32"), ("b", BIG, "float32")])
    assert here.poll(30)
    address = here.recv()["address"]
    payload = np.ones(BIG, np.float32)
    timed = tw.Sender.connect(address, transport=transport, timeout=30, heartbeat=0.5)
    unbounded = tw.Sender.connect(address, transport=transport, timeout=None, heartbeat=None)
    try:
        timed.write("a", payload)  # both tensors claimed while the receiver still answers
        unbounded.write("b", payload)
        freeze(proc.pid)
        start = time.monotonic()
        with pytest.raises((tw.WireTimeoutError, tw.PeerLostError)):
            # A one-sided write (nixl) lands in a stopped process; the ring's two slots are
            # then full, so the third write waits for a credit at the latest.
            for _ in range(3):
                timed.write("a", payload, timeout=2)
        assert time.monotonic() - start < 10, "a write outlived its deadline"

        if transport.startswith("grpc"):
            # grpcio's own Channel.close() can wait for a call stuck in flow control towards a
            # stopped peer (RELIABILITY.md, limits): the baselines are measured, not hardened.
            return

        def blocked_write() -> None:
            for _ in range(3):  # blocks on the socket, or on the credit of the third
                unbounded.write("b", payload)

        errors = _close_ends(blocked_write, unbounded.close, within=8)
        assert errors and isinstance(errors[0], tw.TensorWireError), errors
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        timed.close()
        unbounded.close()


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_write_of_a_tensor_not_yet_known_keeps_to_its_own_timeout(
    transport: str, children: Children, how: str
) -> None:
    """A write of a tensor the sender has not seen yet fetches the receiver's address book
    first: a receiver killed meanwhile (on this host) is a PeerLostError at once, one frozen a
    WireTimeoutError at the write's own timeout (1 s). Before, the lookup waited out the
    sender's timeout (30 s here) whatever the write's, and a dead receiver's loss read as a
    timeout: a parameter server whose worker died as the job formed took its connect timeout
    (120 s) to say that it could not be told."""
    here, there = children.pipe()
    proc = children.start(run_receiver, there, [("a", (4,), "float32")])
    assert here.poll(30)
    address = here.recv()["address"]
    tx = tw.Sender.connect(address, transport=transport, timeout=30)
    try:
        tx.write("a", np.ones(4, np.float32))
        if how == "killed":
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
        else:
            freeze(proc.pid)
        start = time.monotonic()
        expected = tw.PeerLostError if how == "killed" else tw.WireTimeoutError
        with pytest.raises(expected):
            tx.write("b", np.ones(4, np.float32), timeout=1)
        assert time.monotonic() - start < 5, "the lookup outlived the write's timeout"
    finally:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
        tx.close()


@pytest.mark.parametrize(
    "lie", ["no header", "half a header", "payload short", "payload long", "shape words cut"]
)
def test_a_grpc_stream_message_in_one_call_that_lies_about_its_length_is_refused(
    lie: str,
) -> None:
    """grpc-stream sends a message of up to ONE_CALL_BYTES as one call of raw bytes (token,
    header, payload): one whose bytes do not match its header (cut inside the header, or
    inside a dynamic tensor's shape words, or a payload shorter or longer than the header
    says) is refused, ends the session, and completes no slot; the receiver serves the next
    sender. The session's real token is used, so only the framing is wrong."""
    grpc = pytest.importorskip("grpc")
    from tensorwire.transports.grpc import ONE_CALL_BYTES

    with tw.Receiver() as rx:
        rx.register("t", (32,), "uint8")
        rx.register("d", (None,), "uint8", max_bytes=32)
        with tw.Sender.connect(rx.address, transport="grpc-stream", timeout=10) as tx:
            tx.write("t", np.full(32, 1, np.uint8))  # a real message first, taken
            assert int(rx.wait("t", timeout=10)[0]) == 1
            rx.release("t")
            peer = tx._peers[rx.address]
            channel = peer.channel
            name = "d" if lie == "shape words cut" else "t"
            tid = peer.entries[name].tensor_id
            shape = (32,) if name == "d" else None
            header = wire.encode_data_header(wire.DataHeader(tid, 0, peer.generation, 2, 32, shape))
            request = {
                "no header": channel.token,
                "half a header": channel.token + header[: len(header) // 2],
                "payload short": channel.token + header + bytes(16),
                "payload long": channel.token + header + bytes(48),
                "shape words cut": channel.token + header[:-4],
            }[lie]
            assert len(request) <= ONE_CALL_BYTES
            with pytest.raises(grpc.RpcError) as refused:
                channel.one_call(request, timeout=10)
            assert refused.value.code() in (
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.FAILED_PRECONDITION,
            ), refused.value
            for each in ("t", "d"):
                assert rx.pending(each) == 0
                for _ in range(2):  # the session's loss, where it was dropped, and no message
                    try:
                        got = rx.wait(each, timeout=0.2)
                    except tw.WireTimeoutError:
                        break
                    except tw.PeerLostError:
                        assert lie not in ("no header", "half a header")  # (token unread)
                        continue
                    raise AssertionError(f"a message of {each!r} landed: {got}")
        with tw.Sender.connect(rx.address, transport="grpc-stream", timeout=10) as tx:
            tx.write("t", np.full(32, 5, np.uint8))
            tx.write("d", np.full(7, 6, np.uint8))
            assert rx.wait("t", timeout=10).tolist() == [5] * 32
            assert rx.wait("d", timeout=10).tolist() == [6] * 7


def test_a_grpc_stream_writer_stalled_mid_message_does_not_hold_its_tensor_once_dropped() -> None:
    """A `grpc-stream` sender stops in the middle of a message (its call has sent the header
    and a first chunk, and no more: the process frozen, or its network stalled) and is silent
    past the receiver's heartbeat timeout: the receiver drops it, and a new sender's claim of
    the tensor succeeds while the stalled call is still open; none of the stalled message
    lands. Before, the receiver's handler thread waited for the rest of that stream, its write
    in flight fenced the tensor, and the new sender's claims were refused until the stalled one
    ran again (`bench soak --freeze-every`: 9 of 32 frozen grpc-stream senders held their
    tensors until resumed, 3-7 s there)."""
    from tensorwire.transports.grpc import CHUNK

    stall = threading.Event()
    ended: list[BaseException | None] = []
    size = 4 * CHUNK
    with tw.Receiver(heartbeat_timeout=1.0) as rx:
        rx.register("t", (size,), "uint8")
        stalled = tw.Sender.connect(rx.address, transport="grpc-stream", timeout=10, heartbeat=None)
        try:
            stalled.write("t", np.full(size, 1, np.uint8))  # it claims the tensor
            assert int(rx.wait("t", timeout=10)[0]) == 1
            rx.release("t")
            peer = stalled._peers[rx.address]  # fault injection: a call that stops midway
            channel = peer.channel
            header = wire.DataHeader(peer.entries["t"].tensor_id, 0, peer.generation, 2, size, None)

            def chunks() -> Any:
                yield channel.token + wire.encode_data_header(header)
                yield b"\x02" * CHUNK
                stall.wait(30)  # (bounded) the rest never comes while the test runs

            def call() -> None:
                try:
                    channel.call(channel.stream, chunks(), 30)
                    ended.append(None)
                except BaseException as exc:
                    ended.append(exc)

            caller = threading.Thread(target=call, daemon=True)
            caller.start()
            with pytest.raises(tw.PeerLostError):  # dropped: silent past the timeout
                rx.wait("t", timeout=10)
            began = time.monotonic()
            with tw.Sender.connect(rx.address, transport="grpc-stream", timeout=10) as tx:
                tx.write("t", np.full(size, 3, np.uint8), timeout=15)
                took = time.monotonic() - began
                view = rx.wait("t", timeout=10)
                assert np.all(view == 3)  # the new sender's, whole; nothing of the stalled one
                rx.release("t")
            assert took < 8, f"the new sender's claim took {took:.1f} s"
            assert not stall.is_set()  # it was taken while the stalled call was open
        finally:
            stall.set()
            stalled.close()
        caller.join(30)
    assert ended and isinstance(ended[0], tw.TensorWireError), ended
