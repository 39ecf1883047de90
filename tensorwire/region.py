"""Registered memory regions: shared-memory slabs that a receiver owns and senders may map.

A region is a POSIX shared-memory file (``/dev/shm``) created with ``O_EXCL`` and mode 0600, named
``tensorwire.<uid>.<pid>.<start-time>.<128 random bits>`` so it is private to the user and not
guessable. Its pages are allocated and mapped up front (``posix_fallocate``, then every page
faulted in: :func:`_populate`) so that neither the first write nor a full ``/dev/shm`` strikes in
the middle of training. The owner unlinks it on close; a receiver that was killed cannot, so
every new receiver reaps the segments whose owner is gone.

Whether the owner is gone is told by a lock, not by a pid: the owner holds an exclusive ``flock``
on the segment from before the segment bears its name until it closes, and the kernel drops the
lock when the owner dies. A pid means nothing across pid namespaces (two containers sharing
``/dev/shm`` through ``--ipc=host`` or a memory-backed volume see different processes under one
pid), while a lock on the file is the same for everyone who can open it. The pid and start time in
the name are kept for people who look at ``/dev/shm``.

We use ``mmap`` on our own file descriptors rather than ``multiprocessing.shared_memory``, whose
resource tracker (Python < 3.13) unlinks or warns about segments a process merely attaches to.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import re
import secrets
import warnings
from typing import Any

import numpy as np

from .errors import LocalProtocolError, TransportError
from .memory import HOST

SHM_DIR = "/dev/shm"
_PREFIX = "tensorwire."
_NAME_RE = re.compile(r"^tensorwire\.(\d+)\.(\d+)\.(\d+)\.([0-9a-f]{32})$")
#: A segment being created: locked, allocated and mapped before it is renamed to its real name.
_NEW_SUFFIX = ".new"
_REAP_RE = re.compile(r"^tensorwire\.(\d+)\.\d+\.\d+\.[0-9a-f]{32}(\.new)?$")


def _process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19])  # field 22 overall


def shm_available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def room(*, shared: bool = True) -> int | None:
    """The bytes that new regions can still take on this machine without swapping: its
    ``MemAvailable``, and for shared regions no more than ``/dev/shm`` has free (a tmpfs, often
    smaller: a container's is 64 MB unless it is given more). None where neither is known.
    What a whole job will register can be checked against it before the first region is made:
    each region is allocated whole as it is made, so a registration too large for the machine
    would otherwise fill its memory before it failed."""
    limits: list[int] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    if shared and shm_available():
        with contextlib.suppress(OSError):
            st = os.statvfs(SHM_DIR)
            limits.append(st.f_bavail * st.f_frsize)
    return min(limits) if limits else None


def reap_stale_segments() -> list[str]:
    """Unlink this user's tensorwire segments whose owner is gone (nobody holds their lock, in
    any pid namespace); return their names."""
    if not shm_available():
        return []
    uid = os.getuid()
    reaped = []
    for entry in os.scandir(SHM_DIR):
        match = _REAP_RE.match(entry.name)
        if match is None or int(match.group(1)) != uid:
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # reaped by someone else meanwhile, or not a file of ours
        try:
            st = os.fstat(fd)
            if st.st_uid != uid:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its owner lives
            # Unlink the file we checked, not one that took its name since we opened it.
            if os.stat(entry.path, follow_symlinks=False).st_ino == st.st_ino:
                os.unlink(entry.path)
                reaped.append(entry.name)
        except FileNotFoundError:
            pass  # another receiver reaped it first
        finally:
            os.close(fd)
    return reaped


#: The largest region: file sizes and mapping lengths are signed 64-bit numbers.
MAX_REGION_BYTES = (1 << 63) - 1


class Region:
    """One mapped slab of registered memory.

    ``owner=True`` for the receiver that created it (and unlinks it on close); senders
    :meth:`attach` to it by name. ``words64``/``words32`` are memoryviews over the whole region for
    single aligned word loads and stores (the sequence numbers, counters and doorbells).
    """

    kind: str = HOST  # a Memory (tensorwire.memory): host memory
    device: int = 0

    def __init__(
        self, name: str | None, size: int, mm: mmap.mmap, owner: bool, lock_fd: int = -1
    ) -> None:
        self.name = name
        self.size = size
        self.owner = owner
        self._pid = os.getpid()  # a forked child's copy never unlinks its parent's region
        self._lock_fd = lock_fd  # the owner's open segment, locked: "its owner lives"
        self._mm: mmap.mmap | None = mm
        self.array: np.ndarray[Any, np.dtype[np.uint8]] = np.frombuffer(mm, dtype=np.uint8)
        self.words64 = memoryview(mm).cast("Q")
        self.words32 = memoryview(mm).cast("I")
        #: the whole region as bytes, for small copies into a slot (a slice of it at the slot's
        #: offset: one memoryview for every slot, not one kept per slot)
        self.bytes = memoryview(mm)
        self.address: int = self.array.ctypes.data

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def create(cls, size: int, *, shared: bool = True) -> Region:
        """Create, allocate and pre-fault a region of ``size`` bytes.

        With ``shared=False`` (or no ``/dev/shm``) the region is anonymous memory that only this
        process can reach, which is all the network transports need, backed by huge pages
        where the kernel allows (:func:`_private_mapping`).
        """
        if size > MAX_REGION_BYTES:
            # what a file or a mapping can be: beyond it the allocation raised a bare
            # OverflowError ("Python int too large to convert to C long")
            raise TransportError(
                f"cannot allocate a {size}-byte region: no file or mapping can be larger than "
                f"{MAX_REGION_BYTES} bytes (is a tensor's shape or max_bytes what was meant?)"
            )
        if not shared or not shm_available():
            return cls(None, size, _private_mapping(size), owner=True)
        name, path, new_path, fd = _new_locked_segment()
        try:
            try:
                # Allocates every page now: a full /dev/shm fails here, not as SIGBUS mid-write.
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                raise TransportError(
                    f"cannot allocate a {size}-byte region in {SHM_DIR}: {exc.strerror} "
                    f"(is {SHM_DIR} large enough? see `df -h {SHM_DIR}`)"
                ) from exc
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
            try:
                _populate(mm, f"cannot map a {size}-byte region in {SHM_DIR}")
                os.rename(new_path, path)
            except BaseException:
                mm.close()
                raise
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(new_path)
            raise
        return cls(name, size, mm, owner=True, lock_fd=fd)

    @classmethod
    def attach(cls, name: str, size: int) -> Region:
        """Map a peer's region by the name it published (checked: no path tricks)."""
        if _NAME_RE.match(name) is None:
            raise LocalProtocolError(f"peer published an invalid region name: {name!r}")
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise TransportError(
                f"cannot open the receiver's shared-memory region {name}: {exc.strerror}"
            ) from exc
        try:
            actual = os.fstat(fd).st_size
            if actual < size:
                raise LocalProtocolError(
                    f"region {name} is {actual} bytes, smaller than the {size} published"
                )
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        try:  # every page mapped now, so that the first write does not pay the faults
            _populate(mm, f"cannot map the receiver's region {name}")
        except BaseException:
            mm.close()
            raise
        return cls(name, size, mm, owner=False)

    # -- teardown --------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._mm is None

    def close(self) -> None:
        """Unmap (when no view is still exported) and, for the owner, unlink. Idempotent."""
        mm, self._mm = self._mm, None
        if mm is None:
            return
        if self.owner and self.name is not None and os.getpid() == self._pid:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_DIR, self.name))
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # drops the lock, after the name is gone
            self._lock_fd = -1
        self.words64.release()
        self.words32.release()
        self.bytes.release()
        del self.array
        # A caller may still hold a view (e.g. a tensor returned by wait()). The mapping then
        # lives until that view is collected; the name is already gone, so nothing leaks.
        with contextlib.suppress(BufferError):
            mm.close()

    def __del__(self) -> None:
        if self._mm is not None:
            warnings.warn(f"unclosed tensorwire region {self.name}", ResourceWarning, stacklevel=1)
            with contextlib.suppress(Exception):
                self.close()


