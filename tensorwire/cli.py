"""The ``tensorwire`` command: one entry point for the demo, the benchmarks and facts about the
installation."""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__
from .job.argtypes import add_version

#: UCX transport names that move bytes with RDMA verbs (InfiniBand, RoCE) or other NIC offload.
RDMA_TRANSPORTS = frozenset(
    {"rc", "rc_verbs", "rc_mlx5", "dc", "dc_mlx5", "ud", "ud_verbs", "ud_mlx5", "srd", "gga"}
)


def _info(argv: list[str]) -> int:
    # a parser of its own, with no options: `info --help` says what it does, and an argument
    # given by mistake is refused instead of ignored
    parser = argparse.ArgumentParser(
        prog="tensorwire info",
        description="What this installation can do: its transports, shared memory, GPUs, NIXL "
        "and UCX's transports.",
    )
    add_version(parser)
    parser.parse_args(argv)
    from .doorbell import HAVE_FUTEX
    from .extras import GRPC, installed
    from .process import host_identity
    from .region import SHM_DIR, shm_available
    from .transports import CHANNELS

    print(f"tensorwire {__version__} (Python {sys.version.split()[0]})")
    print(f"libraries: {_libraries()}")
    print(f"transports: {', '.join(CHANNELS)}")
    grpc = "installed" if installed(GRPC) else "not installed (pip install 'tensorwire[grpc]')"
    print(f"grpc baseline: {grpc}")
    print(f"shared memory: {SHM_DIR} {'usable' if shm_available() else 'NOT usable (tcp only)'}")
    print(f"futex doorbells: {'yes' if HAVE_FUTEX else 'no (waiters poll with short sleeps)'}")
    print(f"host identity: {host_identity()}")
    print(f"open files: {_open_files()}")
    _gpu_info()
    _nixl_info()
    return 0


