"""Peer processes for the tests: real senders and receivers in their own interpreters.

Every function here is a ``multiprocessing`` (spawn) target or a helper both sides share, so the
parent can rebuild exactly the arrays a child sent and compare them byte for byte.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import tensorwire as tw
from tensorwire.dtypes import canonical_dtype, ml_dtypes_by_name


def make_array(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    """A deterministic array that exercises every bit pattern class of ``dtype``."""
    rng = np.random.default_rng(seed)
    dt = canonical_dtype(dtype)  # numpy's names, and bfloat16/float8 (ml_dtypes)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    if dt.kind == "f" or dt.name in ml_dtypes_by_name():
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    raise ValueError(dt)


def send_plan(
    address: str,
    transport: str,
    plan: list[tuple[Any, ...]],
    secret: str | None = None,
    peers: list[str] | None = None,
) -> None:
    """Write each ``(name, dtype, shape, seed[, peer])`` of ``plan`` in order, then say goodbye."""
    with tw.Sender.connect(address, transport=transport, secret=secret, timeout=30) as tx:
        for extra in peers or []:
            tx.add_peer(extra)
        for name, dtype, shape, seed, *peer in plan:
            tx.write(name, make_array(dtype, tuple(shape), seed), peer=peer[0] if peer else None)


def send_uniform(address: str, transport: str, name: str, count: int, ready: Any = None) -> None:
    """Write ``count`` messages whose every element equals the message number (torn-write probe)."""
    with tw.Sender.connect(address, transport=transport, timeout=30) as tx:
        spec = tx.spec(name)
        arr = np.empty(spec.static_shape, dtype=spec.dtype)
        if ready is not None:
            ready.send("go")
        for k in range(1, count + 1):
            arr.fill(k)
            tx.write(name, arr)


def die_mid_write(address: str, transport: str, name: str, ready: Any) -> None:
    """Start a message of ``name``, move half its bytes into the receiver, then SIGKILL self."""
    tx = tw.Sender.connect(address, transport=transport, timeout=30)
    spec = tx.spec(name)
    shape = spec.static_shape
    if transport == "shm":
        with tx.buffer(name) as out:
            flat = out.reshape(-1)
            flat[: flat.size // 2] = 7  # straight into the receiver's slot
            ready.send("half")
            os.kill(os.getpid(), signal.SIGKILL)
    elif transport == "nixl":
        # One-sided by hand: RDMA half of the payload into the slot, with no notification.
        peer = tx._peers[address]
        writer = peer.writer(peer.entries[name])
        channel = peer.channel
        half = np.full(shape, 7, dtype=spec.dtype).reshape(-1).view(np.uint8)
        half = half[: half.size // 2]
        channel.source(half)  # registered, as every source must be
        agent = channel._agent
        request = agent.initialize_xfer(
            "WRITE",
            agent.get_xfer_descs([(half.ctypes.data, half.size, 0)], "DRAM"),
            agent.get_xfer_descs(
                [(writer._addresses[writer._slots.choose(0)], half.size, 0)], "DRAM"
            ),
            channel._remote,
        )
        state = agent.transfer(request)
        for _ in range(1_000_000):  # bounded: a local 32 MiB write completes in milliseconds
            if state != "PROC":
                break
            state = agent.check_xfer_state(request)
        assert state == "DONE", state
        ready.send("half")
        os.kill(os.getpid(), signal.SIGKILL)
    elif transport == "grpc":
        import threading

        # A unary call lands only once complete: die while the 64 MiB message is in flight.
        arr = np.full(shape, 7, dtype=spec.dtype)
        threading.Thread(target=tx.write, args=(name, arr), daemon=True).start()
        time.sleep(0.01)
        ready.send("half")
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        # Speak the data plane by hand: a valid header, then only half of the payload.
        from tensorwire import wire

        peer = tx._peers[address]
        writer = peer.writer(peer.entries[name])
        payload = np.full(shape, 7, dtype=spec.dtype).reshape(-1).view(np.uint8)
        header = wire.encode_data_header(
            wire.DataHeader(
                peer.entries[name].tensor_id,
                0,  # a fresh ring: slot 0 is free (grpc-stream lets the receiver pick anyway)
                peer.generation,
                writer.next_seq,
                payload.size,
                None,
            )
        )
        if transport == "grpc-stream":

            def half_then_die():  # type: ignore[no-untyped-def]
                yield peer.channel.token + header
                chunk = 1 << 20
                for off in range(0, payload.size // 2, chunk):
                    yield payload[off : off + chunk].tobytes()
                time.sleep(0.2)  # let the chunks reach the receiver
                ready.send("half")
                os.kill(os.getpid(), signal.SIGKILL)

            peer.channel.stream(half_then_die(), timeout=60)
        else:
            sock = peer.channel._sock  # fault injection: the raw data connection
            sock.setblocking(True)  # the channel polls a non-blocking socket; we just push
            sock.sendall(header + payload[: payload.size // 2].tobytes())
            ready.send("half")
            os.kill(os.getpid(), signal.SIGKILL)


def run_receiver(
    conn: Any,
    specs: list[tuple[Any, ...]],
    secret: str | None = None,
    bind: str = "tcp://127.0.0.1:0",
    options: dict[str, Any] | None = None,
) -> None:
    """A receiver in its own process (made with ``options`` besides): registers ``specs``,
    reports its address, then consumes messages on request until told to stop (or killed)."""
    with tw.Receiver(bind, secret=secret, **(options or {})) as rx:
        for name, shape, dtype in specs:
            rx.register(name, shape, dtype)
        conn.send({"address": rx.address, "regions": [r.name for r in rx._table.regions if r.name]})
        while True:
            if not conn.poll(0.05):
                continue
            cmd = conn.recv()
            if cmd == "stop":
                return
            name, timeout = cmd
            try:
                view = rx.wait(name, timeout=timeout)
                digest = float(np.asarray(view, dtype=np.float64).sum())
                rx.release(name)
                conn.send(("ok", digest))
            except tw.TensorWireError as exc:
                conn.send(("error", type(exc).__name__))


def run_receiver_slow_to_start_nixl(
    conn: Any, specs: list[tuple[Any, ...]], seconds: float
) -> None:
    """:func:`run_receiver`, whose NIXL agents each take ``seconds`` longer to create, as on a
    GPU host (over a second there). The wait lets go of the GIL, which NIXL's own creation
    holds at times (at most 63-69 ms at a stretch, measured in a thread's ticks on 2026-12-02),
    so that only a control thread held up by the start itself misses heartbeats."""
    from tensorwire.transports import nixl

    real = nixl.create_agent

    def slow(*args: Any) -> Any:
        time.sleep(seconds)
        return real(*args)

    nixl.create_agent = slow  # type: ignore[assignment]
    run_receiver(conn, specs)


def receiver_lost_in_set_up(conn: Any, transport: str, how: str) -> None:
    """A receiver that dies (``how="kill"``) or freezes (``"stop"``) at the first step of a
    sender's set-up that waits for it over ``transport``: the data plane's admission (``tcp``,
    ``grpc``, ``grpc-stream``), NIXL's ping (``nixl``), the address book (``shm``, which has
    no data plane to wait for)."""
    from tensorwire.receiver import landing, sessions
    from tensorwire.transports import nixl

    def lose(*_args: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        # the signal stops or ends the process as one of its threads takes it, not always this
        # one at once: this thread must not go on to answer meanwhile
        time.sleep(120)

    if transport == "nixl":
        nixl.NixlDataServer._pong = lose
    elif transport == "shm":
        sessions.SessionHandler._address_book = lose
    else:
        landing.Landing.admit = lose
    with tw.Receiver(nixl=transport == "nixl") as rx:
        rx.register("t", (4,), "float32")
        conn.send(rx.address)
        time.sleep(120)  # bounded: the test kills this process long before


def echo_over(conn: Any, transport: str, count: int) -> None:
    """A receiver of "ping" that answers each ping with the same bytes as "pong" to the test's
    receiver; it connects to the test while the test connects to it."""
    with tw.Receiver() as rx:
        rx.register("ping", (1024,), "float32")
        conn.send(rx.address)
        with tw.Sender.connect(conn.recv(), transport=transport, timeout=30) as tx:
            for _ in range(count):
                got = np.array(rx.wait("ping", timeout=30))
                rx.release("ping")
                tx.write("pong", got)


def count_empty_messages(conn: Any, count: int) -> None:
    """A receiver of ``count`` empty messages of a dynamic tensor (a ring that holds them all):
    reports its address, and on "go" counts what arrives within 5 s, without releasing."""
    with tw.Receiver() as rx:
        rx.register("t", (None,), "uint8", max_bytes=64, ring=count)
        conn.send(rx.address)
        conn.recv()
        landed, deadline = 0, time.monotonic() + 5
        while landed < count and time.monotonic() < deadline:  # bounded by time and count
            with contextlib.suppress(tw.WireTimeoutError):
                rx.wait("t", timeout=0.2)
                landed += 1
        conn.send(landed)


def write_then_idle(
    address: str, transport: str, name: str | list[str], heartbeat: float, ready: Any
) -> None:
    """Claim ``name`` (or each of a list of names) with one write, then stay connected
    (heartbeating) until killed."""
    with tw.Sender.connect(address, transport=transport, timeout=30, heartbeat=heartbeat) as tx:
        for each in [name] if isinstance(name, str) else name:
            spec = tx.spec(each)
            tx.write(each, np.zeros(spec.static_shape, spec.dtype))
        ready.send("claimed")
        time.sleep(3600)


def ask_across_own_stop(address: str, conn: Any) -> None:
    """Over tcp, heartbeating every 0.5 s: write ``t`` once and say "ready"; at "go" ask for the
    address book again (a control request, 3 s timeout) and send how it went; at "write" send
    what ``lost()`` says of the receiver and how a second write of ``t`` went."""

    def outcome(call: Callable[[], object]) -> str:
        try:
            call()
            return "ok"
        except tw.TensorWireError as exc:
            return f"{type(exc).__name__}: {exc}"

    with tw.Sender.connect(address, transport="tcp", timeout=10, heartbeat=0.5) as tx:
        tx.write("t", np.full(4, 1, np.float32))
        conn.send("ready")
        assert conn.recv() == "go"
        conn.send(outcome(lambda: tx.refresh(timeout=3.0)))
        assert conn.recv() == "write"
        conn.send((tx.lost(), outcome(lambda: tx.write("t", np.full(4, 2, np.float32)))))


def write_after_own_stop(address: str, transport: str, conn: Any) -> None:
    """Heartbeating every 0.2 s: write ``t`` once and say "ready"; at "write" (after the
    parent has stopped and resumed this process) send what ``lost()`` says and how a second
    write of ``t`` went."""
    with tw.Sender.connect(address, transport=transport, timeout=10, heartbeat=0.2) as tx:
        tx.write("t", np.full(4, 1, np.float32))
        conn.send("ready")
        assert conn.poll(60) and conn.recv() == "write"
        try:
            tx.write("t", np.full(4, 2, np.float32))
            outcome = "ok"
        except tw.TensorWireError as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        conn.send((tx.lost(), outcome))


def write_on_request(address: str, transport: str, name: str, conn: Any) -> None:
    """Write ``name`` filled with ``k`` for each ``k`` received on ``conn``, answering ``k`` once
    written, until killed. Bounded: 100 requests, or 120 s without one."""
    with tw.Sender.connect(address, transport=transport, timeout=30, heartbeat=0.2) as tx:
        spec = tx.spec(name)
        for _ in range(100):
            if not conn.poll(120):
                return
            k = conn.recv()
            tx.write(name, np.full(spec.static_shape, k, spec.dtype))
            conn.send(k)


def write_numbered(
    address: str, transport: str, name: str, incarnation: int, acked: str, seconds: float
) -> None:
    """Write ``name`` in a loop, every element of message ``seq`` holding
    ``incarnation << 32 | seq``, and store how many writes have returned in the int64 of the
    file ``acked`` (mapped: the count survives a SIGKILL), until killed. Bounded: ``seconds``,
    then it exits 0."""
    count = np.memmap(acked, np.int64, "r+", shape=(1,))
    with tw.Sender.connect(address, transport=transport, timeout=30) as tx:
        spec = tx.spec(name)
        arr = np.empty(spec.static_shape, np.int64)
        end = time.monotonic() + seconds
        seq = 0
        while time.monotonic() < end:
            arr.fill(incarnation << 32 | seq)
            tx.write(name, arr)
            seq += 1
            count[0] = seq


def write_forever(address: str, transport: str, name: str, ready: Any) -> None:
    """Write ``name`` in a loop without heartbeats; exit 3 on PeerLostError (fenced), else 1.

    Bounded: at most 100,000 messages or 120 s."""
    code = 1
    with tw.Sender.connect(address, transport=transport, timeout=30, heartbeat=None) as tx:
        spec = tx.spec(name)
        arr = np.arange(np.prod(spec.static_shape), dtype=spec.dtype).reshape(spec.static_shape)
        ready.send("writing")
        end = time.monotonic() + 120
        try:
            for _ in range(100_000):
                if time.monotonic() > end:
                    break
                tx.write(name, arr, timeout=30)
        except tw.PeerLostError:
            code = 3
        except tw.TensorWireError:
            code = 2
    os._exit(code)


def hiding(*packages: str) -> str:
    """Source for a child interpreter in which ``packages`` cannot be imported, as on a machine
    without them; it then imports tensorwire as ``tw``."""
    return textwrap.dedent(
        f"""
        import sys

        class Hidden:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {packages!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}")
                return None

        sys.meta_path.insert(0, Hidden())
        import tensorwire as tw
        """
    )


def run_hiding(packages: tuple[str, ...], body: str, *args: str) -> list[str]:
    """Run ``body`` where ``packages`` cannot be imported; its stdout lines (exit 0 required)."""
    code = hiding(*packages) + textwrap.dedent(body)
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def run_conformance_hiding(packages: tuple[str, ...], selection: str) -> str:
    """Run the conformance tests matching ``selection`` (``-k``) in a child interpreter where
    ``packages`` cannot be imported; its pytest output (the run must pass)."""
    code = hiding(*packages) + textwrap.dedent(
        f"""
        import pytest
        sys.exit(pytest.main([
            "-q", "-p", "no:cacheprovider", "tests/test_conformance.py", "-k", {selection!r}, "-rs",
        ]))
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


