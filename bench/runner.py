"""The driving side of a benchmark: ``tensorwire bench`` / ``tensorwire bench run``.

The runner is always the sender. It connects to a ``serve`` peer (a local child process, or another
host), writes into it with every transport and reference method, and times each method in the same
run, interleaved, so that the machine's drift hits all alike:

* throughput: pipelined one-way writes of ``count`` messages, the peer consuming (and releasing)
  each one; the clock stops when the peer reports the last one consumed;
* latency: a ping-pong of a small tensor, the peer echoing each ping back into the runner's own
  receiver; median and p99 of the round trips;
* batches (``batch=N``): beside each transport's single writes, the same transport writing ``N``
  tensors of the size with one ``write_many`` while the peer takes them with ``wait_all`` and
  ``release_many`` (the rows ``"shm x32"``...), at sizes up to :data:`BATCH_MAX_BYTES`; what the
  per-message cost of the batch calls is, against the same references.

References measured alongside: ``memcpy`` (a single-threaded ``np.copyto`` of the same bytes in
this process: the limit of any one-copy path), ``raw-tcp`` (a plain socket, ``sendall`` into
``recv_into`` one buffer: the limit of any TCP path), ``zmq`` (pyzmq ``send(copy=False)`` and
``recv`` plus a copy into a preallocated array: what a Python user would write by hand) and, where
the ``nixl`` transport runs, ``raw-nixl`` (NIXL's own API driven by hand, on buffers where the
tensors are: the limit of the ``nixl`` path; :mod:`.raw_nixl`); with ``copy_threads=N`` above 1,
``memcpy N threads`` (the same bytes in ``N`` equal parts copied at once, as the senders then copy
large ``shm`` writes; :mod:`.copy_threads`).

With ``device="cuda:N"`` the tensors live on that GPU at both ends (the runner writes cupy
arrays into GPU slots) and two GPU references join: ``d2d`` (a cupy device-to-device copy of the
same bytes, the limit of the ``shm`` path) and ``h2d-pinned`` (a copy from pinned host memory to
the GPU, the limit of any path through host memory), and, where torch sees the GPU,
``torch-queue``: what a PyTorch user does without tensorwire (:mod:`.torch_queue`).
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack
import numpy as np
import zmq

import tensorwire as tw
from tensorwire import cuda as tw_cuda
from tensorwire.endpoint import (
    endpoint_host,
    is_loopback_host,
    local_address_towards,
    reached_over_ipv6,
    split_endpoint,
    tcp_endpoint,
    zeromq_greeting_problem,
)
from tensorwire.layout import auto_depth

from .common import (
    BATCH_MAX_BYTES,
    MiB,
    batch_tensor_names,
    command_mac,
    machine_facts,
    raw_recv,
    tensor_name,
    tune_socket,
)
from .copy_threads import split_copy
from .gloo import RUNNER, Gloo
from .gloo import TIMEOUT as GLOO_TIMEOUT
from .gloo import available as gloo_available
from .raw_nixl import RawNixl
from .torch_queue import TorchQueue
from .torch_queue import available as torch_queue_available

TRANSPORTS = ["shm", "tcp", "nixl", "grpc", "grpc-stream"]
REFERENCES = ["memcpy", "zmq", "raw-tcp"]
#: measured beside the ``nixl`` transport, on host memory
RAW_NIXL = "raw-nixl"
GPU_REFERENCES = ["d2d", "h2d-pinned"]
#: measured beside the GPU references where torch sees the GPU
TORCH_QUEUE = "torch-queue"
#: measured with ``gloo=True`` where torch runs at both ends, on host memory: send and recv
#: each waited for, and isend and irecv pipelined (:mod:`.gloo`)
GLOO = "gloo"
GLOO_ISEND = "gloo-isend"
TARGET_BYTES = 256 * MiB
MIN_COUNT, MAX_COUNT = 4, 2000
#: a measurement lasts at least about this long where MAX_COUNT allows: 256 MiB moves through
#: GPU memory in a third of a millisecond, where the start and end handshakes of a measurement
#: (a command to the peer, its reply) would count as much as the transfer
MIN_SECONDS = 0.05


def count_for(size: int, seconds_each: float) -> int:
    """Messages per measurement: about TARGET_BYTES, or more where a warm-up measured each to
    take ``seconds_each`` (start and end included, so an over-estimate) and TARGET_BYTES would
    last less than MIN_SECONDS; within bounds."""
    count = TARGET_BYTES // size
    if seconds_each > 0:
        count = max(count, int(MIN_SECONDS / seconds_each))
    return max(MIN_COUNT, min(MAX_COUNT, count))


def batch_method(transport: str, batch: int) -> str:
    """The row of ``transport`` writing ``batch`` tensors per ``write_many``."""
    return f"{transport} x{batch}"


def base_method(method: str) -> str:
    """The transport (or reference) a row measures: ``"shm x32"`` -> ``"shm"``."""
    return method.split(" x", 1)[0]


class BenchError(tw.TensorWireError):
    """The benchmark peer refused or failed a command."""


#: How long the first command waits for the peer: a `bench serve` answers at once.
HELLO_TIMEOUT = 10.0


def _check_reachable(connect: str) -> None:
    """A BenchError at once where nothing at ``connect`` greets as ZeroMQ does (nothing
    listens, or another service): ZeroMQ would retry for ever, and the hello waited its whole
    timeout (before: 120 s, without a word)."""
    split = split_endpoint(connect)
    if split is None:
        raise BenchError(f"--connect must look like tcp://HOST:PORT, got {connect!r}")
    problem = zeromq_greeting_problem(split, HELLO_TIMEOUT)
    if problem is not None:
        raise BenchError(
            f"no benchmark peer at {connect}: {problem}; start `tensorwire bench serve --bind "
            "tcp://HOST:PORT` on the peer first"
        )


class Runner:
    def __init__(
        self,
        connect: str,
        transports: list[str],
        sizes: list[int],
        latency_bytes: int,
        ring: int | None = None,
        shm: bool | None = None,
        timeout: float = 120.0,
        optional: bool = False,
        secret: str | None = None,
        device: str = "cpu",
        batch: int = 0,
        copy_threads: int = 1,
        gloo: bool = False,
    ) -> None:
        """Connect to the peer at ``connect``. With ``optional``, a transport that cannot reach
        the peer (shm to another host) is skipped with a note instead of failing the run.
        ``device``: where the tensors live at both ends (``cpu`` or ``cuda:N``). ``shm``: as
        ``tw.Receiver``'s, for the receivers at both ends (False: private memory, which the
        ``shm`` transport cannot reach). ``batch``: also measure each transport writing that
        many tensors per ``write_many`` (0: not). ``copy_threads``: the senders' (threads per
        large ``shm`` copy); above 1 the reference :attr:`split_memcpy` is measured too.
        ``gloo``: also measure torch.distributed's gloo send and recv (:mod:`.gloo`), where
        torch runs at both ends (else a note says why not)."""
        self.host = endpoint_host(connect)
        self.timeout = timeout
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._req = self._ctx.socket(zmq.REQ)
        self._req.linger = 0
        self._req.ipv6 = reached_over_ipv6(self.host)
        self._req.connect(connect)
        self.senders: dict[str, tw.Sender] = {}
        self.pong_rx: tw.Receiver | None = None
        self._raw: socket.socket | None = None
        self._pair: zmq.Socket[bytes] | None = None
        self.raw_nixl: RawNixl | None = None
        self.gloo: Gloo | None = None
        self.notes: list[str] = []
        #: the reference copy in ``copy_threads`` parts at once ("" with one thread)
        self.split_memcpy = f"memcpy {copy_threads} threads" if copy_threads > 1 else ""
        self._copy_pool = ThreadPoolExecutor(copy_threads - 1) if copy_threads > 1 else None
        self._copy_threads = copy_threads
        self._secret = secret
        self._nonce, self._counter = b"", 0  # the server's, from our hello; our commands since
        self._greeted = False  # the peer answered our hello: it is owed a goodbye
        try:
            _check_reachable(connect)
            self._send("hello")
            hello = self._reply(
                HELLO_TIMEOUT,
                f"{connect} accepted a connection but did not answer the benchmark's hello "
                f"within {HELLO_TIMEOUT:g} s: is it a `tensorwire bench serve` (not another "
                "daemon's port), and does it run?",
            )
            self._greeted = True
            self.remote_machine = hello["machine"]
            nonce = hello.get("nonce") or b""
            if nonce and secret is None:
                raise BenchError(
                    f"the benchmark peer at {self.host} needs the shared secret: --secret-file "
                    "or TENSORWIRE_SECRET, the same on both ends"
                )
            if secret is not None and not nonce:
                raise BenchError(
                    f"the benchmark peer at {self.host} does not use a shared secret, but one "
                    "was given: start it with the same --secret-file (or TENSORWIRE_SECRET)"
                )
            self._nonce = nonce
            self.pong_rx = tw.Receiver(
                tcp_endpoint(local_address_towards(self.host), 0),
                ring=ring,
                secret=secret,
                shm=shm,
            )
            for t in transports:
                self.pong_rx.register(
                    tensor_name(t, "pong"), (latency_bytes,), "uint8", device=device
                )
            info = self.call(
                "setup",
                sizes=sizes,
                transports=transports,
                latency_bytes=latency_bytes,
                ring=ring,
                shm=shm,
                device=device,
                batch=batch,
                gloo=gloo,
            )
            for t in transports:
                try:
                    self.senders[t] = tw.Sender.connect(
                        info["receiver"],
                        transport=t,
                        timeout=60,
                        secret=secret,
                        copy_threads=copy_threads,
                    )
                except (tw.TransportError, tw.MissingDependencyError) as exc:
                    if not optional:
                        raise
                    self.notes.append(f"{t} skipped: {exc}")
            self.call("pong", address=self.pong_rx.address, transports=list(self.senders))
            self._raw = socket.create_connection((self.host, info["raw_port"]), timeout=30)
            self._raw.settimeout(None)
            tune_socket(self._raw)
            self._pair = self._ctx.socket(zmq.PAIR)
            self._pair.linger = 0
            self._pair.ipv6 = reached_over_ipv6(self.host)
            self._pair.connect(tcp_endpoint(self.host, info["zmq_port"]))
            if "nixl" in self.senders:  # its buffers where the tensors are (DRAM or VRAM)
                self.raw_nixl = RawNixl(
                    "runner",
                    max([*sizes, latency_bytes]),
                    is_loopback_host(self.host),
                    device,
                    shared=shm is not False,
                )
                far = self.call("raw-nixl-setup", details=self.raw_nixl.details())
                self.raw_nixl.connect(far["details"])
            if gloo:
                self._join_gloo(device, info.get("gloo"))
        except BaseException:
            self.close()
            raise
        self.transports = list(self.senders)
        self.latency_bytes = latency_bytes
        self.batch = batch
        #: the batch rows: method -> (transport, at each size the tensors it writes)
        self.batched: dict[str, tuple[str, dict[int, list[str]]]] = {
            batch_method(t, batch): (
                t,
                {s: batch_tensor_names(t, s, batch) for s in sizes if s <= BATCH_MAX_BYTES},
            )
            for t in (self.transports if batch else [])
        }
        rng = np.random.default_rng(0)
        self.src = {s: rng.integers(0, 256, s, dtype=np.uint8) for s in sizes}
        self.dst = {s: np.empty(s, dtype=np.uint8) for s in sizes}
        self.ping = rng.integers(0, 256, latency_bytes, dtype=np.uint8)
        self.pong_buf = np.empty(latency_bytes, dtype=np.uint8)
        #: what the transports write: the host arrays, or copies of them on the GPU
        self.payload: dict[int, Any] = dict(self.src)
        self.ping_payload: Any = self.ping
        self.device = device
        self._gpu: Any = None
        self.torch_queue: TorchQueue | None = None
        if device != "cpu":
            try:
                self._gpu = _GpuReferences(device, sizes)
                self.payload = {s: self._gpu.on_device(a) for s, a in self.src.items()}
                self.ping_payload = self._gpu.on_device(self.ping)
                why_not = torch_queue_available(device)
                if why_not is None:
                    self.torch_queue = TorchQueue(device, sizes)
                else:
                    self.notes.append(f"{TORCH_QUEUE} skipped: {why_not}")
            except BaseException:
                self.close()
                raise

    def _join_gloo(self, device: str, peer_cannot: str | None) -> None:
        """Form the gloo process group with the peer (``peer_cannot``: why the peer cannot
        take part, from its set-up's answer), or note why not."""
        why_not = gloo_available(device) or (peer_cannot and f"the peer: {peer_cannot}")
        if why_not:
            self.notes.append(f"{GLOO} skipped: {why_not}")
            return
        here = local_address_towards(self.host)
        store = Gloo.open_store(here)
        # Both halves of the rendezvous wait for each other: ours in a thread, while the
        # peer's answer says that it joined, or at once why it could not (its failure would
        # otherwise hold ours to the rendezvous' timeout).
        formed: list[Gloo | BaseException] = []

        def form() -> None:
            try:
                formed.append(Gloo(RUNNER, here, store.port, store=store))
            except Exception as exc:  # torch's own (a RuntimeError at the rendezvous' timeout)
                formed.append(exc)

        joining = threading.Thread(target=form, name="tensorwire-bench-gloo", daemon=True)
        self._send("gloo-setup", host=here, port=store.port)
        joining.start()
        try:
            self._reply(GLOO_TIMEOUT.total_seconds())
        except BenchError as exc:
            raise BenchError(f"gloo: the peer did not join the process group ({exc})") from None
        joining.join(GLOO_TIMEOUT.total_seconds())
        if not formed or not isinstance(formed[0], Gloo):
            why = f"{type(formed[0]).__name__}: {formed[0]}" if formed else "no answer"
            raise BenchError(f"gloo: no process group with the peer ({why.splitlines()[0]})")
        self.gloo = formed[0]

    # -- the command channel -----------------------------------------------------------------

    def _send(self, op: str, **kw: Any) -> None:
        body = msgpack.packb({"op": op, **kw})
        if self._nonce and self._secret is not None:  # each command proves the secret
            mac = command_mac(self._secret, self._nonce, self._counter, body)
            self._counter += 1
            self._req.send(msgpack.packb([body, mac]))
        else:
            self._req.send(body)

    def _reply(self, timeout: float | None = None, silent: str | None = None) -> dict[str, Any]:
        wait = self.timeout if timeout is None else timeout
        if not self._req.poll(int(wait * 1000)):
            raise BenchError(
                silent or f"the benchmark peer at {self.host} did not answer in {wait:g} s"
            )
        reply: dict[str, Any] = msgpack.unpackb(self._req.recv())
        if not reply.get("ok"):
            raise BenchError(f"the benchmark peer failed: {reply.get('error')}")
        return reply

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        self._send(op, **kw)
        return self._reply()

    # -- throughput: seconds to move ``count`` messages of ``size`` bytes ----------------------

    def memcpy(self, size: int, count: int) -> float:
        src, dst = self.src[size], self.dst[size]
        t0 = time.perf_counter()
        for _ in range(count):
            np.copyto(dst, src)
        return time.perf_counter() - t0

    def transport(self, name: str, size: int, count: int) -> float:
        tx, src, tensor = self.senders[name], self.payload[size], tensor_name(name, size)
        self._send("consume", name=tensor, count=count)
        t0 = time.perf_counter()
        for _ in range(count):
            tx.write(tensor, src)
        self._reply()
        return time.perf_counter() - t0

    def messages(self, method: str, count: int) -> int:
        """``count`` rounded up to what ``method`` moves: whole batches for a batch row."""
        if method in self.batched:
            return -(-count // self.batch) * self.batch
        return count

    def measures(self, method: str, size: int) -> bool:
        return method not in self.batched or size in self.batched[method][1]

    def transport_batch(self, method: str, size: int, count: int) -> float:
        """``count`` messages (a multiple of the batch) as ``count / batch`` calls of
        ``write_many``, each one message of each of the batch's tensors."""
        transport, names = self.batched[method]
        tx, src = self.senders[transport], self.payload[size]
        items = [(name, src) for name in names[size]]
        steps = count // self.batch
        self._send("consume-batch", names=names[size], count=steps)
        t0 = time.perf_counter()
        for _ in range(steps):
            tx.write_many(items)
        self._reply()
        return time.perf_counter() - t0

    def raw_tcp(self, size: int, count: int) -> float:
        assert self._raw is not None
        view = self.src[size].data
        self._send("raw", size=size, count=count)
        t0 = time.perf_counter()
        for _ in range(count):
            self._raw.sendall(view)
        if self._raw.recv(1) != b"k":
            raise BenchError("raw-tcp peer hung up")
        self._reply()
        return time.perf_counter() - t0

    def raw_nixl_write(self, size: int, count: int) -> float:
        assert self.raw_nixl is not None
        self._send("raw-nixl")
        t0 = time.perf_counter()
        self.raw_nixl.send(size, count)
        self._reply()
        return time.perf_counter() - t0

    def zmq(self, size: int, count: int) -> float:
        assert self._pair is not None
        src = self.src[size]
        self._send("zmq", size=size, count=count)
        t0 = time.perf_counter()
        for _ in range(count):
            self._pair.send(src.data, copy=False)
        self._pair.recv()
        self._reply()
        return time.perf_counter() - t0

    def gloo_send(self, size: int, count: int, pipelined: bool = False) -> float:
        """``count`` gloo sends, each waited for, or (``pipelined``) as many in flight as a
        tensorwire receiver has slots for the size, into as many receive buffers."""
        assert self.gloo is not None
        window = auto_depth(size)
        self._send(GLOO, size=size, count=count, window=window if pipelined else 0)
        t0 = time.perf_counter()
        if pipelined:
            self.gloo.send_pipelined(self.src[size], count, window)
        else:
            self.gloo.send(self.src[size], count)
        self._reply()  # the peer received the last one
        return time.perf_counter() - t0

    def memcpy_in_parts(self, size: int, count: int) -> float:
        src, dst, pool = self.src[size], self.dst[size], self._copy_pool
        assert pool is not None
        t0 = time.perf_counter()
        for _ in range(count):
            split_copy(pool, dst, src, self._copy_threads)
        return time.perf_counter() - t0

    def throughput(self, method: str, size: int, count: int) -> float:
        if method == "memcpy":
            return self.memcpy(size, count)
        if method == self.split_memcpy:
            return self.memcpy_in_parts(size, count)
        if method == "raw-tcp":
            return self.raw_tcp(size, count)
        if method == "zmq":
            return self.zmq(size, count)
        if method == RAW_NIXL:
            return self.raw_nixl_write(size, count)
        if method == TORCH_QUEUE:
            assert self.torch_queue is not None
            return self.torch_queue.measure(size, count)
        if method == GLOO:
            return self.gloo_send(size, count)
        if method == GLOO_ISEND:
            return self.gloo_send(size, count, pipelined=True)
        if method in GPU_REFERENCES:
            assert self._gpu is not None, "the GPU references need --device cuda"
            return float(self._gpu.measure(method, size, count))
        if method in self.batched:
            return self.transport_batch(method, size, self.messages(method, count))
        return self.transport(method, size, count)

    # -- latency: round-trip seconds of each ping -----------------------------------------------

    def round_trips(self, method: str, count: int) -> list[float]:
        """``count`` round trips of ``method``, the peer echoing each: their seconds."""
        trip = self._echoed(method, count)
        out = []
        for _ in range(count):
            t0 = time.perf_counter()
            trip()
            out.append(time.perf_counter() - t0)
        self._reply()
        return out

    def _echoed(self, method: str, count: int) -> Callable[[], object]:
        """Ask the peer to echo ``count`` pings of ``method``; what one round trip does (the
        same call per trip for every method: the loop that times it is one)."""
        size = self.latency_bytes
        if method == "zmq":
            pair = self._pair
            assert pair is not None
            self._send("zmq", size=size, count=count, echo=True)

            def zmq_trip() -> None:
                pair.send(self.ping.data, copy=False)
                frame = pair.recv(copy=False)
                np.copyto(self.pong_buf, np.frombuffer(frame.buffer, dtype=np.uint8))

            return zmq_trip
        if method == "raw-tcp":
            sock, into = self._raw, self.pong_buf.data
            assert sock is not None
            self._send("raw-echo", size=size, count=count)

            def raw_trip() -> None:
                sock.sendall(self.ping.data)
                raw_recv(sock, into)

            return raw_trip
        if method == GLOO:
            gloo = self.gloo
            assert gloo is not None
            self._send("gloo-echo", size=size, count=count)

            def gloo_trip() -> None:
                gloo.send(self.ping)
                gloo.recv(self.pong_buf)

            return gloo_trip
        if method == RAW_NIXL:
            raw = self.raw_nixl
            assert raw is not None
            self._send("raw-nixl-echo", size=size, count=count)
            return lambda: raw.ping(size)
        assert self.pong_rx is not None
        tx, rx = self.senders[method], self.pong_rx
        ping, pong = tensor_name(method, "ping"), tensor_name(method, "pong")
        self._send("echo", transport=method, count=count)

        def transport_trip() -> None:
            tx.write(ping, self.ping_payload)
            rx.wait(pong, timeout=self.timeout)
            rx.release(pong)

        return transport_trip

    def close(self) -> None:
        for tx in self.senders.values():  # before the peer's receiver goes away
            tx.close()
        with contextlib.suppress(Exception):
            if self._greeted and not self._req.closed:
                # bounded: a peer that stopped answering must not hold the exit for the
                # commands' timeout (a failed set-up waited 120 s here)
                self._send("bye")
                self._reply(HELLO_TIMEOUT)
        if self._raw is not None:
            self._raw.close()
        if self._pair is not None:
            self._pair.close()
        if self.raw_nixl is not None:
            self.raw_nixl.close()
        gloo = getattr(self, "gloo", None)  # absent if __init__ failed early
        if gloo is not None:
            gloo.close()
        self._req.close()
        self._ctx.term()
        if self.pong_rx is not None:
            self.pong_rx.close()
        if self._copy_pool is not None:
            self._copy_pool.shutdown()
        torch_queue = getattr(self, "torch_queue", None)  # absent if __init__ failed early
        if torch_queue is not None:
            torch_queue.close()


class _GpuReferences:
    """The GPU's own limits for the same bytes, timed like the transports (cupy)."""

    def __init__(self, device: str, sizes: list[int]) -> None:
        self.cp = tw_cuda.cupy()
        self.index = tw_cuda.parse_device(device)
        assert self.index is not None
        self.pinned = tw_cuda.PinnedBuffer()
        self.pinned.bytes(max(sizes))
        with self.cp.cuda.Device(self.index):
            self.src = {s: self.cp.zeros(s, dtype=self.cp.uint8) for s in sizes}
            self.dst = {s: self.cp.empty(s, dtype=self.cp.uint8) for s in sizes}

    def on_device(self, array: np.ndarray[Any, Any]) -> Any:
        with self.cp.cuda.Device(self.index):
            return self.cp.asarray(array)

    def measure(self, method: str, size: int, count: int) -> float:
        cp = self.cp
        src, dst = self.src[size], self.dst[size]
        host = tw_cuda.data_pointer(self.pinned.bytes(size))
        runtime = cp.cuda.runtime
        with cp.cuda.Device(self.index):
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            for _ in range(count):
                if method == "d2d":
                    cp.copyto(dst, src)
                else:  # h2d-pinned: synchronous, as every one-sided write completes
                    runtime.memcpy(dst.data.ptr, host, size, runtime.memcpyHostToDevice)
            cp.cuda.Device().synchronize()
            return time.perf_counter() - t0


def sweep(
    runner: Runner,
    sizes: list[int],
    methods: list[str],
    latency_methods: list[str],
    repeat: int,
    round_trips: int,
    tick: Callable[[str], None],
    messages: int = 0,
) -> dict[str, Any]:
    """Measure every method at every size ``repeat`` times, interleaved; return raw samples.
    (A batch row is measured at the sizes it has tensors for.) ``messages``: per throughput
    measurement (0: :func:`count_for` chooses)."""
    gbps: dict[str, dict[int, list[float]]] = {
        m: {s: [] for s in sizes if runner.measures(m, s)} for m in methods
    }
    rtts: dict[str, list[float]] = {m: [] for m in latency_methods}
    seconds_each: dict[tuple[str, int], float] = {}
    for size in sizes:  # warm-up: first touches, connections, claims, gRPC channels
        for m in methods:
            if not runner.measures(m, size):
                continue
            runner.throughput(m, size, 2)
            warm = runner.messages(m, MIN_COUNT)
            seconds_each[m, size] = runner.throughput(m, size, warm) / warm
    for m in latency_methods:
        runner.round_trips(m, 50)
    for r in range(repeat):
        order = methods[r % len(methods) :] + methods[: r % len(methods)]  # rotate: no fixed order
        for size in sizes:
            for m in order:
                if not runner.measures(m, size):
                    continue
                count = runner.messages(m, messages or count_for(size, seconds_each[m, size]))
                secs = runner.throughput(m, size, count)
                gbps[m][size].append(size * count / secs / 1e9)
                tick(f"{m} {size}")
        for m in latency_methods:
            rtts[m].extend(runner.round_trips(m, round_trips))
            tick(f"{m} round trips")
    return {"gbps": gbps, "rtts": rtts}


def summarise(samples: dict[str, Any], sizes: list[int], latency_bytes: int) -> dict[str, Any]:
    """Medians and ratios: to both gRPC baselines (``grpc``, TensorFlow-style, and
    ``grpc-stream``, gRPC at its best), to memcpy, to torch's ways where measured
    (``torch-queue``, ``gloo``), and to the raw mechanism's limit."""
    med = {m: {s: statistics.median(v) for s, v in by.items()} for m, by in samples["gbps"].items()}
    # GPU tensors (--device cuda): shm's limit is the GPU's own copy
    raw_limit = {"shm": "d2d" if "d2d" in med else "memcpy", "tcp": "raw-tcp", "nixl": RAW_NIXL}
    rows = []
    for size in sizes:
        for m, by in med.items():
            if size not in by:  # a batch row above BATCH_MAX_BYTES
                continue
            row: dict[str, Any] = {
                "method": m,
                "size": size,
                "gbps": by[size],
                "samples": samples["gbps"][m][size],
            }
            for ref in ("grpc", "grpc-stream", "memcpy", TORCH_QUEUE):
                key = "x_" + ref.replace("-", "_")
                row[key] = by[size] / med[ref][size] if ref in med else None
            # against the faster of gloo's two ways at the size
            gloo = [med[g][size] for g in (GLOO, GLOO_ISEND) if g in med]
            row["x_gloo"] = by[size] / max(gloo) if gloo else None
            limit = raw_limit.get(base_method(m))
            row["limit"] = limit
            row["x_limit"] = by[size] / med[limit][size] if limit in med else None
            rows.append(row)
    lat = []
    rtts = samples["rtts"]
    rtt_median = {m: statistics.median(xs) for m, xs in rtts.items()}
    grpc_rtt, stream_rtt, gloo_rtt = (rtt_median.get(m) for m in ("grpc", "grpc-stream", GLOO))
    for m, xs in samples["rtts"].items():
        ordered = sorted(xs)
        median = rtt_median[m]
        limit = raw_limit.get(m)
        lat.append(
            {
                "method": m,
                "bytes": latency_bytes,
                "n": len(ordered),
                "median_us": median * 1e6,
                "p99_us": ordered[int(0.99 * (len(ordered) - 1))] * 1e6,
                "lower_than_grpc": grpc_rtt / median if grpc_rtt else None,
                "lower_than_grpc_stream": stream_rtt / median if stream_rtt else None,
                "lower_than_gloo": gloo_rtt / median if gloo_rtt else None,
                # how many times the raw mechanism's round trip (higher is slower)
                "limit": limit if limit in rtt_median else None,
                "x_limit": median / rtt_median[limit] if limit in rtt_median else None,
            }
        )
    return {"throughput": rows, "latency": lat}


__all__ = [
    "GLOO",
    "GLOO_ISEND",
    "GPU_REFERENCES",
    "RAW_NIXL",
    "REFERENCES",
    "TORCH_QUEUE",
    "TRANSPORTS",
    "Runner",
    "batch_method",
    "machine_facts",
    "summarise",
    "sweep",
]
