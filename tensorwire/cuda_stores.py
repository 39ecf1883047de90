"""Completion stores made by the GPU: a sequence number written into host memory by a stream
memory operation, once the copy queued before it on the same stream has landed.

Why: a ``shm`` writer of a GPU tensor may store a slot's sequence number only after its copy has
landed. Waiting for the copy in ``write`` (a stream synchronisation) leaves the GPU idle while the
writer's Python prepares the next message; handing the store to a thread that waits for the copy
(:class:`tensorwire.cuda.Completions`) costs ~50 us a message on an H100 (BENCHMARKS.md, "GPU
tensors"). Here the GPU makes the store itself: ``cuStreamWriteValue64`` is queued behind the copy
on the producer's stream, into the receiver's slot header (host shared memory, mapped for the GPU
with ``cudaHostRegister``), so ``write`` returns as soon as both are queued and a waiting receiver
sees the message the moment its bytes are in place. A writer killed before its copy has landed
never makes the store (it comes after the copy in stream order, behind the operation's default
memory barrier), so a torn slot is still never complete. The same mechanism serves NCCL-style
shared-memory transports (MSCCL++'s shared-memory all-gather stores its flags this way).

cupy does not wrap the stream memory operations, so the two driver entry points are reached
through ``ctypes`` (``libcuda.so.1``, which every CUDA process has loaded). Anything missing or
refused (an old driver, a device without 64-bit stream memory operations, host memory the driver
will not map) makes :func:`open_stores` return None with the reason logged once, and the writer
keeps the paths that synchronise; a store refused later, on a producer's own stream, completes
its message by waiting for the copy, and the tensor's next messages the same way.

**On unless ``TENSORWIRE_GPU_STREAM_STORES=0``.** Measured on an H200 against the paths that
synchronise (BENCHMARKS.md, "GPU tensors"): ``shm`` at 16 MiB 1.1-1.5x, at 64 MiB 1.5-1.8x, the
4 KiB round trip unchanged. The store rings nobody, so the writer rings the receiver as it queues
the store and says which message is coming (the ring's DEVICE_STORES word), and a waiting
receiver yields the CPU until that message lands (:func:`tensorwire.doorbell.wait_for`'s
``coming``).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import os
import threading
from typing import Any

from .cuda import cupy
from .errors import TransportError

log = logging.getLogger(__name__)

#: The environment variable that turns GPU-made completion stores off ("0"; on otherwise).
ENV = "TENSORWIRE_GPU_STREAM_STORES"
#: what CUDA registers host memory in: the operating system's pages
PAGE = mmap.PAGESIZE
#: cudaHostRegisterPortable | cudaHostRegisterMapped: every context may reach the page, through
#: a device address (cudaHostRegister's flags)
_REGISTER_FLAGS = 0x01 | 0x02
_CUDA_SUCCESS = 0


def enabled() -> bool:
    """Whether GPU-made completion stores may be used: yes, unless
    ``TENSORWIRE_GPU_STREAM_STORES=0`` turns them off."""
    return os.environ.get(ENV, "1") != "0"


class _Driver:
    """The driver entry points this module calls, resolved once."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        # The _v2 names are the current ABI (CUDA 11.7+, where the first ones became legacy);
        # the plain names are what older drivers export.
        self.write_value64 = _first(lib, "cuStreamWriteValue64_v2", "cuStreamWriteValue64")
        self.write_value64.argtypes = [
            ctypes.c_void_p,  # CUstream
            ctypes.c_uint64,  # CUdeviceptr
            ctypes.c_uint64,  # cuuint64_t
            ctypes.c_uint,  # flags: 0, with the memory barrier before the write
        ]
        self.write_value64.restype = ctypes.c_int
        self.host_device_pointer = _first(
            lib, "cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer"
        )
        self.host_device_pointer.argtypes = [
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.c_void_p,
            ctypes.c_uint,
        ]
        self.host_device_pointer.restype = ctypes.c_int
        self._error_name = getattr(lib, "cuGetErrorName", None)

    def describe(self, code: int) -> str:
        """A CUresult as its name (CUDA_ERROR_NOT_SUPPORTED...) where the driver says it."""
        if self._error_name is not None:
            name = ctypes.c_char_p()
            if self._error_name(code, ctypes.byref(name)) == _CUDA_SUCCESS and name.value:
                return f"{name.value.decode()} ({code})"
        return f"CUresult {code}"


def _first(lib: ctypes.CDLL, *names: str) -> Any:
    for name in names:
        function = getattr(lib, name, None)
        if function is not None:
            return function
    raise AttributeError(f"the CUDA driver exports none of {', '.join(names)}")


@functools.cache
def _driver() -> _Driver | str:
    """The driver's entry points, or why they cannot be had."""
    try:
        return _Driver(ctypes.CDLL("libcuda.so.1"))
    except (OSError, AttributeError) as exc:
        return f"the CUDA driver's stream memory operations are not reachable: {exc}"


