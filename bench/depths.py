"""``python -m tensorwire.bench.depths``: how fast does a stream go with each ring depth?

A receiver process registers one tensor per (size, depth) pair; this process streams
``--messages`` messages into each in turn, over one transport, and the receiver waits for and
releases each as it lands (it does not read the payload). The tensors are streamed alternately
between the same two processes, so every depth sees the same moments of a noisy machine: on this
project's 2-core VM, separate runs of one setting differ by up to 2x, which hides a 25% effect
that paired timings show run after run. Each line is the median of ``--repeat`` timings; "vs
first" compares with the first depth given. Uses only the public API of tensorwire.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from typing import Any

import numpy as np

import tensorwire as tw

from .common import human, parse_sizes


def _name(size: int, depth: int) -> str:
    return f"s{size}-d{depth}"


def _consume(commands: Any, replies: Any, sizes: list[int], depths: list[int]) -> None:
    """The receiving process: one tensor per (size, depth); stream ``(name, count)`` on
    command, reply when all have landed; ``None`` ends it."""
    with tw.Receiver() as rx:
        for size in sizes:
            for depth in depths:
                rx.register(_name(size, depth), (size,), "uint8", ring=depth)
        replies.put(rx.address)
        while (command := commands.get()) is not None:
            name, count = command
            for _ in range(count):
                rx.wait(name, timeout=120)
                rx.release(name)
            replies.put(name)


def measure(
    transport: str, sizes: list[int], depths: list[int], messages: int, repeat: int
) -> dict[int, dict[int, list[float]]]:
    """GB/s of each timing, by size and depth."""
    ctx = mp.get_context("spawn")
    commands, replies = ctx.Queue(), ctx.Queue()
    peer = ctx.Process(target=_consume, args=(commands, replies, sizes, depths), daemon=True)
    peer.start()
    rates: dict[int, dict[int, list[float]]] = {s: {d: [] for d in depths} for s in sizes}
    try:
        address = replies.get(timeout=60)
        with tw.Sender.connect(address, transport=transport, timeout=120) as tx:

            def stream(name: str, data: np.ndarray[Any, Any], count: int) -> float:
                commands.put((name, count))
                started = time.perf_counter()
                for _ in range(count):
                    tx.write(name, data)
                if replies.get(timeout=300) != name:
                    raise RuntimeError("the receiving process lost count")
                return time.perf_counter() - started

            for size in sizes:
                data = np.zeros(size, np.uint8)
                for depth in depths:  # warm-up: the claim, first touches, connections
                    stream(_name(size, depth), data, max(2 * depth, 100))
                for r in range(repeat):
                    # alternated, and in reverse every other time: no depth always goes first
                    for depth in depths if r % 2 == 0 else depths[::-1]:
                        seconds = stream(_name(size, depth), data, messages)
                        rates[size][depth].append(size * messages / seconds / 1e9)
    finally:
        commands.put(None)
        peer.join(30)
        if peer.is_alive():
            peer.kill()
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tensorwire.bench.depths", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--transport",
        default="tcp",
        choices=[t for t in tw.TRANSPORT_NAMES if t != "auto"],
        help="the transport streamed over (default %(default)s)",
    )
    parser.add_argument(
        "--sizes", type=parse_sizes, default="4K,16K,64K", help="sizes (default %(default)s)"
    )
    parser.add_argument("--depths", default="8,16,32", help="ring depths (default %(default)s)")
    parser.add_argument(
        "--messages", type=int, default=5000, help="messages per timing (default %(default)s)"
    )
    parser.add_argument("--repeat", type=int, default=6, help="timings per line (default 6)")
    args = parser.parse_args(argv)
    try:
        depths = [int(d) for d in args.depths.split(",")]
    except ValueError:
        parser.error(f"--depths takes whole numbers, e.g. 8,16,32; got {args.depths!r}")
    if args.repeat < 1 or args.messages < 1 or not depths or min(depths) < 1:
        parser.error("--repeat, --messages and every depth must be at least 1")
    rates = measure(args.transport, args.sizes, depths, args.messages, args.repeat)
    print(f"{args.transport}: {args.messages} messages a timing, medians of {args.repeat}")
    print(f"{'size':>8} {'depth':>6} {'GB/s':>8} {'vs first':>9}")
    for size, by_depth in rates.items():
        first = statistics.median(by_depth[depths[0]])
        for depth in depths:
            rate = statistics.median(by_depth[depth])
            print(f"{human(size):>8} {depth:>6} {rate:>8.3f} {rate / first:>8.2f}x")


if __name__ == "__main__":
    main()