#: madvise(2) advice that faults every page of a range in for writing (Linux 5.14; the mmap
#: module names it from Python 3.13 on, hence the number)
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)

_madvise: Any
try:
    _madvise = ctypes.CDLL(None, use_errno=True).madvise
    _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _madvise.restype = ctypes.c_int
except (OSError, AttributeError):  # pragma: no cover - no libc madvise: pages touched instead
    _madvise = None


def _populate(mm: mmap.mmap, failure: str) -> None:
    """Fault every page of ``mm`` in for writing, without holding the GIL: ``madvise``
    (``MADV_POPULATE_WRITE``) through ctypes, which lets the GIL go for the call. ``mmap``'s own
    ``MAP_POPULATE`` and ``mmap.madvise`` hold it throughout: a 256 MiB region stopped every
    other thread of the process for 167 ms (on the development VM), a receiver's consumer and
    its control thread included, whenever a tensor was registered. (A thread that maps memory
    meanwhile, as a growing heap does, still waits for the kernel's lock of the address space.)
    An older kernel (before 5.14) has no such advice: each page is touched instead.
    ``failure`` begins the error."""
    size = len(mm)
    if size == 0:
        return
    if _madvise is not None:
        anchor = ctypes.c_char.from_buffer(mm)  # (its address; released before we return)
        try:
            for _ in range(8):  # (EAGAIN, EINTR: the kernel asks for another try)
                if _madvise(ctypes.addressof(anchor), size, _MADV_POPULATE_WRITE) == 0:
                    return
                err = ctypes.get_errno()
                if err not in (errno.EAGAIN, errno.EINTR):
                    break
        finally:
            del anchor
        if err not in (errno.EINVAL, errno.ENOSYS):
            raise TransportError(f"{failure}: {os.strerror(err)}")
    np.frombuffer(mm, dtype=np.uint8)[:: mmap.PAGESIZE] = 0


