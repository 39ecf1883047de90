"""The open-file limit a job's daemons need, which they raise at start.

Every peer costs a process file descriptors: sockets, and over ``nixl`` the UCX contexts of
NIXL's agents. Measured on the project's VM (docs/open-files-2026-12-02/): a sender holds 4
per receiver over ``shm``, ``tcp`` and ``grpc`` and 21 over ``nixl`` (two agents a channel);
a receiver 3-4 per sender, 5.4 over ``nixl``. A parameter server is both to each of its
workers, so over ``nixl`` it holds about 27 a worker: by that count, with the soft limit of
1024 that many distributions and systemd's services start with, a server runs out near 33
workers. One that ran out (4 workers at a soft limit of 128, 12 at 256) failed saying a worker
"does not answer" (the NIXL agent or the socket for it could not be made), amid UCX's and
ZeroMQ's "Too many open files".

The daemons raise their soft limit to the hard one as they start (Go's runtime does the same
since Go 1.19, for the same reason): an unprivileged process may, and nothing here uses
``select()``, whose sets stop at descriptor 1024. A server whose hard limit is still short of
what its workers need says so at start, naming the remedy, instead of failing as they join.
"""

from __future__ import annotations

import logging
import resource

#: Descriptors a process holds for each peer it both writes to and is written by (a parameter
#: server and each worker; a worker and each server), by transport: the sender's and the
#: receiver's side measured (docs/open-files-2026-12-02/fds.txt), rounded up. ``auto`` picks
#: ``shm`` or ``tcp``.
PER_PEER = {"auto": 8, "shm": 8, "tcp": 8, "grpc": 8, "grpc-stream": 8, "nixl": 28}

#: Descriptors a daemon holds before its first peer, and some to spare: its imports, ZeroMQ's
#: context, the metrics endpoint, checkpoints and logs being written. A server over ``nixl``
#: with 4 workers failed at a soft limit of 128 and formed at 160.
BASE = 128

#: The soft limit set where the hard one is unlimited (Linux's own ceiling, ``fs.nr_open``, is
#: 1048576 unless raised, and the kernel refuses a soft limit above it)
UNLIMITED_HARD_TARGET = 1 << 20


def raise_open_files_limit() -> tuple[int | None, int | None]:
    """Raise this process's soft limit of open files to its hard limit (to 2**20 where that is
    unlimited); ``(before, after)``, equal where it was there already or could not be raised."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None, None
    target = UNLIMITED_HARD_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # (a hard limit above fs.nr_open: the kernel's own ceiling)
        return soft, soft
    return soft, target


def open_files_needed(peers: int, transport: str) -> int:
    """About how many descriptors a daemon with ``peers`` peers over ``transport`` holds."""
    return BASE + peers * PER_PEER.get(transport, max(PER_PEER.values()))


def open_files_shortfall(peers: int, transport: str, whose: str) -> str | None:
    """What to tell the operator where ``peers`` peers over ``transport`` need more descriptors
    than this process may open (``whose``: the peers, as the sentence names them); None where
    they fit."""
    limit, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = open_files_needed(peers, transport)
    if limit == resource.RLIM_INFINITY or need <= limit:
        return None
    return (
        f"{whose} over {transport} need about {need} open files here, and this process may open "
        f"{limit} (`ulimit -n`; its hard limit, `ulimit -Hn`: {hard}): the job would fail as they "
        f'join, with "Too many open files". Raise it to {need} or more where the daemon starts '
        f"(`ulimit -n {need}` as root, `docker run --ulimit nofile={need}`, compose's `ulimits: "
        "nofile:`, systemd's `LimitNOFILE=`)"
    )


def open_files_at_start(whose: str, peers: int, transport: str) -> None:
    """A daemon's start: raise the limit (logged), then warn where ``peers`` peers over
    ``transport`` (``whose``, as the warning names them) need more than it allows."""
    log = logging.getLogger("tensorwire.limits")
    before, after = raise_open_files_limit()
    if after != before:
        log.info("open-file limit raised from %s to %s (the hard limit)", before, after)
    shortfall = open_files_shortfall(peers, transport, whose)
    if shortfall is not None:
        log.warning(shortfall)
