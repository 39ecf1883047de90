"""``python -m tensorwire.bench.registration``: what many tensors cost before the first byte moves.

A model with thousands of parameters (or a parameter server's chunks of them) is thousands of
registered tensors. This times, for ``--tensors`` small static tensors on one receiver: their
registration (``register_many``), a sender's connect (the address book), each tensor's first
write (its claim: one control-plane round trip each), and then one ``write_many`` of all of them
with the receiver's ``wait_all`` (the steady state); then a second sender's first
``write_many`` of all of them (its claims go together, ``claim-many``), with ``wait_all``.
Medians of ``--repeat`` runs.

``--memory`` adds one pass under :mod:`tracemalloc` (slower: its times are not reported): the
Python heap the receiver holds once the tensors are registered, and once a sender (in the same
process) has written each of them once, with the count of objects the garbage collector tracks.

``--large-mib N`` adds what a large registration costs the traffic already flowing: a small
tensor's write, wait and release loop runs in a thread of its own while the main thread
registers four tensors of N MiB, one at a time (each a region of its own); reported are the
loop's longest pause while idle and while they are registered, and the registrations' time.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import threading
import time
import tracemalloc

import numpy as np

import tensorwire as tw
from tensorwire.job.config import at_least
from tensorwire.job.files import output_file

from .common import machine_facts
from .report import write_json


def measure(tensors: int, transport: str) -> dict[str, float]:
    names = [f"t{i}" for i in range(tensors)]
    x = np.ones(16, np.float32)
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    with tw.Receiver() as rx:
        rx.register_many([(n, (16,), "float32") for n in names])
        t1 = time.perf_counter()
        with tw.Sender.connect(rx.address, transport=transport, timeout=60) as tx:
            t2 = time.perf_counter()
            for n in names:
                tx.write(n, x)
            t3 = time.perf_counter()
            rx.wait_all(names, timeout=60)
            rx.release_many(names)
            t4 = time.perf_counter()
            tx.write_many({n: x for n in names})
            rx.wait_all(names, timeout=60)
            rx.release_many(names)
            t5 = time.perf_counter()
        with tw.Sender.connect(rx.address, transport=transport, timeout=60) as tx:
            t6 = time.perf_counter()
            tx.write_many({n: x for n in names})
            rx.wait_all(names, timeout=60)
            rx.release_many(names)
            t7 = time.perf_counter()
    out["register_s"] = t1 - t0
    out["connect_s"] = t2 - t1
    out["first_writes_s"] = t3 - t2
    out["steady_batch_s"] = t5 - t4
    out["first_batch_s"] = t7 - t6
    return out


def measure_stall(large_mib: int, transport: str, count: int = 4) -> dict[str, float]:
    """The longest pause (ms) of a small tensor's write-wait-release loop, idle for 0.5 s and
    while ``count`` tensors of ``large_mib`` MiB are registered; the registrations' seconds."""
    stop = threading.Event()
    pauses: list[float] = []
    with (
        tw.Receiver() as rx,
        tw.Sender.connect(rx.address, transport=transport, timeout=60) as tx,
    ):
        rx.register("small", (16,), "float32")
        x = np.ones(16, np.float32)

        def loop() -> None:
            last = time.perf_counter()
            while not stop.is_set():
                tx.write("small", x)
                rx.wait("small", timeout=60)
                rx.release("small")
                now = time.perf_counter()
                pauses.append(now - last)
                last = now

        thread = threading.Thread(target=loop, name="small-tensor-loop")
        thread.start()
        try:
            time.sleep(0.5)
            idle = max(pauses, default=0.0)
            pauses.clear()
            t0 = time.perf_counter()
            for k in range(count):
                rx.register(f"large{k}", (large_mib << 20,), "uint8")
            registering = time.perf_counter() - t0
        finally:
            stop.set()
            thread.join()
    return {
        "stall_idle_ms": idle * 1e3,
        "stall_registering_ms": max(pauses, default=0.0) * 1e3,
        "register_large_s": registering,
    }


def measure_memory(tensors: int, transport: str) -> dict[str, float]:
    """The Python heap (MiB, traced) after registering ``tensors`` small tensors, and after a
    sender's first ``write_many`` of all of them; the objects the collector tracks then."""
    names = [f"t{i}" for i in range(tensors)]
    x = np.ones(16, np.float32)
    gc.collect()
    tracemalloc.start()
    try:
        with tw.Receiver() as rx:
            rx.register_many([(n, (16,), "float32") for n in names])
            registered = tracemalloc.get_traced_memory()[0]
            with tw.Sender.connect(rx.address, transport=transport, timeout=60) as tx:
                tx.write_many({n: x for n in names})
                rx.wait_all(names, timeout=60)
                rx.release_many(names)
                written = tracemalloc.get_traced_memory()[0]
                objects = len(gc.get_objects())
    finally:
        tracemalloc.stop()
    return {
        "heap_registered_mib": registered / 2**20,
        "heap_written_mib": written / 2**20,
        "gc_objects": objects,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensorwire.bench.registration", description=__doc__
    )
    parser.add_argument("--tensors", type=at_least(1), default=20_000, help="default 20000")
    parser.add_argument(
        "--transport", default="shm", choices=[t for t in tw.TRANSPORT_NAMES if t != "auto"]
    )
    parser.add_argument("--repeat", type=at_least(1), default=3, help="default 3")
    parser.add_argument("--json", metavar="PATH", type=output_file, help="write the runs as JSON")
    parser.add_argument(
        "--memory",
        action="store_true",
        help="also measure the Python heap and the objects held, in one more pass (traced)",
    )
    parser.add_argument(
        "--large-mib",
        type=at_least(1),
        metavar="N",
        help="also measure how long a small tensor's traffic pauses while 4 tensors of N MiB "
        "are registered (--repeat runs)",
    )
    args = parser.parse_args(argv)
    runs = [measure(args.tensors, args.transport) for _ in range(args.repeat)]
    print(f"{args.tensors} float32[16] tensors over {args.transport}, median of {args.repeat}:")
    medians = {}
    for key in runs[0]:
        medians[key] = median = statistics.median(r[key] for r in runs)
        per = median / args.tensors * 1e6
        print(f"  {key:<16} {median:8.2f} s  ({per:7.1f} us a tensor)")
    memory = measure_memory(args.tensors, args.transport) if args.memory else None
    if memory is not None:
        print(
            f"  python heap      {memory['heap_registered_mib']:8.1f} MiB registered, "
            f"{memory['heap_written_mib']:.1f} MiB once a sender wrote each tensor "
            f"({memory['gc_objects']:,.0f} objects tracked)"
        )
    stalls = None
    if args.large_mib:
        stalls = [measure_stall(args.large_mib, args.transport) for _ in range(args.repeat)]
        idle, busy, took = (
            statistics.median(r[k] for r in stalls)
            for k in ("stall_idle_ms", "stall_registering_ms", "register_large_s")
        )
        print(
            f"  a small tensor's longest pause: {idle:.1f} ms idle, {busy:.1f} ms while 4 "
            f"tensors of {args.large_mib} MiB were registered (in {took:.2f} s; medians)"
        )
    if args.json:
        result = {
            "kind": "registration",
            "machine": machine_facts(),
            "config": {"tensors": args.tensors, "transport": args.transport},
            "runs": runs,
            "medians": medians,
            "memory": memory,
            "stalls": stalls,
        }
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
