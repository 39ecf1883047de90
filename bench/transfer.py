"""Transfer micro-benchmark: tensorwire writes between two processes against the machine's limits.

For each size it measures, in one run and interleaved so that drift hits all alike:

* ``memcpy``: a single-threaded ``np.copyto`` of the same bytes (the limit of any one-copy path);
* ``shm``: one-sided shared-memory writes from this process into a receiver process;
* ``raw-tcp``: a plain loopback socket, ``sendall`` into ``recv_into`` a preallocated buffer (the
  limit of any TCP path);
* ``tcp``: tensorwire's TCP transport between the same two processes;

and the round-trip latency of a small tensor (ping-pong) over each transport. Throughput is the
median over repetitions; every figure is printed next to its ratio to the relevant limit.

Run: ``python -m tensorwire.bench.transfer`` (``--help`` for options). Uses only the public API.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import socket
import statistics
import struct
import sys
import time
from typing import Any

import numpy as np

import tensorwire as tw

MiB = 1 << 20
DEFAULT_SIZES = (MiB, 16 * MiB, 64 * MiB)
TARGET_BYTES = 512 * MiB  # moved per measurement, so that small sizes are timed over many writes
RAW = struct.Struct("<QQ")  # raw-tcp control: (message size, message count)


def parse_size(text: str) -> int:
    """``4K``, ``16M``, ``1G`` or plain bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 4K, 16M, 1G)") from None