def _open_files() -> str:
    """This process's limits of open files, and the workers a parameter server can take under
    the hard one (the daemons raise their soft limit to it as they start): what an operator
    whose server ran out of descriptors needs to see."""
    import resource

    from .job.limits import BASE, PER_PEER

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def said(limit: int) -> str:
        return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)

    line = f"soft limit {said(soft)}, hard {said(hard)}"
    if hard == resource.RLIM_INFINITY:
        return line
    nixl, others = ((hard - BASE) // PER_PEER[t] for t in ("nixl", "tcp"))
    return (
        f"{line} (tensorwire-ps and tensorwire-worker raise theirs to the hard one: enough "
        f"for a server of about {max(others, 0)} workers, {max(nixl, 0)} over nixl)"
    )


def _libraries() -> str:
    """The versions of the libraries the core runs on, and of the gRPC baseline's, PyTorch and
    Ray where they are installed (read from their metadata: torch is not imported for it): what
    a report of a problem needs (libzmq's own version too, as pyzmq's wheels bundle it and
    behave by it: a bind to a name with IPv6 addresses alone failed with 4.3.4; torch before 2.3
    converts no array under numpy 2)."""
    from importlib import metadata

    import zmq

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    found = [f"numpy {version('numpy')}", f"pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()})"]
    found += [
        f"{d} {v}"
        for d in ("msgpack", "ml_dtypes", "grpcio", "protobuf", "torch", "ray")
        if (v := version(d))
    ]
    return ", ".join(found)


def _gpu_info() -> None:
    from .cuda import INSTALL_HINT, describe

    gpu = describe()
    if gpu["cupy"] is None:
        print(f"gpu tensors: cupy not installed ({INSTALL_HINT})")
        return
    versions = f"cupy {gpu['cupy']}, CUDA runtime {gpu.get('runtime', '?')}"
    if "error" in gpu:
        print(f"gpu tensors: {versions}; no usable CUDA device ({gpu['error']})")
        return
    print(f"gpu tensors: {versions}, driver {gpu['driver']}")
    for device in gpu["devices"]:
        memory = device["memory"] / 2**30
        print(f"  cuda:{device['index']}: {device['name']}, {memory:.0f} GiB")
    if not gpu["devices"]:
        print("  no CUDA device")
        return
    from .cuda import mps_running

    print(
        "mps: "
        + (
            "running (processes on one GPU share it instead of taking turns)"
            if mps_running()
            else "not running (processes on one GPU take turns; nvidia-cuda-mps-control -d)"
        )
    )
    from . import cuda_stores

    reason = cuda_stores.unavailable_reason(0)
    asked = "on" if cuda_stores.enabled() else f"off ({cuda_stores.ENV}=0)"
    print(
        "gpu-made completion stores (shm): "
        + (f"work on cuda:0, {asked}" if reason is None else f"unavailable on cuda:0: {reason}")
    )


def _nixl_info() -> None:
    from .rdma import INSTALL_HINT, NixlOptions, describe, shared_memory_notifications

    nixl = describe()
    if not nixl["available"]:
        print(f"nixl: not installed ({INSTALL_HINT})")
        return
    print(f"nixl: {nixl['module']} {nixl['version']}, plugins: {', '.join(nixl['plugins'])}")
    if "ucx_error" in nixl:
        print(f"ucx: {nixl['ucx_error']}")
        return
    print(f"ucx: {nixl['ucx_version']}, transports: {', '.join(nixl['ucx_transports'])}")
    verbs = [t for t in nixl["ucx_transports"] if t.split("/")[0] in RDMA_TRANSPORTS]
    print(
        "rdma verbs: "
        + (", ".join(verbs) if verbs else "none (nixl runs over UCX's shared-memory and tcp here)")
    )
    gpu = [t for t in nixl["ucx_transports"] if t.startswith(("cuda", "gdr"))]
    print(
        "ucx gpu transports: "
        + (", ".join(gpu) if gpu else "none (nixl moves host memory only here)")
    )
    # what an agent made now with default options would do (an exported setting counts)
    shared = shared_memory_notifications(NixlOptions(), loopback=True)
    print(
        "nixl notifications within this host: "
        + (
            "UCX's shared-memory queue (UCX_MM_ERROR_HANDLING=y: faster, but a process killed "
            "mid-message can leave a receiver deaf for good; docs/rdma.md)"
            if shared
            else "tcp/lo (UCX_MM_ERROR_HANDLING=n: safe against a process killed mid-message)"
        )
    )


def _keys(argv: list[str]) -> int:
    from .curve import generate
    from .errors import TensorWireError

    parser = argparse.ArgumentParser(
        prog="tensorwire keys",
        description="Make a CURVE key pair for a job's control plane (--curve-keys DIR).",
    )
    add_version(parser)
    parser.add_argument("directory", help="where to write server.key and server.key_secret")
    parser.add_argument(
        "--force", action="store_true", help="replace a key pair already in the directory"
    )
    args = parser.parse_args(argv)
    try:
        public, secret = generate(args.directory, overwrite=args.force)
    except TensorWireError as exc:
        print(f"tensorwire keys: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # (its errno and repr said less: "[Errno 13] ...: '/x'")
        where = exc.filename or args.directory
        print(f"tensorwire keys: error: cannot write in {where}: {exc.strerror}", file=sys.stderr)
        return 1
    print(
        f"public key {public}\nsecret key {secret} (mode 0600): copy the directory to every "
        "host of the job"
    )
    return 0


def _ping(argv: list[str]) -> int:
    from .endpoint import ipv6_hint, split_endpoint, zeromq_greeting_problem
    from .job.argtypes import positive_seconds  # light: a health check runs every few seconds

    parser = argparse.ArgumentParser(
        prog="tensorwire ping",
        description="Exit 0 if a daemon's endpoint (tcp://HOST:PORT) accepts a connection and "
        "greets it as a tensorwire control plane does (ZeroMQ's greeting, sent before any "
        "authentication), else 1 with one line: a health check for containers and scripts. A "
        "stopped (frozen) daemon, whose kernel still accepts connections, fails it, as does "
        "another service on the port.",
    )
    add_version(parser)
    parser.add_argument("endpoint", help="e.g. tcp://127.0.0.1:5700 (a --bind of a daemon)")
    parser.add_argument("--timeout", type=positive_seconds, default=2.0, help="seconds (default 2)")
    args = parser.parse_args(argv)
    split = split_endpoint(args.endpoint)
    if split is None:
        parser.error(
            f"endpoint must look like tcp://HOST:PORT, got {args.endpoint!r}"
            f"{ipv6_hint(args.endpoint)}"
        )
    problem = zeromq_greeting_problem(split, args.timeout)
    if problem is not None:
        print(f"tensorwire ping: {args.endpoint}: {problem}", file=sys.stderr)
        return 1
    return 0


COMMANDS = ["demo", "bench", "ps", "worker", "ray-job", "top", "keys", "ping", "info", "export"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="tensorwire",
        description="Zero-copy, RDMA-style tensor transport. Commands: demo, bench, keys, ps (a "
        "parameter-server shard), worker (a training worker), ray-job (a whole job on a Ray "
        "cluster), top (live view of running daemons), ping (health check), info, export (a "
        "model's parameters from its servers' checkpoints).",
    )
    add_version(parser)
    parser.add_argument(
        "command",
        choices=COMMANDS,
        help="what to run",
    )
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of the command")
    if not args:
        parser.print_usage(sys.stderr)
        print(
            "tensorwire: error: name a command: demo (train a model with a local parameter "
            "server), bench, ps, worker, ray-job, top, keys, ping, info or export; `tensorwire "
            "COMMAND --help` for its options",
            file=sys.stderr,
        )
        return 2
    ns = parser.parse_args(args)
    try:
        code = _run(ns.command, ns.rest)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except BrokenPipeError:
        # Output piped into a reader that closed early (`tensorwire info | head -2`): the
        # Python documentation's way, stdout pointed at /dev/null so that the interpreter's
        # last flush cannot fail too; 141 is what a shell reports for SIGPIPE.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _run(command: str, rest: list[str]) -> int:
    """Run ``command`` with its arguments ``rest``."""
    if command == "demo":
        from .client.demo import main as demo  # the main job: a parameter server and workers

        return demo(rest)
    if command == "ps":
        from .server.daemon import main as ps

        return ps(rest, prog="tensorwire ps")
    if command == "worker":
        from .client.worker import main as worker

        return worker(rest, prog="tensorwire worker")
    if command == "ray-job":
        from .ray import main as ray_job

        return ray_job(rest)
    if command == "top":
        from .top import main as top

        return top(rest)
    if command == "export":
        from .server.export import main as export  # the parameters from checkpoints

        return export(rest)
    if command == "keys":
        return _keys(rest)
    if command == "ping":
        return _ping(rest)
    if command == "bench":
        from .bench.cli import main as bench

        return bench(rest)
    return _info(rest)


if __name__ == "__main__":
    raise SystemExit(main())
