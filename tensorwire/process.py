"""Facts about local processes: which host and namespaces we share, whether a peer lives, and
whether this process is out of file descriptors.

The shared-memory transport is only correct between processes that see the same ``/dev/shm`` and
the same pids, so the control-plane hello carries a *host identity* (boot id plus the mount, IPC
and pid namespaces). A :class:`ProcessWatch` follows a same-host peer through a pidfd, which, unlike
a bare pid, cannot be fooled by pid reuse.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import select
import socket
import time
from collections.abc import Callable


def host_identity() -> str:
    """A string equal for two processes exactly when they share boot, mounts, IPC and pids."""
    parts = []
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
    except OSError:
        parts.append(socket.gethostname())
    for ns in ("mnt", "ipc", "pid"):
        try:
            parts.append(os.readlink(f"/proc/self/ns/{ns}"))
        except OSError:
            parts.append(f"{ns}:?")
    return "/".join(parts)


def open_files_hint() -> str:
    """Where this process has (nearly) all the files open that it may: a clause saying so, for
    an error it may be the cause of (a socket, or a NIXL agent, that could not be made; a
    connection that never came up); else "". Without it a server out of descriptors said its
    workers "do not answer" (docs/open-files-2026-12-02/)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError as exc:  # (listing them takes a descriptor too: none left says it all)
        if exc.errno != errno.EMFILE:
            return ""
        in_use = soft
    # (near, not at: what the failed attempt had opened is closed again by the time we look)
    if soft == resource.RLIM_INFINITY or in_use + max(32, soft // 10) < soft:
        return ""
    return (
        f" (this process has {in_use} files open, of the {soft} it may: raise its limit, "
        "`ulimit -n`; tensorwire-ps and tensorwire-worker raise theirs to the hard limit)"
    )


class ProcessWatch:
    """Tells whether a process on this host is still alive (through a pidfd where possible)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = None
        self._dead = False
        self._poll: select.poll | None = None
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._dead = True
        except (AttributeError, OSError):
            self._fd = None  # no pidfd here: fall back to signal 0 (pid reuse is then possible)
        else:
            self._poll = select.poll()
            self._poll.register(self._fd, select.POLLIN)

    def alive(self) -> bool:
        if self._dead:
            return False
        poll = self._poll  # once: close() in another thread may clear it
        if poll is not None:
            # RuntimeError: another thread polls it at this moment, and its answer will do
            with contextlib.suppress(RuntimeError):
                self._dead = bool(poll.poll(0))  # a pidfd becomes readable when the process exits
        else:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self._dead = True
            except PermissionError:
                pass
        return not self._dead

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._poll = None


def first_child(pid: int, timeout: float, running: Callable[[], bool]) -> int | None:
    """The pid of the first child of process ``pid`` (the process ``unshare --fork`` runs a
    command in, which signals must reach), once it has one; None if it has none within
    ``timeout`` seconds, or once ``running()`` is False."""
    deadline = time.monotonic() + timeout
    while running():
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids = f.read().split()
        except OSError:
            kids = []
        if kids:
            return int(kids[0])
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)
    return None
