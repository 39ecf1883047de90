"""Small pieces both sides of a benchmark share: sizes, names, sockets, machine facts, and the
command channel's authentication."""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import platform
import shutil
import signal
import socket
from collections.abc import Callable
from importlib import metadata
from typing import Any

import tensorwire as tw
from tensorwire.checks import check_distinct

MiB = 1 << 20
#: batches are measured up to this size: above it a message's time is its copy, not its calls
BATCH_MAX_BYTES = MiB
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``4K``, ``16M``, ``1G``, ``64KiB`` or plain bytes."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        value = int(float(t[:-1]) * _UNITS[t[-1]]) if t and t[-1] in _UNITS else int(t)
    except (ValueError, KeyError):
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 4K, 16M, 1G)")
    return value


def parse_sizes(text: str) -> list[int]:
    """A ``--sizes`` list, each size once (a size given twice, also as ``4K,4096``, failed the
    sweep at its start: "tensor 'shm/4096' is already registered")."""
    sizes = [parse_size(s) for s in text.split(",") if s.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError("no sizes given")
    repeated = sorted({s for s in sizes if sizes.count(s) > 1})
    if repeated:
        names = ", ".join(human(s) for s in repeated)
        raise argparse.ArgumentTypeError(f"the list names {names} more than once")
    return sizes


def parse_transports(text: str, *, distinct: bool = True) -> list[str]:
    """A ``--transports`` list of tensorwire's transports ("auto" is no transport of its own),
    each at most once where ``distinct`` (a soak cycles its list over its senders, so a
    transport may come back). ValueError says what is wrong; the bench commands each parsed it
    their own way, and a transport given twice failed the sweep with "tensor 'shm/pong' is
    already registered"."""
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    known = [t for t in tw.TRANSPORT_NAMES if t != "auto"]
    unknown = [t for t in chosen if t not in known]
    if unknown or not chosen:
        raise ValueError(
            f"unknown transport(s) {', '.join(unknown) or '(none given)'}; choose from "
            f"{', '.join(known)}"
        )
    if distinct:
        check_distinct("the list", chosen)
    return chosen


def human(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def tensor_name(transport: str, what: int | str) -> str:
    """Each transport writes its own tensors: a tensor has one writer at a time."""
    return f"{transport}/{what}"


def batch_tensor_names(transport: str, size: int, batch: int) -> list[str]:
    """The tensors a batch row of ``transport`` writes together at ``size``."""
    return [tensor_name(transport, f"{size}-{i}") for i in range(batch)]


def tune_socket(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, 4 * MiB)


def raw_recv(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], len(view) - got, socket.MSG_WAITALL)
        if n == 0:
            raise ConnectionError("raw benchmark connection closed")
        got += n


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_facts() -> dict[str, Any]:
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "machine": platform.machine(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": {
            d: _version(d) for d in ("tensorwire", "numpy", "pyzmq", "grpcio", "protobuf")
        },
    }


def command_mac(secret: str, nonce: bytes, counter: int, body: bytes) -> bytes:
    """The proof that a command of the benchmark's channel comes from a holder of the secret:
    HMAC-SHA256 over the server's nonce (new at each hello), the command's number since that
    hello (a command replayed, or replayed to another server, does not verify) and its bytes."""
    message = b"tensorwire-bench" + nonce + counter.to_bytes(8, "big") + body
    return hmac.new(secret.encode(), message, hashlib.sha256).digest()


#: what runs a command as if on a machine of its own (``--hosts separate`` of ``bench chaos``
#: and ``bench soak``): pid 1 of a pid and mount namespace of its own, so that its host identity
#: differs, killed with the unshare process that runs it. SIGKILL goes to unshare (see
#: :func:`signal_target`); other signals to the process it runs. setpriv (util-linux, as
#: unshare) has the kernel kill unshare when the run that started it dies, however it dies
#: (``process.die_with_parent``: the process unshare runs is pid 1 of its namespace, and
#: cannot ask it for itself); it then execs unshare, in the same process.
UNSHARE = ["setpriv", "--pdeathsig", "KILL", "unshare", "--pid", "--kill-child", "--mount-proc"]


def signal_target(sig: int, unshare_pid: int, inner_pid: Callable[[], int | None]) -> int:
    """The pid to send ``sig`` to, for a process started through :data:`UNSHARE` (its pid
    ``unshare_pid``; ``inner_pid`` finds the process it runs). SIGKILL kills unshare, and
    ``--kill-child`` kills the process it runs at once: killed itself, unshare (util-linux 2.38)
    failed to raise SIGKILL again, said "unshare: sigprocmask unblock failed: Invalid argument"
    on the run's stderr for every kill, and exited 1. Other signals (a freeze, a stop) are for
    the process it runs."""
    if sig == signal.SIGKILL:
        return unshare_pid
    return inner_pid() or unshare_pid


def hosts_problem(hosts: str, transports: list[str]) -> str | None:
    """Why ``--hosts`` cannot be had here with ``transports``, or None."""
    if hosts != "separate":
        return None
    if "shm" in transports:
        return "--hosts separate: shm does not reach across hosts; leave it out"
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None:
        return "--hosts separate: needs root, and unshare(1) and setpriv(1) (util-linux)"
    return None
