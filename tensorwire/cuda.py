"""Everything tensorwire asks of CUDA, in one place, through cupy (the ``gpu`` extra).

cupy is imported only when GPU memory is asked for (a ``device="cuda"`` registration, a write of a
GPU array, a GPU region in an address book): host-only code paths never import it, and a host
without cupy or without a CUDA device gets a :class:`~tensorwire.errors.MissingDependencyError` or
:class:`~tensorwire.errors.TransportError` that says which, at the first call that needs one.

What lives here:

* where a tensor lives: :func:`parse_device` (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a
  ``torch.device``) and :func:`array_device` (which GPU an array's memory is on, told from
  ``__dlpack_device__``, a torch tensor's device or ``__cuda_array_interface__``, without
  importing cupy for host arrays);
* the receiver's GPU memory: :class:`DeviceMemory`, one ``cudaMalloc`` allocation registered
  whole, exported to other processes by a CUDA IPC handle;
* a sender's view of it: :class:`OpenedMemory`, opened from the handle once per region;
* copies: :class:`Copier` moves bytes between any two of host memory, this process's GPU memory
  and opened GPU memory, on a stream of its own, and returns only once they have landed (the
  sequence number that completes a slot must never be seen before its bytes), or queues them;
* :class:`Completions`: what to do once queued GPU work has finished (a writer's completion
  store), in order, on a thread of its own, so that the writer need not wait for its copies;
* :class:`PinnedBuffer`: page-locked host memory, the staging area of the transports that send
  GPU tensors from host memory (tcp, grpc).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import numpy as np

from .dlpack import export, from_dlpack, ml_code
from .dtypes import import_torch
from .errors import MissingDependencyError, SpecMismatchError, TransportError
from .memory import CUDA

log = logging.getLogger(__name__)

#: DLPack device types (dlpack.h): kDLCPU, kDLCUDA, kDLCUDAHost (pinned host), kDLCUDAManaged.
DLPACK_CPU = 1
DLPACK_CUDA = 2
DLPACK_CUDA_HOST = 3
DLPACK_CUDA_MANAGED = 13
INSTALL_HINT = (
    "pip install 'tensorwire[gpu]' (cupy for CUDA 12; 'tensorwire[gpu-cu13]' for CUDA 13)"
)


# -- cupy, imported on demand -----------------------------------------------------------------


@functools.cache
def _cupy_or_none() -> Any:
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def cupy() -> Any:
    """The cupy module, or :class:`MissingDependencyError` saying how to install it."""
    cp = _cupy_or_none()
    if cp is None:
        raise MissingDependencyError(
            f"GPU tensors need cupy, which is not installed: {INSTALL_HINT}"
        )
    return cp


def device_count() -> int:
    """CUDA devices this process can use (0 without cupy, a driver or a device; never raises)."""
    cp = _cupy_or_none()
    if cp is None:
        return 0
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:  # cupy raises CUDARuntimeError for "no driver" and "no device" alike
        return 0


def available() -> bool:
    return device_count() > 0


def hold_context() -> bool:
    """Make a CUDA context current on the calling thread: the primary context of the thread's
    current device, created if the process has none yet. True once one is current; False
    without cupy or a device (never raises; the thread's current device is left as it was).

    For libraries that look for a context when they start rather than when they move GPU
    memory: UCX, under NIXL, opens its ``cuda_ipc`` transport only where the agent was created
    with a context current (measured on an H100: an agent created before the process touched
    CUDA moved 16 MiB GPU to GPU by "software emulation" over ``tcp/lo`` at 0.5 GB/s, one made
    after at 239 GB/s through ``cuda_ipc``)."""
    cp = _cupy_or_none()
    if cp is None:
        return False
    try:
        runtime = cp.cuda.runtime
        if runtime.getDeviceCount() < 1:
            return False
        runtime.setDevice(runtime.getDevice())  # CUDA 12 and later: makes it current here
        runtime.free(0)  # creates the context where setDevice does not (older runtimes)
    except Exception as exc:  # cupy raises CUDARuntimeError for "no driver" and "no device"
        log.debug("no CUDA context could be made current: %s", exc)
        return False
    return True


def require_device(index: int) -> Any:
    """The cupy module, once CUDA device ``index`` is known to exist here."""
    cp = cupy()
    count = device_count()
    if index >= count:
        have = (
            f"has {count} CUDA device{'s' if count != 1 else ''}" if count else "has no CUDA device"
        )
        raise TransportError(f"cuda:{index} was asked for, but this host {have} visible to it")
    return cp


# -- where a tensor lives ---------------------------------------------------------------------


def parse_device(value: Any) -> int | None:
    """``None`` for host memory, else the CUDA device index ``value`` names.

    Accepts ``None``, ``"cpu"``, ``"cuda"`` (the current device), ``"cuda:N"``, objects that
    print as those (``torch.device``), a device index ``N`` (an int, as ``torch.device(N)`` and
    ``tensor.to(N)`` take it) and a ``cupy.cuda.Device``. Anything else is a
    :class:`ValueError`.
    """
    if value is None:
        return None
    if type(value).__module__.startswith("cupy") and isinstance(getattr(value, "id", None), int):
        value = value.id  # a cupy.cuda.Device (it prints as "<CUDA Device 0>")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        value = f"cuda:{value}"
    text = str(value).strip().lower()
    if text == "cpu":
        return None
    if text == "cuda":
        cp = require_device(0)
        return int(cp.cuda.runtime.getDevice())
    kind, _, index = text.partition(":")
    if kind == "cuda" and index.isdigit():
        require_device(int(index))
        return int(index)
    raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {value!r}")


def describe_device(device: int | None) -> str:
    return "cpu" if device is None else f"cuda:{device}"


def array_device(obj: Any) -> int | None:
    """The CUDA device ``obj``'s memory is on, or None for host memory (numpy, CPU tensors,
    anything else: those are read as host arrays, which refuses what is not one)."""
    if isinstance(obj, np.ndarray):
        return None
    cp = sys.modules.get("cupy")  # a cupy array means cupy is imported: never import it here
    if cp is not None and isinstance(obj, cp.ndarray):
        # its memory pointer knows; __dlpack_device__ asks the driver (~2 us per message)
        return int(obj.data.device_id)
    device = getattr(obj, "device", None)
    if type(obj).__module__.startswith("torch") and device is not None:
        return int(device.index or 0) if device.type == "cuda" else None
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    if dlpack_device is not None:
        with contextlib.suppress(Exception):
            kind, index = dlpack_device()
            return int(index) if int(kind) in (DLPACK_CUDA, DLPACK_CUDA_MANAGED) else None
    if hasattr(obj, "__cuda_array_interface__"):
        return int(cupy().asarray(obj).device.id)
    return None


def as_device_array(obj: Any, name: str) -> Any:
    """``obj`` (on a GPU) as a cupy array over the same memory.

    Work that reads it must come after the work that produced it. A DLPack producer (torch) is
    handed cupy's current stream and makes it wait for its own; :meth:`Copier.copy` with
    ``ordered=True`` then queues on :func:`current_stream` (torch's own, where one is
    current), behind that work."""
    cp = cupy()
    try:
        if isinstance(obj, cp.ndarray):
            return obj
        if type(obj).__module__.startswith("torch"):
            return import_torch(obj, cp.from_dlpack, name)
        if hasattr(obj, "__dlpack__"):
            # (a format cupy's import may lack, float8, is read as bytes and viewed as it:
            # cupy's own kinds of error are unknown here, so any error has the capsule looked at)
            return from_dlpack(obj, cp.from_dlpack, (Exception,))
        return cp.asarray(obj)
    except SpecMismatchError:
        raise
    except Exception as exc:  # cupy, DLPack and torch each raise their own kinds
        raise SpecMismatchError(
            f"tensor {name!r}: cannot read a {type(obj).__module__}.{type(obj).__qualname__} "
            f"as a GPU array: {exc}"
        ) from None


def data_pointer(array: Any) -> int:
    """The address of an array's first byte: numpy (host) or cupy (device)."""
    if isinstance(array, np.ndarray):
        return int(array.ctypes.data)
    return int(array.data.ptr)


