"""``python -m tensorwire.bench.registration``: what many tensors cost before the first byte moves.

A model with thousands of parameters (or a parameter server's chunks of them) is thousands of
registered tensors. This times, for ``--tensors`` small static tensors on one receiver: their
registration (``register_many``), a sender's connect (the address book), each tensor's first
write (its claim: one control-plane round trip each), and then one ``write_many`` of all of them
with the receiver's ``wait_all`` (the steady state); then a second sender's first
``write_many`` of all of them (its claims go together, ``claim-many``), with ``wait_all``.
Medians of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

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
    args = parser.parse_args(argv)
    runs = [measure(args.tensors, args.transport) for _ in range(args.repeat)]
    print(f"{args.tensors} float32[16] tensors over {args.transport}, median of {args.repeat}:")
    medians = {}
    for key in runs[0]:
        medians[key] = median = statistics.median(r[key] for r in runs)
        per = median / args.tensors * 1e6
        print(f"  {key:<16} {median:8.2f} s  ({per:7.1f} us a tensor)")
    if args.json:
        result = {
            "kind": "registration",
            "machine": machine_facts(),
            "config": {"tensors": args.tensors, "transport": args.transport},
            "runs": runs,
            "medians": medians,
        }
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
