"""``python -m tensorwire.bench.cycle``: the library's own cost per message, in one process.

One thread writes a tensor to a receiver in the same process, waits for it and releases it,
``--count`` times per repetition: no second process, no scheduler hand-off, so what is measured
is the Python work of a write, a wait and a release (the per-message overhead that ``tensorwire
bench`` latency figures also contain, beside the wake-up between processes). Use it to compare
two versions of the library on one machine, alternating runs.

``--each`` times every call on its own instead (the median of each of ``write``, ``wait`` and
``release`` over all messages, and of an empty timing, which each figure includes): where a
message's time goes, and, against a stream's time per message, which end bounds it.

``--profile N`` runs the messages under :mod:`cProfile` and prints the ``N`` functions that took
the most time of their own: which lines of the library a message's microseconds go to. (The
profiler slows every call, Python's more than C's: compare its shares, not its times.)

``--calls`` (with ``--device cuda``) times, each on its own, the CUDA calls a GPU message over
``shm`` makes: the copy's launch (``cudaMemcpyAsync`` of the message's bytes), the completion
store's (``cuStreamWriteValue64``), entering the device and finding the current stream. Their
sum is the part of ``write``'s time that no Python work can save; what is left is Python's.

``--transport`` picks the data plane (``shm`` by default; ``tcp`` and ``nixl`` also run in one
process, through the loopback interface) and ``--device cuda[:N]`` puts the slots and the
payload on a GPU (cupy): there ``write`` only queues the copy, so ``wait`` holds the copy's own
time, which ``d2d`` (a cupy copy of the same bytes, synchronised) gives beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import mmap
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import tensorwire as tw
from tensorwire import cuda as tw_cuda
from tensorwire import cuda_stores
from tensorwire.job.files import output_file

from .common import human, machine_facts, parse_size
from .report import SCHEMA, write_json

#: messages before any timing: the first ones pay one-off costs (registrations, caches, pages)
WARM_UP = 1000
TRANSPORTS = ("shm", "tcp", "nixl")


@contextlib.contextmanager
def _loop(
    elements: int, transport: str = "shm", device: str = "cpu"
) -> Iterator[tuple[tw.Receiver, tw.Sender, Any]]:
    """A receiver of tensor "t" (``elements`` float32 on ``device``), a sender over
    ``transport`` to it in this same process, and the payload to write (on the same device)."""
    with tw.Receiver(heartbeat_timeout=None) as rx:
        rx.register("t", (elements,), "float32", device=device)
        with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
            index = tw_cuda.parse_device(device)
            if index is None:
                yield rx, tx, np.ones(elements, np.float32)
            else:
                cp = tw_cuda.cupy()
                with cp.cuda.Device(index):
                    yield rx, tx, cp.ones(elements, dtype=cp.float32)


def _messages(rx: tw.Receiver, tx: tw.Sender, payload: Any, count: int) -> None:
    for _ in range(count):
        tx.write("t", payload)
        rx.wait("t")
        rx.release("t")


def measure(
    count: int, repeat: int, elements: int, transport: str = "shm", device: str = "cpu"
) -> list[float]:
    """Microseconds per write + wait + release, one figure per repetition."""
    with _loop(elements, transport, device) as (rx, tx, payload):
        _messages(rx, tx, payload, min(count, WARM_UP))
        figures = []
        for _ in range(repeat):
            start = time.perf_counter()
            _messages(rx, tx, payload, count)
            figures.append((time.perf_counter() - start) / count * 1e6)
    return figures


def _d2d(payload: Any, count: int) -> float:
    """Median microseconds of a synchronised cupy copy of ``payload``'s bytes on its GPU."""
    cp = tw_cuda.cupy()
    with cp.cuda.Device(payload.device.id):
        dst = cp.empty_like(payload)
        stream = cp.cuda.get_current_stream()
        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            cp.copyto(dst, payload)
            stream.synchronize()
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def measure_each(
    count: int, elements: int, transport: str = "shm", device: str = "cpu"
) -> dict[str, float]:
    """Median microseconds of each call (``write``, ``wait``, ``release``) over ``count``
    messages, and of an empty pair of timer reads (``timer``), which each figure includes; on a
    GPU also ``d2d``, the copy of the same bytes on its own."""
    clock = time.perf_counter
    with _loop(elements, transport, device) as (rx, tx, payload):
        _messages(rx, tx, payload, min(count, WARM_UP))
        times: dict[str, list[float]] = {"write": [], "wait": [], "release": [], "timer": []}
        write, wait, release, timer = times.values()
        for _ in range(count):
            t0 = clock()
            tx.write("t", payload)
            t1 = clock()
            rx.wait("t")
            t2 = clock()
            rx.release("t")
            t3 = clock()
            t4 = clock()
            write.append(t1 - t0)
            wait.append(t2 - t1)
            release.append(t3 - t2)
            timer.append(t4 - t3)
        figures = {call: statistics.median(ts) * 1e6 for call, ts in times.items()}
        if tw_cuda.parse_device(device) is not None:
            figures["d2d"] = _d2d(payload, min(count, WARM_UP))
    return figures


#: calls timed between two synchronisations of the stream (untimed): copies queued faster than
#: the GPU runs them would fill CUDA's launch queue, and a launch would then wait for room
CALLS_QUEUED = 64


