"""``python -m tensorwire.bench.nixl_fence``: can a receiver stop a `nixl` writer it has dropped
from writing into its memory?

Why it exists: a `nixl` writer reads the receiver's notifications (a credit, or that its session
ended) before each RDMA WRITE. One stalled between that read and the WRITE (SIGSTOP, a long pause,
a network that comes back) posts the WRITE once it runs again, into slots the receiver may have
handed to another writer meanwhile. A fence in place would have to be one the transport itself
enforces: the receiver closing the writer's connection, as tensorwire does when it drops a
session (``remove_remote_agent``), or deregistering the memory the writer targets. This probe
asks UCX, over the transports it is given, whether either stops such a WRITE; where neither does
(``tcp``; on one host UCX's cross-memory attach writes by pid), tensorwire moves the tensor's
ring away from the dropped writer instead (design.md, section 4).

What it does, for each measure (nothing, ``remove_remote_agent``, ``deregister_memory``): a
receiving agent registers a buffer; a writer process loads its metadata, WRITEs 1s into it
(which must land: the probe checks that it can see a WRITE at all), and waits. The receiver takes
the measure, zeroes its buffer and lets the writer post a second WRITE of 2s, as a dropped writer
resumed would. It then reports whether the 2s landed, and what the writer's transfer said.

Set ``--tls`` to the UCX transports between the hosts you run on (``tcp``; ``rc`` on an
InfiniBand fabric, with ``--net-devices``) to learn what your fabric fences. Only NIXL's public
API, through :func:`tensorwire.rdma.create_agent`; no tensorwire data path. Bounded: every wait.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from tensorwire import NixlOptions, TensorWireError, rdma

MEASURES = ("nothing", "remove_remote_agent", "deregister_memory")
#: how long a WRITE may take before the probe calls it stuck, and any wait for the other process
WAIT = 15.0


def _name(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _options(tls: str | None, net_devices: str | None) -> NixlOptions:
    return NixlOptions(tls=tls, net_devices=net_devices)


def _writer(conn: Connection, tls: str | None, net_devices: str | None, size: int) -> None:
    """WRITE 1s into the receiver's buffer, then, when told, 2s; report each transfer's state."""
    agent: Any = rdma.create_agent("writer", _options(tls, net_devices), True)
    metadata, address = conn.recv()
    src = np.ones(size, np.uint8)
    agent.register_memory([(src.ctypes.data, size, 0, "")], "DRAM")
    remote = _name(agent.add_remote_agent(metadata))
    conn.send(agent.get_agent_metadata())
    local = agent.get_xfer_descs([(src.ctypes.data, size, 0)], "DRAM")
    far = agent.get_xfer_descs([(address, size, 0)], "DRAM")

    def write() -> str:
        try:
            request = agent.initialize_xfer("WRITE", local, far, remote)
            state = str(agent.transfer(request))
            give_up = time.monotonic() + WAIT
            while state == "PROC" and time.monotonic() < give_up:
                state = str(agent.check_xfer_state(request))
            return "stuck" if state == "PROC" else state
        except Exception as exc:  # NIXL raises its own types from C++
            return f"raised {type(exc).__name__}"

    conn.send(write())
    if conn.poll(WAIT * 2) and conn.recv() == "go":
        src[:] = 2
        conn.send(write())


def _progress_until(agent: Any, conn: Connection, seconds: float) -> Any:
    """Progress ``agent`` (a WRITE over tcp needs the receiver's progress to land) until ``conn``
    has something or ``seconds`` pass; what came, or None."""
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        # an error: the writer's connection is gone, nothing more to progress for it
        with contextlib.suppress(Exception):
            agent.get_new_notifs()
        if conn.poll(0.001):
            return conn.recv()
    return None


def probe(measure: str, tls: str | None, net_devices: str | None, size: int) -> tuple[str, str]:
    """One round: (what the buffer holds after the dropped writer's WRITE, the writer's state)."""
    agent: Any = rdma.create_agent("receiver", _options(tls, net_devices), True)
    buffer = np.zeros(size, np.uint8)
    registered = agent.register_memory([(buffer.ctypes.data, size, 0, "")], "DRAM")
    here, there = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(
        target=_writer, args=(there, tls, net_devices, size), daemon=True
    )
    proc.start()
    try:
        here.send((agent.get_agent_metadata(), buffer.ctypes.data))
        writer_metadata = _progress_until(agent, here, WAIT * 2)
        if writer_metadata is None:
            return "no writer", "-"
        writer = _name(agent.add_remote_agent(writer_metadata))
        agent.send_notif(writer, b"credit")  # as a receiver does: it talks back to its writers
        first = _progress_until(agent, here, WAIT * 2)
        if first != "DONE" or not (buffer == 1).all():
            return "first write did not land", str(first)
        if measure == "remove_remote_agent":
            agent.remove_remote_agent(writer)
        elif measure == "deregister_memory":
            agent.deregister_memory(registered)
        _progress_until(agent, here, 0.5)  # whatever the measure sends, let it go out
        buffer[:] = 0
        here.send("go")
        state = _progress_until(agent, here, WAIT * 2)
        _progress_until(agent, here, 0.5)  # bytes still on their way over tcp
        if (buffer == 2).all():
            landed = "landed"
        elif (buffer == 0).all():
            landed = "did not land"
        else:
            landed = f"landed in part ({int((buffer == 2).sum())} of {size} bytes)"
        return landed, str(state)
    finally:
        proc.join(WAIT)
        if proc.is_alive():
            proc.kill()
            proc.join(WAIT)
        del agent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensorwire.bench.nixl_fence",
        description="Whether a NIXL receiver can stop a writer it dropped from writing into its "
        "memory: by removing the writer's agent (closing its connection) or deregistering the "
        "memory. Exit status 0 when the probe could see a WRITE at all.",
    )
    parser.add_argument(
        "--tls", help="UCX_TLS at both ends (tcp; rc on InfiniBand); unset: UCX's choice"
    )
    parser.add_argument(
        "--net-devices", help="UCX_NET_DEVICES (default: lo: both ends are on this host)"
    )
    parser.add_argument("--size", type=int, default=1 << 20, help="bytes per WRITE (default 1 MiB)")
    parser.add_argument("--measure", choices=MEASURES, action="append", help="default: all")
    args = parser.parse_args(argv)
    if args.size < 1:
        parser.error(f"--size must be at least 1, got {args.size}")
    if not rdma.available():
        print("NIXL is not installed here: pip install nixl-cu12 --no-deps", file=sys.stderr)
        return 2
    where = f"UCX_TLS={args.tls}" if args.tls else "UCX's own transports"
    ok = True
    for measure in args.measure or MEASURES:
        try:
            landed, state = probe(measure, args.tls, args.net_devices, args.size)
        except TensorWireError as exc:
            print(f"{where}: {exc}", file=sys.stderr)
            return 2
        ok = ok and landed not in ("no writer", "first write did not land")
        after = "with nothing done" if measure == "nothing" else f"after {measure}"
        print(f"{where}, {after}: the dropped writer's WRITE {landed} (its transfer: {state})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
