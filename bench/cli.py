"""``tensorwire bench``: transports against gRPC and against the machine's limits, in one command.

    tensorwire bench [options]                           both ends on this machine
    tensorwire bench serve --bind tcp://0.0.0.0:PORT     the receiving end, on one host
    tensorwire bench run --connect tcp://HOST:PORT       the sending end, on another host
    tensorwire bench ps | soak | chaos                   training jobs, a load test, faults

Options: --sizes, --transports, --repeat, --round-trips, --latency-size, --batch N,
--copy-threads N, --gloo, --json PATH, --plot PATH.png, --no-progress. Uses only the public API of
tensorwire.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import tensorwire as tw
from tensorwire import cuda as tw_cuda
from tensorwire import cuda_stores, extras
from tensorwire import region as tw_region
from tensorwire.job.argtypes import add_version, path
from tensorwire.job.config import (
    add_logging_flags,
    add_metrics_flags,
    setup_logging,
    start_metrics,
)
from tensorwire.job.files import output_file
from tensorwire.layout import MAX_DEPTH
from tensorwire.process import die_with_parent

from . import chaos, report, soak
from . import ps as ps_bench
from .common import (
    BATCH_MAX_BYTES,
    human,
    machine_facts,
    parse_size,
    parse_sizes,
    parse_transports,
)
from .peer import serve
from .runner import (
    GLOO,
    GLOO_ISEND,
    GPU_REFERENCES,
    MAX_COUNT,
    MIN_COUNT,
    MIN_SECONDS,
    RAW_NIXL,
    REFERENCES,
    TORCH_QUEUE,
    TRANSPORTS,
    Runner,
    summarise,
    sweep,
)

DEFAULT_SIZES = "4K,64K,1M,16M,64M"


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes(DEFAULT_SIZES),
        help=f"comma-separated tensor sizes (default {DEFAULT_SIZES})",
    )
    parser.add_argument(
        "--transports",
        default=None,
        help=f"comma-separated, from {','.join(TRANSPORTS)} (default: every one "
        "that reaches the peer)",
    )
    parser.add_argument(
        "--repeat", type=int, default=5, help="repetitions; medians are reported (default 5)"
    )
    parser.add_argument(
        "--round-trips",
        type=int,
        default=500,
        help="ping-pong round trips per repetition (default 500)",
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=0,
        metavar="N",
        help="messages per throughput measurement (default 0: about 256 MiB, or more where "
        f"that would last under {MIN_SECONDS * 1000:.0f} ms, from {MIN_COUNT} to {MAX_COUNT}); "
        "more measures a longer stream, past how it starts",
    )
    parser.add_argument(
        "--latency-size",
        type=parse_size,
        default=4096,
        help="tensor size of the ping-pong (default 4K)",
    )
    parser.add_argument(
        "--ring",
        type=int,
        default=None,
        help="slots per tensor (default: the receiver's choice by size, 32 up to 32 KiB, down "
        "to 2 from 512 KiB)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=0,
        metavar="N",
        help="also measure each transport writing N tensors of each size per write_many, the "
        "receiver taking them with wait_all and release_many (rows 'shm xN'...; sizes up to "
        f"{human(BATCH_MAX_BYTES)}; default 0: single writes only)",
    )
    parser.add_argument(
        "--copy-threads",
        type=int,
        default=1,
        metavar="N",
        help="threads that copy one large shm write (tw.Sender(copy_threads=N): from 16 MiB, "
        "parts of at least 8 MiB); above 1 also adds the reference 'memcpy N threads', the same "
        "bytes copied in N parts at once (default 1)",
    )
    parser.add_argument(
        "--receiver-memory",
        choices=("shared", "private"),
        default="shared",
        help="where the receivers keep their slots: shared (the default; /dev/shm, which the shm "
        "transport needs) or private (tw.Receiver(shm=False): this process's memory, on huge "
        "pages where the kernel allows, as for senders on other hosts; shm is then skipped, or an "
        "error when --transports names it)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        metavar="cpu|cuda|cuda:N",
        help="where the tensors live at both ends (default cpu); cuda adds the GPU's "
        "device-to-device and pinned host-to-device copies as references (needs cupy: "
        "pip install 'tensorwire[gpu]')",
    )
    parser.add_argument(
        "--gloo",
        action="store_true",
        help="also measure what a PyTorch user writes without tensorwire: torch.distributed's "
        "send and recv over the gloo backend into tensors allocated once, each waited for "
        "('gloo') and pipelined ('gloo-isend', isend and irecv with as many buffers as a "
        "tensorwire receiver has slots), and gloo's round trip; 'vs gloo' is against the "
        "faster of the two (needs torch at both ends; host memory only)",
    )
    parser.add_argument(
        "--json", metavar="PATH", type=output_file, help="write the results as JSON"
    )
    parser.add_argument(
        "--plot",
        metavar="PATH.png",
        type=output_file,
        help="draw throughput against size (needs matplotlib: pip install 'tensorwire[bench]')",
    )
    parser.add_argument(
        "--markdown", metavar="PATH", type=output_file, help="write the tables as markdown"
    )
    parser.add_argument(
        "--secret-file", type=path, metavar="PATH", help="shared secret (or TENSORWIRE_SECRET)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress output")


def build_parser(prog: str = "tensorwire bench") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Throughput and latency of tensorwire's transports next to gRPC, a "
        "hand-written pyzmq loop, a raw socket and memcpy, measured in one interleaved run.",
    )
    add_version(parser)
    _common(parser)
    sub = parser.add_subparsers(dest="command", metavar="{run,serve,ps,soak,chaos}")
    run = sub.add_parser("run", help="run the sweep against a `bench serve` on another host")
    _common(run)
    run.add_argument(
        "--connect",
        required=True,
        metavar="tcp://HOST:PORT",
        help="the address `tensorwire bench serve` printed",
    )
    srv = sub.add_parser("serve", help="be the receiving end for `bench run` on another host")
    srv.add_argument(
        "--bind",
        default="tcp://127.0.0.1:5555",
        metavar="tcp://HOST:PORT",
        help="where to listen (default tcp://127.0.0.1:5555; use tcp://0.0.0.0:PORT "
        "to accept other hosts)",
    )
    srv.add_argument("--once", action="store_true", help="exit after the first runner")
    srv.add_argument(
        "--secret-file", type=path, metavar="PATH", help="shared secret (or TENSORWIRE_SECRET)"
    )
    add_metrics_flags(srv)
    add_logging_flags(srv)
    ps_bench.add_parser(sub)
    soak.add_parser(sub)
    chaos.add_parser(sub)
    return parser


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    if args.repeat < 1 or args.round_trips < 1:
        parser.error("--repeat and --round-trips must be at least 1")
    if args.messages < 0:
        parser.error("--messages must be 0 (automatic) or at least 1")
    if args.ring is not None and not 1 <= args.ring <= MAX_DEPTH:
        # (the receiver's own check raised ValueError past the bound: a traceback)
        parser.error(f"--ring must be at least 1 and at most {MAX_DEPTH}")
    if args.batch < 0 or args.batch == 1:
        parser.error("--batch must be 0 (off) or at least 2")
    if args.copy_threads < 1:
        parser.error("--copy-threads must be at least 1")
    try:
        device = tw_cuda.parse_device(args.device)
    except (ValueError, tw.TensorWireError) as exc:
        parser.error(f"--device {args.device}: {exc}")
    args.device = tw_cuda.describe_device(device)
    if args.plot:  # before the sweep: a plot refused after it lost nothing but time, all of it
        if not extras.installed(extras.BENCH_PLOTS):
            parser.error("--plot needs matplotlib: pip install 'tensorwire[bench]'")
        problem = report.plot_format_problem(args.plot)
        if problem:
            parser.error(f"--plot {args.plot}: {problem}")
    if args.transports is None:
        chosen = list(TRANSPORTS)
    else:
        try:
            chosen = parse_transports(args.transports)
        except ValueError as exc:
            parser.error(f"--transports: {exc}")
    problem = _memory_problem(args, chosen, on_host=device is None)
    if problem:
        parser.error(problem)
    return chosen


def _memory_problem(args: argparse.Namespace, transports: list[str], on_host: bool) -> str | None:
    """Why the sweep cannot fit in this machine's memory, or None. What it needs at least: each
    transport's receive slots (two per tensor, the least depth the receiver picks; --ring's
    otherwise), where both ends run here in host memory, and the runner's source and
    destination arrays (and the local peer's buffer). Before, --sizes 40G failed at the set-up
    with numpy's MemoryError, and sizes that the kernel overcommits got its OOM killer."""
    available = tw_region.room(shared=False)
    if available is None:
        return None
    here = args.command != "run"  # the peer (its slots and its buffer) runs on this machine
    depth = args.ring or 2
    receivers = len(transports) + getattr(args, "gloo", False)  # (gloo's buffers: as a ring's)
    slots = sum(receivers * depth * s for s in args.sizes) if here and on_host else 0
    arrays = 2 * sum(args.sizes) + (max(args.sizes) if here else 0)
    need = slots + arrays
    if need <= available:
        return None
    parts = "the source and destination arrays"
    if slots:
        parts = f"{depth} receive slots per tensor for each of {receivers} transports, {parts}"
    return (
        f"--sizes {','.join(human(s) for s in args.sizes)}: the sweep needs at least "
        f"{need / (1 << 30):.1f} GiB of memory here ({parts}), and this machine has "
        f"{available / (1 << 30):.1f} GiB available: choose smaller sizes"
        + (" or fewer transports" if slots else "")
    )


@contextlib.contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Callable[[str], None]]:
    if not enabled:
        yield lambda _: None
        return
    if sys.stderr.isatty():
        try:
            from rich.progress import Progress
        except ImportError:
            pass
        else:
            with Progress(transient=True) as bar:
                task = bar.add_task("measuring", total=total)
                yield lambda what: bar.update(task, advance=1, description=what)
            return
    done = [0]

    def line(what: str) -> None:
        done[0] += 1
        if done[0] % max(1, total // 10) == 0 or done[0] == total:
            print(f"  {done[0]}/{total} measurements ({what})", file=sys.stderr, flush=True)

    yield line


def _measure(
    args: argparse.Namespace, transports: list[str], connect: str, explicit: bool
) -> dict[str, Any]:
    runner = Runner(
        connect,
        transports,
        args.sizes,
        args.latency_size,
        ring=args.ring,
        shm=None if args.receiver_memory == "shared" else False,
        optional=not explicit,
        secret=args.secret,
        device=args.device,
        batch=args.batch,
        copy_threads=args.copy_threads,
        gloo=args.gloo,
    )
    try:
        usable = runner.transports
        gpu = GPU_REFERENCES if args.device != "cpu" else []
        torch_queue = [TORCH_QUEUE] if runner.torch_queue is not None else []
        raw_nixl = [RAW_NIXL] if runner.raw_nixl is not None else []
        gloo = [GLOO, GLOO_ISEND] if runner.gloo is not None else []
        split = [runner.split_memcpy] if runner.split_memcpy else []
        references = ["memcpy", *split, *gpu, *torch_queue]
        methods = [*references, *usable, *runner.batched, "zmq", "raw-tcp", *raw_nixl, *gloo]
        latency = [*usable, "zmq", "raw-tcp", *raw_nixl, *gloo[:1]]
        measured = sum(runner.measures(m, s) for m in methods for s in args.sizes)
        total = args.repeat * (measured + len(latency))
        with _progress(total, not args.no_progress) as tick:
            samples = sweep(
                runner,
                args.sizes,
                methods,
                latency,
                args.repeat,
                args.round_trips,
                tick,
                messages=args.messages,
            )
        result = {
            "schema": report.SCHEMA,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": args.command_line,
            "machine": machine_facts(),
            "peer_machine": runner.remote_machine,
            "config": {
                "sizes": args.sizes,
                "transports": usable,
                "references": [*REFERENCES, *split, *gpu, *raw_nixl, *gloo],
                "device": args.device,
                "repeat": args.repeat,
                "round_trips": args.round_trips,
                "messages": args.messages,
                "latency_bytes": args.latency_size,
                "ring": args.ring,
                "batch": args.batch,
                "copy_threads": args.copy_threads,
                "receiver_memory": args.receiver_memory,
                # set outside the command line, and each changes what a GPU row measures (None
                # in a run without GPU rows)
                "gpu_stream_stores": cuda_stores.enabled() if args.device != "cpu" else None,
                "mps": tw_cuda.mps_running() if args.device != "cpu" else None,
            },
            "notes": runner.notes,
        }
        result.update(summarise(samples, args.sizes, args.latency_size))
        return result
    finally:
        runner.close()


def _local_peer(parent: int, ready: Any, secret: str | None) -> None:
    """The sweep's receiving end on this host, in a child that dies with the sweep: one whose
    sweep was SIGKILLed waited for its commands for ever, holding its shared memory."""
    die_with_parent(parent)
    serve("tcp://127.0.0.1:0", ready, True, secret)


def _local(args: argparse.Namespace, transports: list[str], explicit: bool) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_local_peer, args=(os.getpid(), there, args.secret), daemon=True)
    proc.start()
    try:
        if not here.poll(60):
            raise tw.TensorWireError("the local benchmark peer did not start")
        return _measure(args, transports, here.recv(), explicit)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()