class _HostPages:
    """The host pages this process has registered with CUDA for GPU writes, with the device
    address of each and how many users it has: a page is registered once however many rings
    share it (registering it twice is an error) and unregistered when its last user lets go."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pages: dict[int, tuple[int, int]] = {}  # page -> (device address, users)

    def take(self, device: int, page: int) -> int:
        """The device address of host ``page`` (registered now if it is not yet)."""
        with self._lock:
            known = self._pages.get(page)
            if known is not None:
                self._pages[page] = (known[0], known[1] + 1)
                return known[0]
            cp = cupy()
            driver = _driver()
            assert isinstance(driver, _Driver)
            with cp.cuda.Device(device):
                cp.cuda.runtime.hostRegister(page, PAGE, _REGISTER_FLAGS)
                address = ctypes.c_uint64()
                code = driver.host_device_pointer(ctypes.byref(address), page, 0)
                if code != _CUDA_SUCCESS:
                    cp.cuda.runtime.hostUnregister(page)
                    raise TransportError(
                        f"no device address for host page {page:#x}: {driver.describe(code)}"
                    )
            self._pages[page] = (int(address.value), 1)
            return int(address.value)

    def drop(self, page: int) -> None:
        with self._lock:
            address, users = self._pages[page]
            if users > 1:
                self._pages[page] = (address, users - 1)
                return
            del self._pages[page]
            try:
                cupy().cuda.runtime.hostUnregister(page)
            except Exception as exc:  # the context may already be gone at exit
                log.debug("unregistering host page %#x: %s", page, exc)


_PAGES = _HostPages()


class StreamStores:
    """One channel's completion stores on one GPU: which host words it may have the GPU write
    (each mapped once, through :meth:`map`), and the stores themselves (:meth:`store`).

    :meth:`close` unregisters its pages; a store still queued into one of them would then write
    to memory CUDA no longer maps, so the channel calls it only once every store has landed (it
    leaks the pages otherwise: they go with the process)."""

    def __init__(self, device: int) -> None:
        driver = _driver()
        if isinstance(driver, str):
            raise TransportError(driver)
        self._driver = driver
        self.device = device
        self._pages: list[int] = []  # one entry per map() of a page: what close() drops

    def map(self, host_address: int) -> int:
        """The device address of the 8-byte host word at ``host_address``."""
        page = host_address - host_address % PAGE
        base = _PAGES.take(self.device, page)
        self._pages.append(page)
        return base + (host_address - page)

    def store(self, stream_ptr: int, device_address: int, value: int) -> None:
        """Queue on stream ``stream_ptr`` (0: the current device's legacy default stream): write
        ``value`` to ``device_address`` once the work queued before it has finished."""
        if stream_ptr:  # a stream names its context
            code = self._driver.write_value64(stream_ptr, device_address, value, 0)
        else:  # the legacy default stream is the current context's: make it our device's
            with cupy().cuda.Device(self.device):
                code = self._driver.write_value64(None, device_address, value, 0)
        if code != _CUDA_SUCCESS:
            raise TransportError(
                f"cuStreamWriteValue64 on cuda:{self.device} failed: {self._driver.describe(code)}"
            )

    def close(self) -> None:
        pages, self._pages = self._pages, []
        for page in pages:
            _PAGES.drop(page)


def open_stores(device: int, scratch_address: int) -> StreamStores | None:
    """GPU-made completion stores on ``device``, once one store into the host word at
    ``scratch_address`` (8 bytes nobody reads) has been seen to land; None (the reason logged)
    where that fails: the writer then synchronises its copies as before."""
    try:
        return _tested(device, scratch_address)
    except Exception as exc:  # the driver, cupy's runtime and the check each raise their own
        log.info("GPU-made completion stores unavailable on cuda:%d: %s", device, exc)
        return None


def unavailable_reason(device: int) -> str | None:
    """Why GPU-made completion stores cannot work on ``device`` here (None: a test store into a
    page of this process landed), for ``tensorwire info``; never raises."""
    page = mmap.mmap(-1, PAGE)
    view = ctypes.c_char.from_buffer(page)
    try:
        _tested(device, ctypes.addressof(view)).close()
    except Exception as exc:  # as in open_stores
        return str(exc)
    finally:
        del view  # the page's export, which its close() would refuse
        page.close()
    return None


def _tested(device: int, scratch_address: int) -> StreamStores:
    """:class:`StreamStores` on ``device`` whose test store into ``scratch_address`` landed."""
    stores = StreamStores(device)
    cp = cupy()
    word = (ctypes.c_uint64).from_address(scratch_address)
    try:
        with cp.cuda.Device(device):
            stream = cp.cuda.Stream(non_blocking=True)
            target = stores.map(scratch_address)
            # Tried thrice: a nixl sender of another process warming its connection up zeroes
            # a receiver's scratch line, and may do so between our store and our look.
            for _ in range(3):
                probe = (word.value + 1) | 1
                stores.store(stream.ptr, target, probe)
                stream.synchronize()
                if word.value == probe:
                    return stores
            raise TransportError(f"a test store did not land (read {word.value}, not {probe})")
    except BaseException:
        stores.close()
        raise
