"""Doorbells: how one side of a ring sleeps until the other side has done something.

A doorbell is a 32-bit word in shared memory plus a "waiting" flag beside it. The side that makes
progress stores its result (a sequence number, a released count), then stores a new value into the
doorbell word and, if the flag is up, calls ``futex(FUTEX_WAKE)`` on it. The side that waits
:func:`wait_for` a condition in three phases, because on a 2-core machine each has its place:

1. spin for a few microseconds: the answer is usually already on its way (ping-pong latency);
2. ``sched_yield`` for a while: give the core to the peer instead of starving it;
3. raise the flag and block in ``futex(FUTEX_WAIT)`` on the doorbell word: an idle waiter uses no
   CPU. The kernel compares the word before sleeping, so a ring between reading it and sleeping is
   never lost. The flag/doorbell handshake is not fenced from Python, so a wake-up could in theory
   slip past on a store buffer; each block is therefore capped at ``MAX_BLOCK`` seconds, after which
   the condition is checked again.

The futex is a plain syscall through ``ctypes`` (which releases the GIL). Shared (non-private)
futexes work across processes that map the same file. Where futexes are unavailable the block
phase degrades to short sleeps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import math
import os
import platform
import time
from collections.abc import Callable
from typing import TypeVar

from .checks import MAX_SECONDS
from .errors import WireTimeoutError

T = TypeVar("T")

SPIN_SECONDS = 20e-6
YIELD_SECONDS = 200e-6
MAX_BLOCK = 0.05

_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98, "ppc64le": 221}.get(
    platform.machine().lower()
)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    _syscall = _libc.syscall
    _syscall.restype = ctypes.c_long
except (OSError, AttributeError):  # pragma: no cover - non-glibc platforms
    _SYS_FUTEX = None

HAVE_FUTEX = _SYS_FUTEX is not None and os.uname().sysname == "Linux"


def futex_wait(address: int, expected: int, timeout: float) -> None:
    """Sleep while the u32 at ``address`` equals ``expected``, at most ``timeout`` seconds."""
    if not HAVE_FUTEX:
        time.sleep(min(timeout, 0.001))
        return
    ts = _Timespec(int(timeout), int((timeout % 1.0) * 1e9))
    res = _syscall(
        _SYS_FUTEX,
        ctypes.c_void_p(address),
        _FUTEX_WAIT,
        ctypes.c_uint32(expected),
        ctypes.byref(ts),
        None,
        0,
    )
    if res == -1:
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
            raise OSError(err, os.strerror(err))


def futex_wake(address: int) -> None:
    """Wake every waiter blocked on the u32 at ``address``."""
    if HAVE_FUTEX:
        _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)


_SYS_MEMBARRIER = {"x86_64": 324, "amd64": 324, "aarch64": 283, "arm64": 283}.get(
    platform.machine().lower()
)
_MEMBARRIER_CMD_GLOBAL = 1  # every running thread of every process executes a full barrier


def barrier_everywhere() -> None:
    """A full memory barrier on every CPU (membarrier(2)), for the slow side of a handshake
    whose fast side issues none. Where the call is missing or refused (old kernels, seccomp), a
    short sleep stands in: stores left in a store buffer drain within microseconds."""
    if (
        HAVE_FUTEX
        and _SYS_MEMBARRIER is not None
        and _syscall(_SYS_MEMBARRIER, _MEMBARRIER_CMD_GLOBAL, 0, 0) == 0
    ):
        return
    time.sleep(0.001)


def check_timeout(timeout: float | None) -> float | None:
    """A timeout must be None (block), 0 (poll) or positive seconds: ValueError otherwise. NaN
    too, which compares false with everything: a deadline made of it never passes, and a wait
    on it would block for ever. Returns it, infinity as None: it blocks too, and the clocks,
    sockets and gRPC calls a timeout reaches take no infinite one (a `tcp` connect raised
    OverflowError, a gRPC write timed out at once)."""
    if timeout is None:
        return None
    try:
        if timeout >= 0 and timeout.__class__ is not bool:
            if timeout == math.inf:
                return None
            if timeout <= MAX_SECONDS:
                return timeout
    except TypeError:  # a string: "'>=' not supported between instances of 'str' and 'int'"
        pass
    raise ValueError(
        f"timeout must be None, 0 or positive seconds (at most {MAX_SECONDS:g}; None or "
        f"infinity: no limit), got {timeout!r}"
    )


def deadline_of(timeout: float | None) -> float | None:
    """The monotonic deadline for a timeout: None (or infinity) blocks, 0 polls, > 0 is
    seconds."""
    timeout = check_timeout(timeout)
    if timeout is None:
        return None
    return time.monotonic() + timeout


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (never negative; None: no deadline)."""
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def wait_for(
    check: Callable[[], T | None],
    *,
    bell: memoryview,
    bell_index: int,
    bell_address: int,
    flag: memoryview,
    flag_index: int,
    deadline: float | None,
    what: Callable[[], str],
    busy: bool = True,
    resting: Callable[[], object] | None = None,
    max_block: float = MAX_BLOCK,
    coming: Callable[[], bool] | None = None,
    watch: float = 0.0,
    coming_block: float | None = None,
) -> T:
    """Return the first non-None value of ``check()``, waiting spin -> yield -> futex.

    ``bell``/``flag`` are u32 memoryviews; ``bell_address`` is the doorbell word's address.
    ``busy=False`` skips the spin and yield phases: right when the progress we wait for is made by
    a thread of this very process (a network transport's receive thread), which a spinning waiter
    would only slow down by holding the GIL and a core.
    ``resting`` is called once, as the waiter stops spinning and goes to sleep on the futex.
    ``max_block``: the longest sleep before ``check`` is looked at again.
    ``coming``: true while progress that rings nobody is known to be on its way (a GPU store the
    writer has queued); the waiter then yields the CPU instead of sleeping, for ``watch`` seconds
    at most in all, and after that sleeps no longer than ``coming_block`` at a time while it is
    still coming (``max_block`` otherwise).
    Raises :class:`WireTimeoutError` (message from ``what()``) at the deadline; ``check`` may raise
    to end the wait early (closed, peer lost).
    """
    result = check()
    if result is not None:
        return result
    start = time.monotonic()
    if deadline is not None and start >= deadline:
        raise WireTimeoutError(what())
    spin_end = start + (SPIN_SECONDS if busy else 0.0)
    while time.monotonic() < spin_end:
        result = check()
        if result is not None:
            return result
    yield_end = start + (YIELD_SECONDS if busy else 0.0)
    while (now := time.monotonic()) < yield_end:
        os.sched_yield()
        result = check()
        if result is not None:
            return result
    if resting is not None:
        resting()
    while True:
        if deadline is not None and now >= deadline:
            raise WireTimeoutError(what())
        if watch > 0 and coming is not None and coming():
            # not flagged as asleep meanwhile: nobody need wake us
            watch_end = now + watch
            watch = 0.0  # once per wait: a store that never lands must not keep us up
            while (now := time.monotonic()) < watch_end and (deadline is None or now < deadline):
                os.sched_yield()
                result = check()
                if result is not None:
                    return result
                if not coming():
                    break
            continue
        seen = bell[bell_index]
        flag[flag_index] = flag[flag_index] + 1
        try:
            result = check()
            if result is not None:
                return result
            due = coming is not None and coming()
            if due and watch > 0:
                continue  # queued since we last looked: watch for it (the flag comes down)
            limit = min(max_block, coming_block) if due and coming_block is not None else max_block
            block = limit if deadline is None else min(limit, max(deadline - now, 0.0))
            futex_wait(bell_address, seen, block)
        finally:
            flag[flag_index] = max(flag[flag_index] - 1, 0)
        result = check()
        if result is not None:
            return result
        now = time.monotonic()


def ring_bell(
    bell: memoryview, bell_index: int, bell_address: int, flag: memoryview, flag_index: int
) -> None:
    """Announce progress: change the doorbell word, and wake sleepers if any are flagged."""
    bell[bell_index] = (bell[bell_index] + 1) & 0xFFFFFFFF
    if flag[flag_index]:
        futex_wake(bell_address)