#: Tries at a segment file of our own: one fails only where a reaper took the new file in the
#: moment between its creation and our lock, so a second try all but always succeeds
CREATE_TRIES = 8


def _new_locked_segment() -> tuple[str, str, str, int]:
    """A new segment file under its temporary name, locked by us: (its real name, the real
    name's path, the temporary path, the locked descriptor). Created under a temporary name and
    locked before it takes its real one, so that no reaper finds it under its real name
    unlocked. Between ``open`` and ``flock`` it is unlocked under the temporary name, which
    reapers look at too (a creator killed after its lock leaves one): a reaper there locks it
    first (our lock is refused) or unlinks it before our lock (our lock is taken on a file that
    has no name any more). Either way a new file is made under a new name. Before, the first
    case raised BlockingIOError from ``Receiver()``, the second FileNotFoundError at the rename
    (a receiver started while another started on the same host: seen in the suite; 138 of
    55,392 regions made next to two processes reaping in a loop)."""
    pid = os.getpid()
    stem = f"{_PREFIX}{os.getuid()}.{pid}.{_process_start_time(pid)}."
    for _ in range(CREATE_TRIES):
        name = stem + secrets.token_hex(16)
        path = os.path.join(SHM_DIR, name)
        new_path = path + _NEW_SUFFIX
        fd = os.open(new_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        ours = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # Locked: no reaper can unlink it from here on; it still bears the name if none did.
            ours = os.stat(new_path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except (BlockingIOError, FileNotFoundError):
            pass  # a reaper holds it, or unlinked it already
        finally:
            if not ours:
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(new_path)  # (a reaper holding it finds it gone, and lets it be)
        if ours:
            return name, path, new_path, fd
    raise TransportError(
        f"cannot create a region in {SHM_DIR}: {CREATE_TRIES} new files in a row were removed "
        "as we made them (other processes reaping segments of this user)"
    )


def _private_mapping(size: int) -> mmap.mmap:
    """Anonymous memory of this process, asked for transparent huge pages, every page faulted in.

    Huge pages matter to writers that reach these pages from outside: UCX's ``cma`` (the
    ``nixl`` transport on one host) pins and copies a 4 KiB page at a time otherwise, and an RDMA
    NIC translates fewer pages. On the 2-core VM ``nixl`` writes ran 1.45x (16 MiB) to 1.89x
    (1 MiB) faster into such memory than into ``/dev/shm``, whose tmpfs gives no huge pages
    unless the operator turned them on (BENCHMARKS.md, "Receiver memory"). The pages are faulted
    in after the advice (:func:`_populate`): ``MAP_POPULATE`` would fault them in before it could
    apply.
    """
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        with contextlib.suppress(AttributeError, OSError):  # no THP here: 4 KiB pages it is
            mm.madvise(mmap.MADV_HUGEPAGE)
        _populate(mm, f"cannot allocate a {size}-byte private region")
    except BaseException:
        mm.close()
        raise
    return mm
