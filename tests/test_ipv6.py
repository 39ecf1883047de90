"""IPv6: receivers, senders and the daemons on IPv6 addresses (``tcp://[::1]:PORT``), on
loopback. Skipped, with the reason, where this host has no IPv6 loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorwire as tw
from tensorwire.endpoint import (
    host_port,
    is_ipv6_endpoint,
    is_wildcard_host,
    loopback_for,
    socket_host,
    split_endpoint,
    tcp_endpoint,
)

from .conftest import GRPC_INSTALLED, NIXL_INSTALLED, free_port, needs_ipv6
from .jobs import Processes


def test_ipv6_endpoints_are_read_and_written_with_brackets() -> None:
    assert split_endpoint("tcp://[::1]:5555") == ("::1", 5555)
    assert split_endpoint("tcp://[fd00::2]:0") == ("fd00::2", 0)
    assert split_endpoint("tcp://::1:5555") is None  # unbracketed: not an address
    assert is_ipv6_endpoint("tcp://[::]:0") and not is_ipv6_endpoint("tcp://127.0.0.1:1")
    assert not is_ipv6_endpoint("tcp://localhost:1")  # a name: resolved as before, IPv4 first
    assert host_port("::1", 7) == "[::1]:7" and host_port("10.0.0.1", 7) == "10.0.0.1:7"
    assert tcp_endpoint("fd00::2", 80) == "tcp://[fd00::2]:80"


def test_the_hosts_that_mean_every_interface_are_told_in_one_place() -> None:
    """Five places each listed them, each a slightly different set (the worker's advertised
    address took an empty host for a reachable one)."""
    for host in ("*", "0.0.0.0", "::", "[::]", "", None):
        assert is_wildcard_host(host), host
    for host in ("127.0.0.1", "::1", "[::1]", "localhost", "10.0.0.2", "0.0.0.1"):
        assert not is_wildcard_host(host), host
    assert socket_host("*") == "0.0.0.0" and socket_host("::") == "::"
    assert loopback_for("::") == "::1" and loopback_for("[::]") == "::1"
    assert loopback_for("0.0.0.0") == "127.0.0.1" and loopback_for("") == "127.0.0.1"


@needs_ipv6
@pytest.mark.parametrize("transport", ["tcp", "grpc", "grpc-stream", "nixl", "shm"])
def test_a_receiver_on_ipv6_loopback_takes_every_transport(transport: str) -> None:
    """Bound to ``tcp://[::1]:0``, a receiver publishes an IPv6 address; a sender reaches it
    over every transport, and the messages land byte for byte. Before, the receiver could not
    start: its tcp data port was bound as IPv4 ("Address family for hostname not supported")."""
    with tw.Receiver(bind="tcp://[::1]:0") as rx:
        assert rx.address.startswith("tcp://[::1]:"), rx.address
        rx.register("t", (256,), "int64")
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
            for k in range(20):
                tx.write("t", np.full(256, k, np.int64))
                got = rx.wait("t", timeout=10)
                assert got[0] == got[-1] == k
                rx.release("t")


@needs_ipv6
@pytest.mark.parametrize("transport", ["tcp", "grpc", "nixl"])
def test_a_receiver_bound_to_every_ipv6_address_takes_ipv4_too(transport: str) -> None:
    """``tcp://[::]:PORT`` listens on IPv4 as well (as ``::`` does on Linux): its control plane
    and its data port, reached through ``127.0.0.1`` as through ``::1``."""
    with tw.Receiver(bind="tcp://[::]:0", insecure=True) as rx:
        rx.register("t", (16,), "float32")
        port = split_endpoint(rx.address)[1]  # type: ignore[index]
        for host in ("::1", "127.0.0.1"):
            with tw.Sender.connect(tcp_endpoint(host, port), transport=transport, timeout=10) as tx:
                tx.write("t", np.arange(16, dtype=np.float32))
                assert rx.wait("t", timeout=10).tolist() == list(range(16))
                rx.release("t")


@needs_ipv6
def test_a_job_trains_over_ipv6(tmp_path: Path) -> None:
    """A parameter server bound to ``tcp://[::]:PORT`` and two workers reaching it at
    ``[::1]``, one bound to ``[::]`` (the address it tells the server is found as on IPv4),
    the other to ``[::1]``: the job trains, and every daemon exits 0."""
    address = f"tcp://[::1]:{free_port()}"
    bind = address.replace("[::1]", "[::]")
    env = {"TENSORWIRE_SECRET": "ipv6-secret"}
    procs = Processes(tmp_path, env)
    common = ["--workers", "2", "--transport", "tcp", "--no-progress"]
    cli = [sys.executable, "-m", "tensorwire"]
    try:
        ps = ["ps", "--bind", bind, "--steps", "100", "--metrics-port", "0"]
        procs.start([*cli, *ps, *common], log="ps")
        for rank, worker_bind in ((0, "tcp://[::]:0"), (1, "tcp://[::1]:0")):
            worker = ["worker", "--servers", address, "--rank", str(rank), "--bind", worker_bind]
            procs.start([*cli, *worker, *common], log=f"w{rank}")
        assert procs.wait(120) == [0, 0, 0], procs.log("ps")
        assert "done at step 100" in procs.log("ps")
        assert "metrics at http://[::1]:" in procs.log("ps")
        for rank in (0, 1):
            assert "joined 1 server(s)" in procs.log(f"w{rank}")
            assert f"worker {rank} joined from tcp://[::1]:" in procs.log("ps")
    finally:
        procs.kill()


def test_a_name_is_not_taken_for_an_ipv6_address() -> None:
    """``localhost`` is reached as before (the control plane does not ask ZeroMQ for IPv6, which
    would try ``::1`` first and wait on a receiver listening on IPv4 only)."""
    with tw.Receiver(bind="tcp://127.0.0.1:0") as rx:
        rx.register("t", (4,), "float32")
        port = split_endpoint(rx.address)[1]  # type: ignore[index]
        with tw.Sender.connect(f"tcp://localhost:{port}", transport="tcp", timeout=10) as tx:
            tx.write("t", np.ones(4, np.float32))
            assert rx.wait("t", timeout=10).tolist() == [1.0] * 4


def test_an_ipv6_address_without_brackets_is_refused_with_the_form_to_use() -> None:
    """``tcp://::1:5555`` cannot be split into host and port: the receiver, the sender and the
    CLI refuse it, saying an IPv6 address goes in brackets."""
    hint = r"an IPv6 address goes in brackets: tcp://\[::1\]:5555"
    with pytest.raises(tw.TensorWireError, match=hint):
        tw.Receiver(bind="tcp://::1:0")
    with pytest.raises(tw.TensorWireError, match=hint):
        tw.Sender.connect("tcp://fd00::2:5555", timeout=1)
    with pytest.raises(tw.TensorWireError) as err:
        tw.Receiver(bind="tcp://nope")
    assert "brackets" not in str(err.value)  # only where it looks like IPv6
    out = subprocess.run(
        [sys.executable, "-m", "tensorwire", "ping", "tcp://::1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "goes in brackets" in out.stderr, out.stderr


_OVER_A_NAME = """
import sys, numpy as np, tensorwire as tw
from tensorwire.endpoint import local_address_towards
name = sys.argv[1]
print("towards", local_address_towards(name))
with tw.Receiver(f"tcp://{name}:0", insecure=True) as bound:
    print("bound", bound.address)
