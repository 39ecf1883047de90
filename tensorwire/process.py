"""Facts about local processes: which host and namespaces we share, whether a peer lives,
whether this process is out of file descriptors; and a child's end with its parent.

The shared-memory transport is only correct between processes that see the same ``/dev/shm`` and
the same pids, so the control-plane hello carries a *host identity* (boot id plus the mount, IPC
and pid namespaces). A :class:`ProcessWatch` follows a same-host peer through a pidfd, which, unlike
a bare pid, cannot be fooled by pid reuse.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import select
import signal
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


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: Set by a launcher, for the daemons it starts, to its pid (:func:`for_my_children`); a
#: daemon reads and removes it as it starts (:func:`die_with_launcher`)
PARENT_VARIABLE = "TENSORWIRE_DIE_WITH_PARENT"


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent, ``parent`` (the pid the parent
    gave: read here, it could already be a reaper's), dies, however it dies. A benchmark or
    launcher that was SIGKILLed (the OOM killer, ``timeout -s KILL``) left its children
    running: a benchmark's receiving peer waited for commands for ever, holding its shared
    memory, and a child it had frozen stayed stopped. Call it first thing in the child. The
    kernel goes by the *thread* that started the child: start it from one that lives as long
    as the child should. Segments a killed receiver leaves in /dev/shm are reaped by the next
    receiver made on the host. Nothing happens where prctl is missing (not Linux), nor in
    the first process of a pid namespace (``unshare --pid``: its parent is outside, pid 0)."""
    if os.getppid() == 0:
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the line above, which then covers nothing
        os.kill(os.getpid(), signal.SIGKILL)


def for_my_children(env: dict[str, str]) -> dict[str, str]:
    """``env`` for daemons this process starts and that are to die with it (they call
    :func:`die_with_launcher`). Through the environment, not ``Popen(preexec_fn=...)``: that
    runs Python between fork and exec, which is unsafe where threads run (Ray's actors), and
    runs the fork handlers of every library loaded in the parent too (in a test process with
    Ray's driver and grpc loaded, an eventfd was left open in the parent)."""
    return {**env, PARENT_VARIABLE: str(os.getpid())}


def die_with_launcher() -> None:
    """In a daemon, first thing: die with the launcher that asked for it
    (:func:`for_my_children`), if that is its parent. The variable is removed, so that what
    this process starts in turn does not take it for its own. A launcher that still runs but
    is not the parent (its environment handed to a shell that started the daemon) is not
    followed: die_with_parent would read that as a parent already dead, and kill the daemon;
    one that is gone is (the daemon ends, as its launcher did)."""
    value = os.environ.pop(PARENT_VARIABLE, "")
    if not value.isdigit():
        return
    launcher = int(value)
    if os.getppid() != launcher:
        try:
            os.kill(launcher, 0)
        except ProcessLookupError:
            pass  # gone before we got here: die_with_parent ends us
        except PermissionError:
            return  # it runs, as another user: not ours to follow
        else:
            return  # it runs, and is not our parent
    die_with_parent(launcher)