def _secret(parser: argparse.ArgumentParser, args: argparse.Namespace, endpoint: str) -> str | None:
    """The shared secret; required when this end listens beyond loopback."""
    from tensorwire.job.config import is_loopback, read_secret_file

    secret = os.environ.get("TENSORWIRE_SECRET") or None
    if getattr(args, "secret_file", None):
        secret = read_secret_file(parser, args.secret_file, also=(secret, "TENSORWIRE_SECRET"))
    if secret is None and not is_loopback(endpoint):
        parser.error(
            f"{endpoint} is reachable from other hosts, so a shared secret is required: "
            "--secret-file PATH or TENSORWIRE_SECRET (the same on both ends)"
        )
    return secret


#: what ends `bench serve` as Ctrl-C does (SIGTERM: `docker stop`, a process manager)
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`bench serve` until Ctrl-C or SIGTERM, which end it cleanly (exit 0) at any moment.

    Both signals are held while it starts (threads, sockets, the metrics server) and delivered
    as soon as it serves: one that came earlier would interrupt the set-up half way, leaving a
    socket that no ``finally`` closes, and the interpreter's exit could then wait for it
    forever (seen once in the test suite under load: a Ctrl-C right after the metrics server
    answered, and the process still there 30 s later)."""

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # SIGINT too, and not only Python's default: a shell that starts `bench serve &` leaves
    # SIGINT ignored, and `kill -INT` should still stop it, as it stops the daemons
    for signum in _STOP_SIGNALS:
        signal.signal(signum, stop)
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)  # threads started now inherit it
    scrape = None
    try:
        setup_logging(args.log_level, "bench-serve", args.log_format)
        secret = _secret(parser, args, args.bind)
        scrape = start_metrics(args, args.bind)
        serve(
            args.bind,
            once=args.once,
            secret=secret,
            started=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS),
        )
    except KeyboardInterrupt:
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # a signal held still ends us
        with contextlib.suppress(KeyboardInterrupt):
            if scrape is not None:
                scrape.close()
    return 0


def main(argv: list[str] | None = None, prog: str = "tensorwire bench") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    # what the user typed, for the report (argv is None when run as `python -m tensorwire.bench`)
    args.command_line = " ".join([prog, *(sys.argv[1:] if argv is None else argv)])
    try:
        if args.command == "serve":
            return _serve(parser, args)
        whole_jobs = {
            "ps": ps_bench,
            "soak": soak,
            "chaos": chaos,
        }  # each: run(args, parser), render(result)
        if args.command in whole_jobs:
            job = whole_jobs[args.command]
            result = job.run(args, parser)
            print(job.render(result))
            if args.json:
                report.write_json(args.json, result)
            return 1 if result.get("problems") else 0
        transports = _check(parser, args)
        explicit = args.transports is not None
        args.secret = _secret(parser, args, getattr(args, "connect", "tcp://127.0.0.1:0"))
        if args.command == "run":
            result = _measure(args, transports, args.connect, explicit)
        else:
            result = _local(args, transports, explicit)
    except (tw.TensorWireError, RuntimeError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    report.print_tables(result)
    if args.json:
        report.write_json(args.json, result)
    if args.plot:
        report.plot(args.plot, result)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.markdown(result))
    return 0