with tw.Receiver("tcp://[::1]:0") as rx:
    rx.register("t", (1,), "int64")
    port = rx.address.rsplit(":", 1)[1]
    for k, transport in enumerate(sys.argv[2].split(",")):
        with tw.Sender.connect(f"tcp://{name}:{port}", transport=transport, timeout=10) as tx:
            tx.write("t", np.array([k]))
            print(transport, int(rx.wait("t", timeout=10)[0]))
            rx.release("t")
"""


def test_a_name_that_resolves_to_ipv6_alone_is_reached_over_ipv6() -> None:
    """An IPv6-only cluster's DNS gives its names IPv6 addresses alone. Before, such a name
    was never reached (ZeroMQ is asked for IPv6 only for IPv6 addresses, and the tcp data
    port was bound as IPv4): every connect timed out. Here a network namespace's /etc/hosts
    gives the name ::1 alone; a receiver binds it, senders of every transport reach one on
    ::1 by it, and a worker's advertised address towards it is ::1."""
    from .netns import namespaces

    name = "v6only.tensorwire.test"
    # every transport installed here (the optional ones are not, in a bare pip install)
    transports = [
        t
        for t in ("tcp", "grpc", "grpc-stream", "shm", "nixl")
        if (t != "nixl" or NIXL_INSTALLED) and (not t.startswith("grpc") or GRPC_INSTALLED)
    ]
    with namespaces("twv6n", ["h"], [], hosts=f"::1 {name}\n127.0.0.1 localhost\n") as ns:
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns["h"],
                sys.executable,
                "-c",
                _OVER_A_NAME,
                name,
                ",".join(transports),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0] == "towards ::1" and lines[1].startswith("bound tcp://[::1]:"), out.stdout
    said = [f"{t} {k}" for k, t in enumerate(transports)]
    assert lines[2 : 2 + len(said)] == said, out.stdout