# -- GPU peers (the gpu tests; cupy and torch are imported only here) ---------------------------


def on_source(array: np.ndarray[Any, Any], source: str) -> Any:
    """``array``'s bytes as ``source`` would hold them: ``numpy`` (host), ``cupy`` or ``torch``
    (on cuda:0), of the same dtype and shape."""
    if source == "numpy":
        return array
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if source == "cupy":
        import cupy as cp

        return cp.asarray(raw).view(array.dtype).reshape(array.shape)
    import torch

    flat = torch.from_numpy(raw.copy()).to("cuda:0")
    return flat.view(getattr(torch, array.dtype.name)).reshape(array.shape)


def send_plan_from(address: str, transport: str, plan: list[tuple[Any, ...]], source: str) -> None:
    """:func:`send_plan` with every array on ``source`` (numpy, cupy or torch CUDA)."""
    with tw.Sender.connect(address, transport=transport, timeout=60) as tx:
        for name, dtype, shape, seed in plan:
            tx.write(name, on_source(make_array(dtype, tuple(shape), seed), source))


def send_uniform_gpu(address: str, transport: str, name: str, ready: Any) -> None:
    """Write GPU messages whose every element equals the message number, until killed."""
    import cupy as cp

    with tw.Sender.connect(address, transport=transport, timeout=60) as tx:
        spec = tx.spec(name)
        arr = cp.empty(spec.static_shape, dtype=spec.dtype)
        ready.send("go")
        for k in range(1, 1_000_000):  # bounded; the test kills it long before
            arr.fill(k)
            tx.write(name, arr)


