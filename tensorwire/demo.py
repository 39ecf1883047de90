"""A two-process demonstration of the transport: what moved, byte-exact, and how fast.

A receiver process registers a small model's worth of tensors (two weight matrices, a bias and a
dynamic batch of token ids) and publishes their addresses; this process writes them step after
step over each transport, and the receiver compares every message it hands out with its own copy
of the data.

Run: ``python -m tensorwire.demo`` (or ``tensorwire demo``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import secrets
import time
from typing import Any

import numpy as np

import tensorwire as tw

TENSORS: list[tuple[str, tuple[int | None, ...], str, int | None]] = [
    ("layer1.weight", (1024, 1024), "float32", None),
    ("layer1.bias", (1024,), "float32", None),
    ("layer2.weight", (1024, 4096), "float32", None),
    ("batch.ids", (None, 128), "int64", 512 * 128 * 8),
]


def _weights() -> dict[str, np.ndarray[Any, Any]]:
    """The static tensors; both processes build the same ones, so the receiver can check them."""
    rng = np.random.default_rng(0)
    out = {}
    for name, shape, dtype, _ in TENSORS:
        dims = [d for d in shape if d is not None]
        if len(dims) == len(shape):
            out[name] = rng.standard_normal(dims).astype(dtype)
    return out


def _batch(step: int) -> np.ndarray[Any, Any]:
    rows = 64 + (step * 37) % 448  # a different number of rows every step: the dynamic path
    return np.random.default_rng(step).integers(0, 50_000, size=(rows, 128), dtype=np.int64)


def _receiver(conn: Any, secret: str, steps: int) -> None:
    expected = _weights()
    with tw.Receiver(secret=secret) as rx:
        for name, shape, dtype, cap in TENSORS:
            rx.register(name, shape, dtype, max_bytes=cap)
        conn.send(rx.address)
        while (cmd := conn.recv()) != "stop":
            received = mismatched = nbytes = batches = 0
            for _ in range(steps * len(TENSORS)):
                name, view = rx.wait_any(timeout=60)
                if name == "batch.ids":
                    want = _batch(batches)
                    batches += 1
                else:
                    want = expected[name]
                mismatched += not (view.shape == want.shape and np.array_equal(view, want))
                nbytes += view.nbytes
                received += 1
                rx.release(name)
            conn.send((cmd, received, mismatched, nbytes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensorwire.demo",
        description="Two processes, one-sided tensor writes over shm and tcp, checked byte for "
        "byte, with throughput.",
    )
    parser.add_argument("--steps", type=int, default=50, help="steps per transport (default 50)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    ctx = mp.get_context("spawn")
    secret = secrets.token_hex(16)
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_receiver, args=(there, secret, args.steps), daemon=True)
    proc.start()
    try:
        address = here.recv()
        print(f"receiver pid {proc.pid} published {len(TENSORS)} tensors at {address}")
        print("(senders authenticate with a shared secret: HMAC challenge-response)")
        for name, shape, dtype, cap in TENSORS:
            print(f"  {tw.TensorSpec.create(name, shape, dtype, cap).describe():>36}  {name}")
        weights = _weights()
        batches = [_batch(step) for step in range(args.steps)]
        print(f"\n{'transport':<10}{'messages':>10}{'MiB':>10}{'seconds':>10}{'GB/s':>8}  check")
        for transport in ("shm", "tcp"):
            with tw.Sender.connect(address, transport=transport, secret=secret) as tx:
                here.send(transport)
                start = time.perf_counter()
                for step in range(args.steps):
                    for name, arr in weights.items():
                        tx.write(name, arr)
                    tx.write("batch.ids", batches[step])
                _, received, mismatched, nbytes = here.recv()
                secs = time.perf_counter() - start
            check = "byte-exact" if mismatched == 0 else f"{mismatched} MISMATCHED"
            print(
                f"{transport:<10}{received:>10}{nbytes / 2**20:>10.1f}{secs:>10.3f}"
                f"{nbytes / secs / 1e9:>8.2f}  {check}"
            )
            if mismatched:
                return 1
        print("\nThe receiver compared every message with its own copy of the data while timing")
        print("ran; `make bench` measures the transports alone, next to memcpy and a raw socket.")
    finally:
        here.send("stop")
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