def measure_calls(count: int, elements: int, device: str) -> dict[str, float]:
    """Median host microseconds of each CUDA call a GPU message over shm makes, timed on its
    own over ``count`` calls, beside an empty timing (``timer``, which each figure includes):
    ``memcpyAsync`` (``elements`` float32 from one buffer on the device to another),
    ``writeValue64`` (a completion store into a host word, as into a ring's), ``device``
    (entering and leaving cupy's device context) and ``current stream``."""
    index = tw_cuda.parse_device(device)
    if index is None:
        raise ValueError("--calls times CUDA calls: give --device cuda or cuda:N")
    cp = tw_cuda.require_device(index)
    page = mmap.mmap(-1, mmap.PAGESIZE)  # a host page of its own, as the ring's words are
    word = np.frombuffer(page, np.uint64)
    stores = cuda_stores.StreamStores(index)
    with cp.cuda.Device(index):
        src = cp.ones(elements, dtype=cp.float32)
        dst = cp.empty_like(src)
        stream = cp.cuda.Stream(non_blocking=True)
        runtime = cp.cuda.runtime
        try:
            target = stores.map(word.ctypes.data)

            def copy() -> None:
                runtime.memcpyAsync(
                    dst.data.ptr, src.data.ptr, src.nbytes, runtime.memcpyDefault, stream.ptr
                )

            def device_context() -> None:
                with cp.cuda.Device(index):
                    pass

            calls: dict[str, Callable[[], Any]] = {
                "memcpyAsync": copy,
                "writeValue64": lambda: stores.store(stream.ptr, target, 1),
                "device": device_context,
                "current stream": lambda: tw_cuda.current_stream(index),
                "timer": lambda: None,
            }
            figures = {}
            for name, call in calls.items():
                times = []
                for k in range(count):
                    if k % CALLS_QUEUED == 0:
                        stream.synchronize()
                    t0 = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - t0)
                figures[name] = statistics.median(times) * 1e6
        finally:
            stream.synchronize()  # every store landed before its page is unregistered
            stores.close()
    return figures


def profile(
    count: int, elements: int, top: int, transport: str = "shm", device: str = "cpu"
) -> str:
    """The ``top`` functions by own time over ``count`` messages (after the warm-up), as
    :mod:`pstats` prints them."""
    with _loop(elements, transport, device) as (rx, tx, payload):
        _messages(rx, tx, payload, min(count, WARM_UP))
        profiler = cProfile.Profile()
        profiler.runcall(_messages, rx, tx, payload, count)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensorwire.bench.cycle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--count", type=int, default=20000, help="messages per repetition")
    parser.add_argument("--repeat", type=int, default=7, help="repetitions (median reported)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--elements", type=int, help="float32 elements per message (default 1024)")
    size.add_argument(
        "--size", type=parse_size, help="bytes per message, e.g. 4K or 16M (a multiple of 4)"
    )
    parser.add_argument("--transport", choices=TRANSPORTS, default="shm", help="default shm")
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the slots and the payload live: cpu (default), cuda or cuda:N",
    )
    parser.add_argument(
        "--json", metavar="PATH", type=output_file, help="also write the figures as JSON"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--each",
        action="store_true",
        help="time write, wait and release each on its own (medians over all messages)",
    )
    mode.add_argument(
        "--calls",
        action="store_true",
        help="time the CUDA calls of a GPU message on their own (needs --device cuda)",
    )
    mode.add_argument(
        "--profile",
        type=int,
        metavar="N",
        help="run --count messages under cProfile and print the N functions with the most own time",
    )
    args = parser.parse_args(argv)
    if args.size is not None:
        if args.size % 4:
            parser.error(f"--size must be a multiple of 4 bytes (float32), got {args.size}")
        elements = args.size // 4
    else:
        elements = 1024 if args.elements is None else args.elements
    if args.count < 1 or args.repeat < 1 or elements < 1:
        parser.error("--count, --repeat and --elements must be positive")
    if args.profile is not None and args.profile < 1:
        parser.error("--profile takes a positive number of functions")
    try:
        index = tw_cuda.parse_device(args.device)
    except (ValueError, tw.TensorWireError) as exc:
        parser.error(f"--device: {exc}")
    if args.calls and index is None:
        parser.error("--calls times CUDA calls: give --device cuda or cuda:N")
    what = f"{args.count} {args.transport} messages of {human(elements * 4)} on {args.device}"
    config: dict[str, Any] = {
        "count": args.count,
        "bytes": elements * 4,
        "transport": args.transport,
        "device": args.device,
    }
    results: dict[str, Any]
    if args.profile is not None:
        text = profile(args.count, elements, args.profile, args.transport, args.device)
        print(f"profile of {what}:")
        print(text)
        results = {"profile": text}
    elif args.calls:
        calls = measure_calls(args.count, elements, args.device)
        print(
            ", ".join(f"{call} {us:.3f}" for call, us in calls.items())
            + f" us (medians of {args.count} calls each, {human(elements * 4)} copies on "
            f"{args.device})"
        )
        results = {"median_us": calls}
    elif args.each:
        each = measure_each(args.count, elements, args.transport, args.device)
        print(
            ", ".join(f"{call} {us:.3f}" for call, us in each.items()) + f" us (medians of {what})"
        )
        results = {"median_us": each}
    else:
        config["repeat"] = args.repeat
        figures = measure(args.count, args.repeat, elements, args.transport, args.device)
        runs = ", ".join(f"{f:.3f}" for f in figures)
        print(
            f"{statistics.median(figures):.3f} us per write + wait + release ({what}; runs: {runs})"
        )
        results = {"us_per_message": figures}
    if args.json:
        command = " ".join(sys.argv[1:] if argv is None else argv)
        write_json(
            args.json,
            {
                "schema": SCHEMA,
                "kind": "cycle",
                "command": f"python -m tensorwire.bench.cycle {command}",
                "machine": machine_facts(),
                "config": config,
                **results,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