def is_device_array(array: Any) -> bool:
    return not isinstance(array, np.ndarray)


# -- the receiver's GPU memory ----------------------------------------------------------------


class DeviceMemory:
    """One span of GPU memory a receiver registers (a :class:`~tensorwire.memory.Memory`).

    A plain ``cudaMalloc`` allocation, not a slice of cupy's memory pool: a CUDA IPC handle
    names a whole allocation, and the memory must go back to the device when the receiver
    closes, not to a pool. Arrays handed out over it keep it alive, as the views of a host
    region keep its mapping: :meth:`close` drops the receiver's reference, and the memory is
    freed when the last view is gone.
    """

    kind = CUDA

    def __init__(self, size: int, device: int) -> None:
        cp = require_device(device)
        self.device = device
        self.size = size
        try:
            with cp.cuda.Device(device):
                self._memory: Any = cp.cuda.memory.Memory(size)
                cp.cuda.runtime.memset(self._memory.ptr, 0, size)
        except (cp.cuda.memory.OutOfMemoryError, cp.cuda.runtime.CUDARuntimeError) as exc:
            # cudaMalloc's own failure is a CUDARuntimeError (cudaErrorMemoryAllocation)
            raise TransportError(f"cannot allocate {size} bytes on cuda:{device}: {exc}") from exc
        self.address: int = int(self._memory.ptr)
        self._handle: bytes | None = None

    @property
    def closed(self) -> bool:
        return self._memory is None

    def ipc_handle(self) -> bytes:
        """The handle another process on this host opens this memory by."""
        if self._handle is None:
            cp = cupy()
            with cp.cuda.Device(self.device):
                self._handle = bytes(cp.cuda.runtime.ipcGetMemHandle(self.address))
        return self._handle

    def view(self, offset: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
        """A cupy array over ``shape`` elements of ``dtype`` from byte ``offset``."""
        return _array_over(self._memory, self.device, self.address + offset, dtype, shape, self)

    def close(self) -> None:
        self._memory = None


class OpenedMemory:
    """A receiver's :class:`DeviceMemory` as a sender on the same host reaches it.

    Opened from its IPC handle (``cudaIpcOpenMemHandle``) once; a sender in the receiver's own
    process uses the receiver's address instead, since CUDA refuses to open a process's own
    handle."""

    kind = CUDA

    def __init__(self, handle: bytes, size: int, device: int, own_address: int | None) -> None:
        cp = require_device(device)
        self.device = device
        self.size = size
        self._opened = own_address is None
        if own_address is not None:
            self.address = own_address
        else:
            try:
                with cp.cuda.Device(device):
                    self.address = int(cp.cuda.runtime.ipcOpenMemHandle(handle))
            except Exception as exc:
                raise TransportError(
                    f"cannot open the receiver's GPU memory on cuda:{device} through CUDA IPC: "
                    f"{exc} (is the receiver on this host, and this GPU visible to both?)"
                ) from exc
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def view(self, offset: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
        return _array_over(None, self.device, self.address + offset, dtype, shape, self)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._opened:
            cp = cupy()
            with contextlib.suppress(Exception), cp.cuda.Device(self.device):
                cp.cuda.runtime.ipcCloseMemHandle(self.address)


def _array_over(
    memory: Any, device: int, address: int, dtype: np.dtype[Any], shape: tuple[int, ...], owner: Any
) -> Any:
    cp = cupy()
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    # UnownedMemory keeps ``owner`` (and through it the allocation) alive for as long as the
    # array lives.
    span = cp.cuda.memory.UnownedMemory(address, max(nbytes, 1), (owner, memory), device)
    kind = cp.ndarray if ml_code(dtype) is None else _ml_format_array()
    return kind(shape, dtype, memptr=cp.cuda.memory.MemoryPointer(span, 0))


@functools.cache
def _ml_format_array() -> type:
    """The cupy array class of slots of an ml_dtypes format (bfloat16, float8_*).

    cupy 14.2 exports bfloat16 through DLPack but refuses float8 ("dtype is not supported for
    dlpack export", seen on an H200), so ``torch.from_dlpack`` could not read a float8 GPU slot.
    Where cupy's own export refuses, this one exports the same memory as unsigned integers and
    sets the format's DLPack code in the capsule, as :class:`~tensorwire.received.SlotArray`
    does on the host.
    """
    cp = cupy()

    class MLFormatArray(cp.ndarray):  # type: ignore[name-defined]
        def __dlpack__(self, **kwargs: Any) -> Any:
            try:
                return cp.ndarray.__dlpack__(self, **kwargs)
            except BufferError:
                code = ml_code(self.dtype)
                if code is None:
                    raise
                return export(self, code, cp.ndarray, **kwargs)

    return MLFormatArray


# -- copies ------------------------------------------------------------------------------------


class Copier:
    """Copies between host and GPU memory: on a stream of its own per device, or on the
    producer's current stream when the source is GPU work still queued there.

    :meth:`copy` returns once the bytes are in place (its stream synchronised): a slot is
    completed by a sequence-number store after it, and no reader may see that store first. A
    process killed during the copy never makes that store, so a torn slot is never complete.
    """

    def __init__(self) -> None:
        self._streams: dict[int, Any] = {}
        self._lock = threading.Lock()

    def stream(self, device: int) -> Any:
        stream = self._streams.get(device)
        if stream is None:
            cp = require_device(device)
            with self._lock, cp.cuda.Device(device):
                stream = self._streams.setdefault(device, cp.cuda.Stream(non_blocking=True))
        return stream

    def copy(self, dst: int, src: int, nbytes: int, device: int, ordered: bool = False) -> None:
        """``nbytes`` from address ``src`` to ``dst`` (each host or GPU memory: CUDA tells them
        apart by unified addressing), on ``device``'s stream; returns once they landed.

        ``ordered``: the source was produced on ``device`` by work queued on its current stream
        (see :func:`as_device_array`): the copy starts after that work."""
        if nbytes == 0:
            return
        self.queue(dst, src, nbytes, device, ordered).synchronize()

    def queue(self, dst: int, src: int, nbytes: int, device: int, ordered: bool = False) -> Any:
        """As :meth:`copy`, without waiting; returns the stream it went on. Unordered, that is
        ``device``'s own stream: :meth:`copy` (or :meth:`wait`) on that device later returns
        once this copy has landed too."""
        cp = cupy()
        with cp.cuda.Device(device):
            # An ordered copy goes on the producer's own stream, behind its work: the same order
            # an event between the streams would give, without creating and recording one per
            # message (~4 us of the ~11 us a 4 KiB copy and its synchronisation take on an H100).
            stream = current_stream_here(device) if ordered else self.stream(device)
            if nbytes:
                runtime = cp.cuda.runtime
                runtime.memcpyAsync(dst, src, nbytes, runtime.memcpyDefault, stream.ptr)
        return stream

    def wait(self, device: int) -> None:
        """Return once every copy queued on ``device``'s own stream has landed."""
        cp = cupy()
        with cp.cuda.Device(device):
            self.stream(device).synchronize()


@functools.cache
def copier() -> Copier:
    """The process's copier (its streams are created on first use, per device)."""
    return Copier()


def current_stream(device: int) -> Any:
    """The stream the caller's work on ``device`` is queued on: where the work that produced a
    source array was queued, where a copy of it goes so that the caller's next work on that
    stream sees the copy done, and what a consumer's kernels reading a slot ran on.

    That is cupy's current stream, unless it is the default one while torch has a stream of
    its own current on ``device`` (``with torch.cuda.stream(s)``, as training loops that overlap
    communication with compute do): then torch's. A torch stream does not wait for work on the
    default stream (torch creates its streams non-blocking), so a copy queued on the default
    stream would race the caller's next kernel that rewrites the source, and a consumer's
    release would not wait for its kernels still reading the slot."""
    with cupy().cuda.Device(device):
        return current_stream_here(device)


def current_stream_here(device: int) -> Any:
    """:func:`current_stream`, where ``device`` is already cupy's current device."""
    stream = cupy().cuda.get_current_stream()
    if stream.ptr == 0:  # the legacy default stream: nobody chose one in cupy
        theirs = _torch_current_stream(device)
        if theirs is not None:
            return theirs
    return stream


def synchronize_current(device: int) -> None:
    """Wait for the work queued on ``device``'s current stream (:func:`current_stream`)."""
    with cupy().cuda.Device(device):
        current_stream_here(device).synchronize()


#: cupy wrappers of torch's streams, by (device, stream address): made once per stream
_TORCH_STREAMS: dict[tuple[int, int], Any] = {}
#: more distinct streams than torch's pools hold (32 per priority): a program that makes and
#: drops streams of its own; the wrappers are then made again
_TORCH_STREAMS_KEPT = 256
#: torch's current stream could not be had, and the log said so (it says so once)
_torch_stream_unknown = False


def _torch_current_stream(device: int) -> Any:
    """torch's current stream on ``device`` as a cupy stream, where torch is in use and that
    stream is not the legacy default one; else None. Never imports torch."""
    global _torch_stream_unknown
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        # Per message: the raw address alone (what triton asks torch for) costs a fraction of
        # the Stream object torch.cuda.current_stream builds.
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        theirs = None
        if raw is not None:
            address = int(raw(device))
        else:
            theirs = torch.cuda.current_stream(device)
            address = int(theirs.cuda_stream)
        if address == 0:
            return None
        stream = _TORCH_STREAMS.get((device, address))
        if stream is None:
            if theirs is None:  # made only now: once per stream
                theirs = torch.cuda.current_stream(device)
            if len(_TORCH_STREAMS) >= _TORCH_STREAMS_KEPT:
                _TORCH_STREAMS.clear()
            stream = _TORCH_STREAMS[device, address] = _wrap_stream(theirs, address, device)
    except Exception as exc:  # a torch whose API differs: cupy's stream, said once
        if not _torch_stream_unknown:
            _torch_stream_unknown = True
            log.warning(
                "torch's current stream on cuda:%d is not known (%s): GPU copies go on cupy's "
                "current stream; synchronise torch's stream before a write from another one",
                device,
                exc,
            )
        return None
    return stream


def _wrap_stream(theirs: Any, address: int, device: int) -> Any:
    """A cupy stream over another library's (it stays theirs: nothing here destroys it)."""
    cp = cupy()
    if hasattr(theirs, "__cuda_stream__") and hasattr(cp.cuda.Stream, "from_external"):
        return cp.cuda.Stream.from_external(theirs)  # cupy 14+, torch 2.9+: holds it alive
    with warnings.catch_warnings():  # deprecated by cupy 14 for the protocol above
        warnings.simplefilter("ignore", DeprecationWarning)
        return cp.cuda.ExternalStream(address, device)


def device_bytes(device: int, nbytes: int) -> Any:
    """``nbytes`` of uninitialised memory on GPU ``device``, as a cupy uint8 array (at least one
    byte: a staging buffer that a writer fills in place)."""
    cp = cupy()
    with cp.cuda.Device(device):
        return cp.empty(max(nbytes, 1), dtype=cp.uint8)


class Completions:
    """Callbacks run in the order they were queued, each once the GPU work queued on its stream
    before it has finished, on a thread of their own (started on first use).

    What it is for: a writer completes a message (stores its sequence number) only once the copy
    of its payload has landed, but need not wait for that copy itself. The copies of consecutive
    messages then run back to back on the GPU while the writer's Python prepares the next, where
    waiting for each (a synchronisation, ~10 us, per message) left the GPU idle between them.
    An event per callback, recorded on the callback's stream, marks where its work ends; events
    come from a pool per device, as recording one is cheap and creating one is not. Order is
    the queue's: a callback never runs before one queued earlier, even if its own work ended
    first. A process killed with work queued never runs those callbacks.

    Each callback gets None, or the exception that waiting for its work raised (a failed copy
    surfaces there, not in the call that queued it).
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._queue: deque[tuple[Any, int, Callable[[BaseException | None], None]]] = deque()
        self._free: dict[int, list[Any]] = {}  # per device: events not in the queue
        self._thread: threading.Thread | None = None
        self._closed = False
        self._queued = 0  # callbacks queued so far
        self._done = 0  # callbacks run so far

    def after(self, stream: Any, device: int, then: Callable[[BaseException | None], None]) -> None:
        """Run ``then`` once the work queued on ``stream`` (of ``device``) so far has finished."""
        cp = cupy()
        with self._cond:
            if self._closed:
                raise TransportError(f"{self._name} is closed")
            free = self._free.setdefault(device, [])
            event = free.pop() if free else None
        # Under the device: the legacy default stream (handle 0) means the current device's.
        with cp.cuda.Device(device):
            if event is None:
                event = cp.cuda.Event(block=False, disable_timing=True)
            cp.cuda.runtime.eventRecord(event.ptr, stream.ptr)
        with self._cond:
            self._queue.append((event, device, then))
            self._queued += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        cp = cupy()
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                event, device, then = self._queue[0]
            error: BaseException | None = None
            try:
                with cp.cuda.Device(device):
                    event.synchronize()  # without the GIL (cupy waits in nogil)
            except Exception as exc:
                error = exc
            with self._cond:
                self._queue.popleft()
                self._free[device].append(event)
            try:
                then(error)
            except Exception:  # a callback's own failure must not stop the ones behind it
                log.exception("%s: a completion failed", self._name)
            with self._cond:
                self._done += 1
                self._cond.notify_all()

    def drain(self, deadline: float | None) -> bool:
        """Wait until every callback queued before this call has run; False at ``deadline``
        (a ``time.monotonic()`` value; None: no limit)."""
        with self._cond:
            target = self._queued
            while self._done < target:
                if deadline is None:
                    self._cond.wait()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float) -> bool:
        """Run what is queued (waiting at most ``timeout`` seconds), then stop the thread; no
        callback may be queued after. False if work was still queued at the limit: its callbacks
        run whenever it ends, so a callback must check that what it completes still exists."""
        drained = self.drain(time.monotonic() + timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if drained and thread is not None:
            thread.join(timeout)
        return drained


#: What a GPU payload sent from host memory is staged in at a time (:meth:`PinnedBuffer.chunks`):
#: small enough that the copy of the first chunk, which nothing overlaps, is short (~30 us at the
#: 36 GB/s an H100 copies 1 MiB to pinned memory), large enough that the per-chunk cost (a copy
#: launched, an event waited for, a send) is a few percent of a chunk's send at loopback rates.
STAGING_CHUNK_BYTES = 1 << 20


class PinnedBuffer:
    """Page-locked host memory, as a numpy byte array that grows on demand.

    Copies between it and a GPU run at the bus's rate (51-55 GB/s on an H100's PCIe 5, against
    8-15 GB/s for pageable memory: ../shared/gpu/README.md)."""

    def __init__(self) -> None:
        self._pinned: Any = None
        self.array: np.ndarray[Any, np.dtype[np.uint8]] = np.empty(0, dtype=np.uint8)
        self._events: dict[int, tuple[Any, Any]] = {}  # per device: one per half (chunks)

    def bytes(self, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        if nbytes > self.array.nbytes:
            self._pinned = cupy().cuda.alloc_pinned_memory(nbytes)
            self.array = np.frombuffer(self._pinned, dtype=np.uint8, count=nbytes)
        return self.array[:nbytes]

    def host_copy(self, array: Any) -> np.ndarray[Any, Any]:
        """A GPU array's contents here, as a host array of its dtype and shape."""
        out = self.bytes(array.nbytes)
        device = int(array.device.id)
        copier().copy(data_pointer(out), data_pointer(array), array.nbytes, device, ordered=True)
        return out.view(array.dtype).reshape(array.shape)

    def chunks(
        self, array: Any, chunk_bytes: int = STAGING_CHUNK_BYTES
    ) -> Generator[memoryview, None, None]:
        """A C-contiguous GPU array's bytes in host memory, ``chunk_bytes`` at a time, for a
        sender that sends each chunk while the GPU copies the next: the copy of chunk k+1 into
        one half of this buffer is started before chunk k, in the other half, is handed out. A
        chunk is valid until the next one is asked for.

        The copies are queued on the device's current stream, behind the work that produced the
        array (see :func:`as_device_array`). Closing the iterator early waits for the copy in
        flight, so the buffer is never written behind its next user's back."""
        nbytes = int(array.nbytes)
        if nbytes == 0:
            return
        chunk = min(chunk_bytes, nbytes)
        count = -(-nbytes // chunk)
        device = int(array.device.id)
        src = data_pointer(array)
        halves = self.bytes(2 * chunk if count > 1 else chunk)
        base = data_pointer(halves)
        cp = cupy()
        runtime = cp.cuda.runtime
        events = self._events.get(device)
        if events is None:
            with cp.cuda.Device(device):
                events = (cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True))
            self._events[device] = events

        def start(k: int) -> None:
            at, size = k * chunk, min(chunk, nbytes - k * chunk)
            with cp.cuda.Device(device):
                stream = current_stream_here(device)
                runtime.memcpyAsync(
                    base + (k % 2) * chunk, src + at, size, runtime.memcpyDeviceToHost, stream.ptr
                )
                events[k % 2].record(stream)

        start(0)
        try:
            for k in range(count):
                if k + 1 < count:
                    start(k + 1)  # into the half of chunk k-1, which the caller is done with
                events[k % 2].synchronize()
                at = (k % 2) * chunk
                yield halves[at : at + min(chunk, nbytes - k * chunk)].data
        finally:
            for event in events:
                event.synchronize()


# -- facts for `tensorwire info` --------------------------------------------------------------


def describe() -> dict[str, Any]:
    """What this host offers for GPU tensors (for ``tensorwire info``); never raises."""
    cp = _cupy_or_none()
    if cp is None:
        return {"cupy": None}
    out: dict[str, Any] = {"cupy": cp.__version__, "devices": []}
    try:
        runtime = cp.cuda.runtime
        out["runtime"] = _cuda_version(runtime.runtimeGetVersion())
        out["driver"] = _cuda_version(runtime.driverGetVersion())
        for index in range(runtime.getDeviceCount()):
            props = runtime.getDeviceProperties(index)
            name = props["name"]
            out["devices"].append(
                {
                    "index": index,
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "memory": int(props["totalGlobalMem"]),
                }
            )
    except Exception as exc:
        out["error"] = str(exc)
    return out


def mps_running() -> bool:
    """Whether NVIDIA's MPS daemon runs on this host (a process named ``nvidia-cuda-mps-*``,
    its control daemon or its server, in this process namespace): two processes on one GPU then
    share one context instead of taking turns, which changes a GPU round trip several-fold
    (BENCHMARKS.md, "GPU tensors")."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if name.startswith("nvidia-cuda-mps"):
            return True
    return False


def _cuda_version(number: int) -> str:
    return f"{number // 1000}.{number % 1000 // 10}"