def send_rewritten_gpu_source(address: str, name: str, count: int) -> None:
    """Messages 1..``count`` of ``name`` (a GPU tensor over shm), message k all k: one cupy
    source refilled by a kernel before each write with no synchronisation between (a write of
    a large GPU source returns once its copy is queued), every fifth from host memory instead;
    then two produced in place by a kernel (count+1, count+2), and close at once."""
    import cupy as cp

    with tw.Sender.connect(address, transport="shm", timeout=60) as tx:
        spec = tx.spec(name)
        src = cp.empty(spec.static_shape, dtype=spec.dtype)
        for k in range(1, count + 1):
            if k % 5 == 0:
                tx.write(name, np.full(spec.static_shape, k, dtype=spec.dtype))
            else:
                src.fill(k)
                tx.write(name, src)
        for k in (count + 1, count + 2):
            with tx.buffer(name) as out:
                out.fill(k)


def send_gpu_from_threads(address: str, transport: str, names: list[str], count: int) -> None:
    """One sender, a thread per tensor of ``names`` (GPU tensors), each writing messages
    1..``count`` of its tensor, message k all k, from a cupy source of its own refilled before
    each write (on the thread's current stream, with no synchronisation between)."""
    import threading

    import cupy as cp

    failed: list[BaseException] = []
    with tw.Sender.connect(address, transport=transport, timeout=60) as tx:

        def stream_of(name: str) -> None:
            try:
                spec = tx.spec(name)
                src = cp.empty(spec.static_shape, dtype=spec.dtype)
                for k in range(1, count + 1):
                    src.fill(k)
                    tx.write(name, src, timeout=60)
            except BaseException as exc:  # (said by the parent: this process exits 1)
                failed.append(exc)

        threads = [threading.Thread(target=stream_of, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    if failed or any(t.is_alive() for t in threads):
        raise SystemExit(f"a writing thread failed or hung: {failed!r}")


def send_from_a_torch_side_stream(address: str, name: str, count: int) -> None:
    """Messages 1..``count`` of ``name`` (a float32 GPU tensor over shm), message k all k, from
    one torch tensor that a kernel on a torch stream of its own (not the default one) fills
    with k before each write and with -1 right after it, with no synchronisation between."""
    import torch

    with tw.Sender.connect(address, transport="shm", timeout=60) as tx:
        shape = tx.spec(name).static_shape
        src = torch.empty(shape, dtype=torch.float32, device="cuda")
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            for k in range(1, count + 1):
                src.fill_(k)
                tx.write(name, src)
                src.fill_(-1)  # must run after the copy that reads k


def run_gpu_receiver(conn: Any, name: str, shape: tuple[int, ...]) -> None:
    """A receiver with one GPU tensor, in a process of its own, until killed."""
    with tw.Receiver() as rx:
        rx.register(name, shape, "float32", device="cuda:0")
        conn.send(rx.address)
        time.sleep(600)


def send_batches(address: str, transport: str, plan: list[tuple[Any, ...]], rounds: int) -> None:
    """``rounds`` times, every ``(name, dtype, shape, seed)`` of ``plan`` in one write_many (the
    seed moved on by the round), checking the handles it returns."""
    with tw.Sender.connect(address, transport=transport, timeout=30) as tx:
        for r in range(rounds):
            items = [
                (name, make_array(dt, tuple(shape), seed + r)) for name, dt, shape, seed in plan
            ]
            handles = tx.write_many(items)
            assert [h.name for h in handles] == [name for name, *_ in plan]
            assert all(h.seq == r + 1 for h in handles), handles
            assert [h.nbytes for h in handles] == [a.nbytes for _, a in items]


def send_gpu_after_connecting(address: str, host_first: bool) -> None:
    """A sender that touches no GPU before it connects over nixl: with ``host_first``, it
    writes the host tensor "h" (all 1) first and waits for the GPU tensor "g" to be registered
    after that; then it writes three cupy messages to "g", message k all k."""
    with tw.Sender.connect(address, transport="nixl", timeout=60) as tx:
        if host_first:
            tx.write("h", np.ones(tx.spec("h").static_shape, dtype=np.float32))
            give_up = time.monotonic() + 30
            while True:  # bounded: the test registers "g" once "h" has landed
                try:
                    tx.spec("g")
                    break
                except tw.UnknownTensorError:
                    if time.monotonic() > give_up:
                        raise
                    time.sleep(0.05)
        import cupy as cp  # only now: the process has had no CUDA context until here

        spec = tx.spec("g")
        for k in range(1, 4):
            tx.write("g", cp.full(spec.static_shape, k, dtype=spec.dtype))