def human(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def count_for(size: int) -> int:
    return max(4, min(2000, TARGET_BYTES // size))


# ------------------------------------------------------------------------------------------------
# Peer processes
# ------------------------------------------------------------------------------------------------


def _receiver(conn: Any, sizes: list[int], latency_bytes: int, transports: list[str]) -> None:
    """Consumes ``count`` messages of a size on request; echoes pings as pongs.

    Each transport writes its own tensors: a tensor has one writer at a time."""
    with tw.Receiver() as rx:
        for t in transports:
            for size in sizes:
                rx.register(f"{t}-{size}", (size,), "uint8")
            rx.register(f"{t}-ping", (latency_bytes,), "uint8")
        conn.send(rx.address)
        pong_to = conn.recv()
        senders = {
            name: tw.Sender.connect(pong_to, transport=name, timeout=60) for name in transports
        }
        try:
            while True:
                cmd = conn.recv()
                if cmd[0] == "stop":
                    return
                if cmd[0] == "consume":
                    _, name, count = cmd
                    for _ in range(count):
                        rx.wait(name, timeout=60)
                        rx.release(name)
                    conn.send("done")
                elif cmd[0] == "echo":
                    _, transport, count = cmd
                    tx, ping = senders[transport], f"{transport}-ping"
                    for _ in range(count):
                        view = rx.wait(ping, timeout=60)
                        tx.write(f"{transport}-pong", view)
                        rx.release(ping)
                    conn.send("done")
        finally:
            for tx in senders.values():
                tx.close()


def _raw_sink(conn: Any, max_size: int) -> None:
    """A plain TCP receiver: ``recv_into`` one preallocated buffer, ack each batch."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        conn.send(srv.getsockname()[1])
        sock, _ = srv.accept()
    with sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 * MiB)
        buf = memoryview(bytearray(max_size))
        ctl = bytearray(RAW.size)
        while True:
            if sock.recv_into(ctl, RAW.size, socket.MSG_WAITALL) != RAW.size:
                return
            size, count = RAW.unpack(ctl)
            for _ in range(count):
                got = 0
                while got < size:
                    got += sock.recv_into(buf[got:size], size - got, socket.MSG_WAITALL)
            sock.sendall(b"k")


# ------------------------------------------------------------------------------------------------
# Measurements (this process is always the sender)
# ------------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, sizes: list[int], latency_bytes: int, transports: list[str]) -> None:
        ctx = mp.get_context("spawn")
        self.sizes = sizes
        self.transports = transports
        self._pong_rx = tw.Receiver()
        for t in transports:
            self._pong_rx.register(f"{t}-pong", (latency_bytes,), "uint8")
        self._ping = np.full(latency_bytes, 7, dtype=np.uint8)
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_receiver, args=(child, sizes, latency_bytes, transports), daemon=True
        )
        self._proc.start()
        address = self._conn.recv()
        self._conn.send(self._pong_rx.address)
        self._tx = {t: tw.Sender.connect(address, transport=t, timeout=60) for t in transports}
        self._raw_conn, raw_child = ctx.Pipe()
        self._raw_proc = ctx.Process(target=_raw_sink, args=(raw_child, max(sizes)), daemon=True)
        self._raw_proc.start()
        self._raw = socket.create_connection(("127.0.0.1", self._raw_conn.recv()))
        self._raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            self._raw.setsockopt(socket.SOL_SOCKET, opt, 4 * MiB)
        self._src = {s: np.random.default_rng(s).integers(0, 255, s, dtype=np.uint8) for s in sizes}
        self._dst = {s: np.zeros(s, dtype=np.uint8) for s in sizes}

    def memcpy(self, size: int, count: int) -> float:
        src, dst = self._src[size], self._dst[size]
        np.copyto(dst, src)
        t0 = time.perf_counter()
        for _ in range(count):
            np.copyto(dst, src)
        return time.perf_counter() - t0

    def transport(self, name: str, size: int, count: int) -> float:
        tx, src, tensor = self._tx[name], self._src[size], f"{name}-{size}"
        self._conn.send(("consume", tensor, count))
        t0 = time.perf_counter()
        for _ in range(count):
            tx.write(tensor, src)
        assert self._conn.recv() == "done"
        return time.perf_counter() - t0

    def raw_tcp(self, size: int, count: int) -> float:
        view = self._src[size].data
        self._raw.sendall(RAW.pack(size, count))
        t0 = time.perf_counter()
        for _ in range(count):
            self._raw.sendall(view)
        assert self._raw.recv(1) == b"k"
        return time.perf_counter() - t0

    def round_trips(self, name: str, count: int) -> list[float]:
        tx, rx = self._tx[name], self._pong_rx
        ping, pong = f"{name}-ping", f"{name}-pong"
        self._conn.send(("echo", name, count))
        out = []
        for _ in range(count):
            t0 = time.perf_counter()
            tx.write(ping, self._ping)
            rx.wait(pong, timeout=60)
            rx.release(pong)
            out.append(time.perf_counter() - t0)
        assert self._conn.recv() == "done"
        return out

    def close(self) -> None:
        for tx in self._tx.values():
            tx.close()
        self._conn.send(("stop",))
        self._proc.join(30)
        self._raw.close()
        self._raw_proc.join(30)
        self._pong_rx.close()


def run(
    sizes: list[int],
    repeat: int,
    transports: list[str],
    latency_bytes: int,
    round_trips: int,
    progress: bool = True,
) -> dict[str, Any]:
    bench = Bench(sizes, latency_bytes, transports)
    methods = ["memcpy", *transports]
    if "tcp" in transports:
        methods.append("raw-tcp")
    samples: dict[tuple[str, int], list[float]] = {(m, s): [] for m in methods for s in sizes}
    latency: dict[str, list[float]] = {t: [] for t in transports}
    try:
        for size in sizes:  # warm-up: first touches, connection set-up, claims
            bench.memcpy(size, 2)
            for t in transports:
                bench.transport(t, size, 4)
            if "tcp" in transports:
                bench.raw_tcp(size, 2)
        for t in transports:
            bench.round_trips(t, 200)
        for r in range(repeat):
            for size in sizes:
                count = count_for(size)
                for m in methods:
                    if m == "memcpy":
                        secs = bench.memcpy(size, count)
                    elif m == "raw-tcp":
                        secs = bench.raw_tcp(size, count)
                    else:
                        secs = bench.transport(m, size, count)
                    samples[(m, size)].append(size * count / secs / 1e9)
            for t in transports:
                latency[t].extend(bench.round_trips(t, round_trips))
            if progress:
                print(f"  repetition {r + 1}/{repeat} done", file=sys.stderr, flush=True)
    finally:
        bench.close()
    rows = []
    for size in sizes:
        med = {m: statistics.median(samples[(m, size)]) for m in methods}
        for m in methods:
            limit = "raw-tcp" if m in ("tcp", "raw-tcp") else "memcpy"
            rows.append(
                {
                    "size": size,
                    "method": m,
                    "gbps": med[m],
                    "limit": limit,
                    "ratio_to_limit": med[m] / med[limit],
                    "samples": samples[(m, size)],
                }
            )
    lat = {}
    for t, xs in latency.items():
        xs_sorted = sorted(xs)
        lat[t] = {
            "bytes": latency_bytes,
            "median_us": statistics.median(xs) * 1e6,
            "p99_us": xs_sorted[int(0.99 * (len(xs) - 1))] * 1e6,
            "n": len(xs),
        }
    return {
        "schema": "tensorwire.bench.transfer/1",
        "machine": {
            "cpus": mp.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "tensorwire": tw.__version__,
        },
        "repeat": repeat,
        "throughput": rows,
        "latency": lat,
    }


def render(result: dict[str, Any]) -> str:
    lines = [f"{'size':>8}  {'method':<8} {'GB/s':>7}  {'vs limit':>14}"]
    for row in result["throughput"]:
        ratio = (
            "" if row["method"] == row["limit"] else f"{row['ratio_to_limit']:.2f}x {row['limit']}"
        )
        lines.append(f"{human(row['size']):>8}  {row['method']:<8} {row['gbps']:7.2f}  {ratio:>14}")
    lines.append("")
    lines.append(f"{'round trip':<12} {'bytes':>6} {'median us':>10} {'p99 us':>8}")
    for t, lat in result["latency"].items():
        lines.append(f"{t:<12} {lat['bytes']:>6} {lat['median_us']:10.1f} {lat['p99_us']:8.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensorwire.bench.transfer",
        description="Throughput of shm and tcp writes between two processes, next to memcpy and a "
        "raw loopback socket, and small-tensor round-trip latency.",
    )
    parser.add_argument(
        "--sizes", default="1M,16M,64M", help="comma-separated tensor sizes (default: 1M,16M,64M)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (median reported)")
    parser.add_argument("--transports", default="shm,tcp", help="comma-separated: shm,tcp")
    parser.add_argument(
        "--latency-bytes",
        type=parse_size,
        default=4096,
        help="tensor size for the round-trip test (default 4K)",
    )
    parser.add_argument("--round-trips", type=int, default=2000, help="round trips per repetition")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    transports = [t for t in args.transports.split(",") if t]
    unknown = set(transports) - {"shm", "tcp"}
    if unknown or not transports:
        parser.error(f"unknown transport(s): {', '.join(sorted(unknown)) or '(none given)'}")
    if args.repeat < 1 or args.round_trips < 1:
        parser.error("--repeat and --round-trips must be at least 1")
    result = run(sizes, args.repeat, transports, args.latency_bytes, args.round_trips)
    print(render(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
