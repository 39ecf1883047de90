"""The ``shm`` transport: one-sided writes into a same-host receiver's shared memory.

The sender maps the receiver's regions (pre-populated at connect), copies each payload straight into
the slot's memory with a single ``np.copyto``, then stores the slot's sequence number and rings the
receiver's doorbell. The receiver's CPU does nothing per byte. Credits come back through the ring's
``released`` word in the same memory, so there is no per-message control traffic at all.

A GPU tensor's slots are in the receiver's GPU memory: the sender opens each of its GPU regions
once by the CUDA IPC handle the address book publishes and copies the payload with
``cudaMemcpyAsync``; the sequence number is stored only once the copy has landed. A small payload,
or one from host memory, is copied and its stream synchronised inside ``write``. A GPU source of
``DEFERRED_COMPLETION_BYTES`` or more is copied on the producer's stream and ``write`` returns
once the copy is queued: the channel's completion thread (:class:`~tensorwire.cuda.Completions`)
waits for it and then stores the sequence number, so consecutive copies run back to back on the
GPU. Where the driver allows it (:mod:`tensorwire.cuda_stores`; on unless
``TENSORWIRE_GPU_STREAM_STORES=0``), the GPU makes that store itself, queued behind each copy of a
GPU source, and ``write`` returns once both are queued, ringing the receiver as it queues (the
store rings nobody); the writer forgets such a message when it sees its sequence number landed
(at its next call, or the heartbeat thread's :meth:`ShmChannel.tick`). Either way a sender killed
mid-copy never makes that store.

The receiver is watched through a pidfd and the region's state word: a write to a receiver that died
or closed raises :class:`~tensorwire.errors.PeerLostError` instead of landing in orphaned memory.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import cuda_stores
from ..cuda import (
    Completions,
    OpenedMemory,
    copier,
    cupy,
    current_stream,
    current_stream_here,
    data_pointer,
    synchronize_current,
)
from ..cuda_stores import StreamStores
from ..doorbell import deadline_of
from ..dtypes import exports_buffer
from ..errors import PeerLostError, TensorWireError, TransportError, WireTimeoutError
from ..layout import OFF_SCRATCH, OFF_STATE, REGION_CLOSED
from ..memory import RegionInfo
from ..region import Region
from ..ring import RingMemory, SlotChooser
from ..split_copy import SplitCopier
from .base import (
    ENDED_BY_RECEIVER,
    Channel,
    PeerInfo,
    TensorEntry,
    TensorWriter,
    wait_giving_way,
)

log = logging.getLogger(__name__)

#: How often a writer asks the kernel whether the receiver process still lives.
WATCH_INTERVAL = 0.005
_monotonic = time.monotonic  # one name lookup on the per-message path, not two
#: Payloads below this are copied by a memoryview assignment (a plain memcpy, with fewer steps
#: around it: 0.69 against 0.84 us for 64 KiB, a one-off timing on the 2-core machine, and
#: 6-7% more throughput at 1 MiB in BENCHMARKS.md's "Fast routes"); larger ones by
#: ``np.copyto``, which releases the GIL while it copies. A memoryview copy holds it: here for
#: at most about 40 us (2 MiB), far below the 5 ms a thread running Python holds it before it
#: must let another thread have it (``sys.getswitchinterval``).
SMALL_COPY = 2 << 20
#: A GPU source at least this large, written into a GPU slot, is completed by the channel's
#: completion thread once its copy has landed, and ``write`` returns once the copy is queued;
#: smaller ones are synchronised in ``write``. Measured on an H100 (``tensorwire bench --device
#: cuda --transports shm``, two processes; this threshold at 1 MiB and at 32 MiB alternated, two
#: runs of each with 2 and with 8 slots): a message completed by the thread costs ~50 us however
#: small (not profiled; most likely the thread and the writer handing the interpreter's lock to
#: each other), so 1 MiB ran at
#: 16-28 GB/s deferred against 46-53 synchronised, and 16 MiB at 283-436 against 510-583. At 64
#: MiB the copy (~48 us) hides that: the same with 2 slots (1081-1103 GB/s), and with 8 slots
#: copies queued back to back reach 0.99x a device-to-device copy (1384-1385 GB/s).
DEFERRED_COMPLETION_BYTES = 32 << 20
#: How long closing a channel waits for its queued GPU copies to land and be completed.
COMPLETION_DRAIN_TIMEOUT = 10.0
#: How often a writer waiting for its GPU-made completion stores to land looks at its stream.
STORED_POLL = 50e-6
_STATE_WORD = OFF_STATE // 4
#: Regions of closed channels that GPU-made completion stores may still write into (their GPU
#: stuck past COMPLETION_DRAIN_TIMEOUT): kept mapped, and their pages registered, for good.
_STRANDED: list[Region] = []


def unavailable_reason(info: PeerInfo) -> str | None:
    """Why shm cannot reach this receiver, or None when it can."""
    if "shm" not in info.welcome.transports:
        return (
            "the receiver's regions are not in shared memory (it was made with shm=False, or "
            "has no usable /dev/shm)"
        )
    if not info.same_host:
        return "the receiver is on another host (or in another container/namespace)"
    return None


class ShmChannel(Channel):
    transport = "shm"

    def __init__(self, info: PeerInfo) -> None:
        reason = unavailable_reason(info)
        if reason is not None:
            raise TransportError(f"transport 'shm' cannot reach {info.control_address}: {reason}")
        self.address = info.control_address
        self.split_copier: SplitCopier | None = info.copier
        self._region_specs = list(info.regions)
        self._regions: dict[int, Region] = {}
        self._device_regions: dict[int, OpenedMemory] = {}
        self._same_process = info.welcome.pid == os.getpid()
        # the sender's look at the receiver (the pidfd its peer holds for a receiver on this
        # host), taken every WATCH_INTERVAL at most
        self._check_receiver = info.check
        self._next_watch = 0.0
        self._closed = False
        #: completes deferred GPU writes (started on the first one); ``_completing`` is held
        #: while a completion stores into a ring, and by close() before it unmaps them
        self._completions: Completions | None = None
        self._completing = threading.Lock()
        #: a ring published into without ringing the receiver (write_batch), to ring once
        self.bell_owed: RingMemory | None = None
        #: GPU-made completion stores per device, opened on the first GPU write where they were
        #: asked for (None: not asked for, or not available here)
        self._stores: dict[int, StreamStores | None] = {}
        #: writers with GPU-made completion stores not yet seen landed (drain and close wait)
        self._storing: set[ShmWriter] = set()
        try:
            self._bell_region = self._region(0)
            self._bell_words = self._bell_region.words32
        except BaseException:
            self.close()
            raise

    def update_regions(self, regions: list[RegionInfo]) -> None:
        self._region_specs = list(regions)

    def _region(self, index: int) -> Region:
        region = self._regions.get(index)
        if region is None:
            info = self._region_specs[index]
            if info.name is None or info.on_device:
                raise TransportError(f"region {index} of {self.address} is not shared")
            try:
                region = Region.attach(info.name, info.size)
            except TransportError as exc:
                if isinstance(exc.__cause__, FileNotFoundError):
                    # On this host (checked at the channel's start), a region it published is
                    # gone: the receiver unlinked it as it closed (or it died and was reaped).
                    # Before, a TransportError, which a parameter server forming its job took
                    # for a wrong address and exited 1 at (a worker that quit just after its
                    # join, before the server reached it).
                    raise PeerLostError(
                        f"receiver at {self.address} closed: its shared-memory region "
                        f"{info.name} is gone"
                    ) from exc
                raise
            self._regions[index] = region
        return region

    def _device_region(self, index: int) -> OpenedMemory:
        """The receiver's GPU region ``index``, opened once (its address, in our process)."""
        opened = self._device_regions.get(index)
        if opened is None:
            info = self._region_specs[index]
            own = info.address if self._same_process else None
            opened = OpenedMemory(info.handle, info.size, info.device, own)
            self._device_regions[index] = opened
        return opened

    def check_peer(self) -> None:
        # Per message: one flag, one word of the receiver's region, one clock read.
        if (
            self.lost is not None
            or self._bell_words[_STATE_WORD] == REGION_CLOSED
            or _monotonic() >= self._next_watch
        ):
            self._check_peer_slowly()

    def _check_peer_slowly(self) -> None:
        self.raise_if_lost()
        # A receiver that closes says so in its region header (for free). One that was killed
        # can only be seen through its pidfd: a syscall, so not on every tiny write.
        now = time.monotonic()
        watch = now >= self._next_watch
        if watch:
            self._next_watch = now + WATCH_INTERVAL
        self.check_receiver_runs(watch_process=watch)

    def check_receiver_runs(self, watch_process: bool = True) -> None:
        """PeerLostError if the receiver closed (its region says so) or, with
        ``watch_process``, its process is gone. Not for this sender's own session ending: a
        dropped writer's message in flight still completes (the receiver holds a new claim
        off until it has: docs/design.md, claims)."""
        if self._bell_words[_STATE_WORD] == REGION_CLOSED:
            self.lost = f"receiver at {self.address} closed"
            raise PeerLostError(self.lost)
        if watch_process and self._check_receiver is not None:
            try:
                self._check_receiver()
            except PeerLostError as exc:
                self.lost = str(exc)
                raise

    def ring_receiver(self) -> None:
        """Ring the receiver's doorbell for the messages published without it (a batch)."""
        if self.bell_owed is not None:
            ring, self.bell_owed = self.bell_owed, None
            ring.ring_receiver()

    def write_batch(self, writes: list[tuple[TensorWriter, Any]], deadline: float | None) -> None:
        """Every message published, the doorbell rung once (and before any wait for a credit,
        so that the receiver is never left asleep on messages it could take)."""
        try:
            for w, array in writes:
                assert isinstance(w, ShmWriter)
                w.write(array, deadline, bell=False)
        finally:
            self.ring_receiver()

    def writer(
        self, entry: TensorEntry, next_seq: int, released: int, slot_seqs: list[int], epoch: int
    ) -> TensorWriter:
        layout = entry.layout
        payload = None
        if entry.device is not None:
            payload = self._device_region(layout.payloads_in)
        ring = RingMemory(
            entry.spec, layout, self._region(layout.region), self._bell_region, payload
        )
        return ShmWriter(ring, next_seq, epoch, self)

    def completions(self) -> Completions:
        if self._completions is None:
            self._completions = Completions(f"tensorwire-shm-completions-{self.address}")
        return self._completions

    def stream_stores(self, device: int) -> StreamStores | None:
        """GPU-made completion stores on ``device`` (opened once, with a test store into the
        receiver's scratch line), unless ``TENSORWIRE_GPU_STREAM_STORES=0`` or the driver
        declines; else None."""
        if device not in self._stores:
            self._stores[device] = (
                cuda_stores.open_stores(device, self._bell_region.address + OFF_SCRATCH)
                if cuda_stores.enabled()
                else None
            )
        return self._stores[device]

    def storing(self, writer: ShmWriter, now: bool) -> None:
        """``writer`` has GPU-made completion stores in flight (``now``), or no longer."""
        if now:
            self._storing.add(writer)
        else:
            self._storing.discard(writer)

    def tick(self) -> None:
        """End the writes whose GPU-made completion stores landed while their writers idle: a
        writer's WRITING announcement (which holds off a new claim of its tensor) and the
        receiver's doorbell should not wait for its next call. Under ``_completing``, so that
        close() does not unmap the rings meanwhile."""
        if not self._storing:
            return
        with self._completing:
            if self._closed:
                return
            for writer in list(self._storing):
                writer.reap()

    def drain(self, deadline: float | None) -> None:
        """Return once every deferred GPU write has been completed (or failed: then the channel
        is lost and this raises)."""
        for writer in list(self._storing):
            writer.await_stored(deadline)
        completions = self._completions
        if completions is not None and not completions.drain(deadline):
            raise WireTimeoutError(
                f"GPU copies to {self.address} did not land in time (the GPU is busy with "
                "work queued before them, or stuck)"
            )
        self.raise_if_lost()

    def complete(
        self, finish: Callable[[BaseException | None], None], error: BaseException | None
    ) -> None:
        """From the completion thread: ``finish(error)`` (the completion store, or after a
        failed copy only the end of the write), unless the channel has been closed (its rings
        unmapped) meanwhile. A failed copy loses the channel: the next call says why."""
        with self._completing:
            if self._closed:
                return
            if error is not None and self.lost is None:
                self.lost = f"a GPU copy to {self.address} failed: {error}"
            finish(error)

    def goodbye(self, timeout: float) -> bool:
        self._next_watch = 0.0  # look at the receiver now, not at the next interval
        self.drain(deadline_of(timeout))  # the goodbye goes after every message we wrote
        self.check_peer()
        return False

    def close(self) -> None:
        if self._closed:
            return
        completions, self._completions = self._completions, None
        if completions is not None and not completions.close(COMPLETION_DRAIN_TIMEOUT):
            log.warning(
                "closing the shm channel to %s: GPU copies still in flight after %g s; their "
                "messages will not be completed",
                self.address,
                COMPLETION_DRAIN_TIMEOUT,
            )
        with self._completing:  # a completion still storing finishes first; later ones skip
            self._closed = True
        landed = True
        for writer in list(self._storing):
            try:
                writer.await_stored(deadline_of(COMPLETION_DRAIN_TIMEOUT))
            except TensorWireError as exc:
                landed = False
                log.warning("closing the shm channel to %s: %s", self.address, exc)
        for stores in self._stores.values():
            if stores is not None and landed:
                stores.close()
        self._stores.clear()
        self.lost = f"channel to {self.address} is closed"
        if landed:
            for region in self._regions.values():
                region.close()
        else:
            # A store still queued into an unregistered page would fault the GPU, and one into a
            # page whose address a new mapping took would land there: the pages stay registered
            # and mapped until the process ends.
            _STRANDED.extend(self._regions.values())
        self._regions.clear()
        for opened in self._device_regions.values():
            opened.close()
        self._device_regions.clear()


class ShmWriter(TensorWriter):
    takes_device = True  # copies from GPU arrays itself, into host or GPU slots

    def __init__(self, ring: RingMemory, next_seq: int, epoch: int, channel: ShmChannel) -> None:
        self.spec = ring.spec
        self._ring = ring
        self.next_seq = next_seq
        self._epoch = epoch
        self._channel = channel
        self._dynamic = ring.spec.dynamic
        self._slots = SlotChooser(ring.slot_seqs())
        self._slot = -1
        #: small copies go through the slots' byte memoryviews (a plain memcpy) where the dtype
        #: can be exported through the buffer protocol (not bfloat16, float8: numpy copies those)
        self._by_bytes = ring.device is None and exports_buffer(ring.spec.dtype)
        #: every message is small, static and in host memory: :meth:`write` in one ring call
        #: (which copies through the slot's own array, so any dtype)
        self._whole = (
            ring.device is None and not self._dynamic and 0 < ring.spec.max_bytes < SMALL_COPY
        )
        #: Sender.write's fast routes take every static host tensor (write_now)
        self.writes_now = ring.device is None and not self._dynamic
        self.depth = ring.depth
        #: GPU slots: messages entered and not yet complete (deferred completions included).
        #: The WRITING announcement stays up while there are any: the receiver must not hand
        #: the ring to a new claim while a completion of ours may still store into it.
        self._device = ring.device
        self._unfinished = 0
        self._unfinished_lock = threading.Lock()
        #: GPU-made completion stores into this ring (looked for at the first GPU message):
        #: the device address of each slot's sequence-number word
        self._stores: StreamStores | None = None
        self._stores_looked = False
        self._seq_targets: list[int] = []
        #: messages whose completion store the GPU makes, not yet seen landed, oldest first:
        #: (slot, seq, stream, source: kept alive until the copy has read it)
        self._stored: deque[tuple[int, int, Any, Any]] = deque()

    def acquire(self, shape: tuple[int, ...], deadline: float | None) -> Any:
        self._enter(deadline)
        return self._ring.slot_view(self._slot, shape if self._dynamic else None)

    def _enter(self, deadline: float | None) -> None:
        """Wait for a credit, announce the write and choose its slot."""
        if self._stored:
            self.reap()
        released = self._credit(deadline)
        if self._device is not None:
            self._enter_counted()
        elif not self._ring.enter_write(self._epoch):
            raise self._revoked()
        self._slot = self._slots.choose(released)

    def _enter_counted(self) -> None:
        """GPU slots: announce the write, unless the announcement is still up for an unfinished
        message (then only check that the claim still holds)."""
        with self._unfinished_lock:
            if self._unfinished:
                if not self._ring.owned_by(self._epoch):
                    raise self._revoked()
            elif not self._ring.enter_write(self._epoch):
                raise self._revoked()
            self._unfinished += 1

    def _leave(self) -> None:
        """The message entered is complete or abandoned."""
        if self._device is None:
            self._ring.leave_write()
            return
        with self._unfinished_lock:
            self._unfinished -= 1
            if not self._unfinished:
                self._ring.leave_write()

    def slot_free(self) -> bool:
        return self._ring.has_credit(self.next_seq)

    def await_slot(self, deadline: float | None) -> None:
        if self._ring.has_credit(self.next_seq):
            return  # (the common case: what follows checks again)
        if self._stored:
            self.reap()
        self._credit(deadline)

    def _credit(self, deadline: float | None) -> int:
        """Check the receiver, wait for a credit for the next message; the ring's released
        count (a slot free by it stays free)."""
        seq = self.next_seq
        ring = self._ring
        channel = self._channel
        channel.check_peer()
        if not ring.has_credit(seq):
            channel.ring_receiver()  # never wait on a consumer we have not told about a batch
            started = time.perf_counter()
            wait_giving_way(
                lambda until: ring.wait_credit(seq, until, channel.check_peer),
                deadline,
                channel.give_way,
            )
            self.traffic.waited(time.perf_counter() - started)
        return ring.released

    def _revoked(self) -> PeerLostError:
        text = (
            f"tensor {self.spec.name!r}: the receiver at {self._channel.address} revoked this "
            f"sender's claim ({ENDED_BY_RECEIVER}); nothing was written"
        )
        self._channel.mark_lost(text)  # the session is over: lost() says so from now on
        return PeerLostError(text)

    def commit(self, shape: tuple[int, ...]) -> None:
        try:
            # A buffer() block may last long: a receiver that closed or died meanwhile would
            # get a message nobody reads, and the block would end as if it were delivered (it
            # did, where the networked transports raise PeerLostError as they send).
            self._channel.check_receiver_runs()
        except PeerLostError:
            self.abort()
            raise
        nbytes = int(np.prod(shape)) * self.spec.dtype.itemsize
        device = self._device
        if device is not None:
            try:  # the kernels that filled the slot are queued on the current stream
                stores = self._gpu_stores(device)
                if stores is not None:
                    self._store_behind(stores, current_stream(device), nbytes, shape, None, None)
                    return
                # > 1: this message, entered by acquire(), counts itself
                if nbytes >= DEFERRED_COMPLETION_BYTES or self._unfinished > 1:
                    self._complete_later(current_stream(device), device, nbytes, shape, None)
                    return
                synchronize_current(device)
            except BaseException:
                self.abort()
                raise
        self._publish(nbytes, shape)

    def abort(self) -> None:
        self._leave()

    def _publish(self, nbytes: int, shape: tuple[int, ...], bell: bool = True) -> None:
        ring = self._ring
        ring.publish(self._slot, self.next_seq, nbytes, shape if self._dynamic else None, bell)
        self._leave()  # after the completion store: a new claim sees the message
        self._published(self._slot, bell)

    def _complete_later(
        self, stream: Any, device: int, nbytes: int, shape: tuple[int, ...], source: Any
    ) -> None:
        """The message entered is complete once the work queued on ``stream`` so far has
        finished: the channel's completion thread stores its sequence number then (and rings
        the receiver). ``source`` is kept alive until then: the memory of an array its owner
        dropped could otherwise be handed out again before the copy has read it."""
        slot, seq = self._slot, self.next_seq
        finish = functools.partial(
            self._finish, slot, seq, nbytes, shape if self._dynamic else None, source
        )
        channel = self._channel
        channel.completions().after(stream, device, functools.partial(channel.complete, finish))
        self._slots.wrote(slot, seq)
        self.next_seq = seq + 1

    def _finish(
        self,
        slot: int,
        seq: int,
        nbytes: int,
        shape: tuple[int, ...] | None,
        source: Any,
        error: BaseException | None,
    ) -> None:
        """From the completion thread: message ``seq``'s copy into ``slot`` has landed (or
        failed: then the message is never completed, and only the write ends)."""
        del source  # held until now (see _complete_later)
        if error is None:
            self._ring.publish(slot, seq, nbytes, shape, True)
        self._leave()

    def _published(self, slot: int, bell: bool) -> None:
        """The next message is complete in ``slot`` (``bell=False``: the doorbell is owed)."""
        seq = self.next_seq
        self._slots.wrote(slot, seq)
        self.next_seq = seq + 1
        if not bell:
            self._channel.bell_owed = self._ring

    def write_now(self, array: Any, timeout: float | None) -> bool:
        # ShmWriter.write's paths of static tensors without their waits: the whole per-message
        # path of Sender.write's fast routes (writes_now is set for those tensors)
        channel = self._channel
        if (  # check_peer(), inline
            channel.lost is not None
            or channel._bell_words[_STATE_WORD] == REGION_CLOSED
            or _monotonic() >= channel._next_watch
        ):
            channel._check_peer_slowly()
        if self._device is not None:
            return self._write_device_now(array, timeout)
        ring = self._ring
        if self._whole:
            if ring.write_next(self._slots, self.next_seq, self._epoch, array, True) > 0:
                self.next_seq += 1
                return True
            return False
        released = ring.released
        if self.next_seq - released > self.depth or not ring.enter_write(self._epoch):
            return False  # no credit, or a revoked claim: the general path waits or raises
        self._slot = self._slots.choose(released)
        try:
            self._copy_from_host(array)
        except BaseException:
            self.abort()
            raise
        self._publish(array.nbytes, array.shape)
        return True

    def _write_device_now(self, array: Any, timeout: float | None) -> bool:
        """:meth:`write_now` of a cupy array (the spec's dtype and static shape): the path of
        :meth:`_write_stored` (``_enter``, ``Copier.queue``) with its steps inline and without
        its waits, where the GPU makes the completion stores and the array is on the slots' GPU.
        A message here costs only its Python work on the host (the GPU copies and completes it
        later), so that work bounds how fast a stream of messages can go: one call saved is
        about a tenth of a microsecond of a 16 MiB message's 9 us copy on an H100."""
        stores = self._stores
        device = self._device
        if stores is None or array.__class__ is not self.now_class:
            return False  # a host array (the route takes both), or the stores were given up
        if array.data.device_id != device:
            return False
        assert device is not None  # stores are made for GPU slots only
        ring = self._ring
        oldest = self._oldest_stored()
        if oldest is not None and ring.seq_at(oldest[0]) >= oldest[1]:
            self.reap()  # the oldest landed: end it (and those after it that did)
        released = ring.released
        if self.next_seq - released > self.depth:
            return False  # no credit: the general path waits for one
        cp = cupy()
        with cp.cuda.Device(device):
            stream = current_stream_here(device)  # the producer's, behind the work that made it
            newest = self._newest_stored()
            if newest is not None and newest[2].ptr != stream.ptr:
                return False  # another stream than the last message's: ordered by write()
            self._enter_counted()  # PeerLostError where the claim was revoked: nothing written
            slot = self._slots.choose(released)
            self._slot = slot
            nbytes = array.nbytes
            try:
                runtime = cp.cuda.runtime
                runtime.memcpyAsync(
                    ring.payload_addresses[slot],
                    array.data.ptr,
                    nbytes,
                    runtime.memcpyDefault,
                    stream.ptr,
                )
                self._store_behind(stores, stream, nbytes, array.shape, array, None)
            except BaseException:
                self.abort()
                raise
        return True

    def _copy_from_host(self, array: np.ndarray[Any, Any]) -> None:
        """Copy ``array`` (host memory, checked against the spec) into the entered slot."""
        nbytes = array.nbytes
        if 0 < nbytes < SMALL_COPY and self._by_bytes:
            ring = self._ring
            at = ring.payload_offsets[self._slot]
            ring.region_bytes[at : at + nbytes] = array.data.cast("B")  # type: ignore[index]
            return
        dst = self._ring.slot_view(self._slot, array.shape if self._dynamic else None)
        split = self._channel.split_copier
        if split is not None:  # it copies whole what is too small to split
            # check_array made it C-contiguous, of the slot's dtype and shape
            split.copy(dst.reshape(-1).view(np.uint8), array.reshape(-1).view(np.uint8))
        else:
            np.copyto(dst, array, casting="no")

    def write(self, array: Any, deadline: float | None, bell: bool = True) -> None:
        """``bell=False``: publish without ringing the receiver (the channel rings it once for
        a batch, :meth:`ShmChannel.write_batch`)."""
        ring = self._ring
        if self._whole and isinstance(array, np.ndarray):
            # The per-message path of small tensors: the credit check, slot choice, announcing,
            # copying, publishing and leaving in one ring call, which waits for nothing.
            self._channel.check_peer()
            done = ring.write_next(self._slots, self.next_seq, self._epoch, array, bell)
            if not done:  # no credit: wait for one, then there is
                self._credit(deadline)
                done = ring.write_next(self._slots, self.next_seq, self._epoch, array, bell)
            if done < 0:
                raise self._revoked()
            self.next_seq += 1
            if not bell:
                self._channel.bell_owed = ring
            return
        if self._device is not None:
            self._write_to_device(array, deadline, bell)
            return
        self._enter(deadline)
        try:
            if isinstance(array, np.ndarray):
                self._copy_from_host(array)
            else:  # a GPU source into a host slot (synchronised before the store)
                device = int(array.data.device_id)
                dst_address = ring.payload_addresses[self._slot]
                copier().copy(dst_address, data_pointer(array), array.nbytes, device, True)
        except BaseException:
            self.abort()
            raise
        self._publish(array.nbytes, array.shape, bell)

    def _write_to_device(self, array: Any, deadline: float | None, bell: bool) -> None:
        """A message into GPU slots, from host or GPU memory: a CUDA copy, synchronised before
        the completion store or (a large GPU source, or others still unfinished) completed by
        the completion thread behind it. Messages complete in the order they were written."""
        host = isinstance(array, np.ndarray)
        if not host:
            stores = self._gpu_stores(int(array.data.device_id))
            if stores is not None:
                self._write_stored(array, deadline, stores)
                return
        if self._stored:  # messages complete in order: a host source after the stored ones
            self.await_stored(deadline)
        nbytes = array.nbytes
        deferred = not host and (nbytes >= DEFERRED_COMPLETION_BYTES or self._unfinished > 0)
        if self._unfinished and not deferred:
            self._channel.drain(deadline)  # a host source: after the deferred ones before it
        self._enter(deadline)
        try:
            device = self._device if host else int(array.data.device_id)
            assert device is not None
            dst, src = self._ring.payload_addresses[self._slot], data_pointer(array)
            if deferred:  # on the producer's stream, behind the work that made the source
                stream = copier().queue(dst, src, nbytes, device, ordered=True)
                self._complete_later(stream, device, nbytes, array.shape, array)
                return
            copier().copy(dst, src, nbytes, device, ordered=not host)
        except BaseException:
            self.abort()
            raise
        self._publish(nbytes, array.shape, bell)

    # -- GPU-made completion stores (tensorwire.cuda_stores) -----------------------------------

    def _gpu_stores(self, device: int) -> StreamStores | None:
        """The GPU-made completion stores for a GPU source on ``device``, where the channel has
        them and the source is on the slots' GPU; None: synchronise or defer as before."""
        if not self._stores_looked:
            self._stores_looked = True
            assert self._device is not None
            stores = self._channel.stream_stores(self._device)
            if stores is not None:
                try:
                    self._seq_targets = [stores.map(a) for a in self._ring.seq_addresses]
                except Exception as exc:  # cupy's runtime and the driver raise their own
                    log.info(
                        "tensor %r: GPU-made completion stores unavailable: %s", self.spec.name, exc
                    )
                else:
                    self._stores = stores
                    self._ring.announce_device_stores()
                    # Sender.write's fast routes take a static tensor's cupy arrays from now on
                    self.writes_now = not self._dynamic
                    self.now_class = cupy().ndarray
        return self._stores if device == self._device else None

    def _write_stored(self, array: Any, deadline: float | None, stores: StreamStores) -> None:
        """A GPU source into our GPU slot: the copy on the producer's stream, behind the work
        that made the source, and the completion store behind the copy; returns once both are
        queued. No doorbell: the receiver's waits look at the ring again within a millisecond
        (the ring says the GPU completes its messages), and the next call rings it for what has
        landed meanwhile."""
        self._enter(deadline)
        try:
            assert self._device is not None
            nbytes = array.nbytes
            stream = copier().queue(
                self._ring.payload_addresses[self._slot],
                data_pointer(array),
                nbytes,
                self._device,
                ordered=True,
            )
            self._store_behind(stores, stream, nbytes, array.shape, array, deadline)
        except BaseException:
            self.abort()
            raise

    def _store_behind(
        self,
        stores: StreamStores,
        stream: Any,
        nbytes: int,
        shape: tuple[int, ...],
        source: Any,
        deadline: float | None,
    ) -> None:
        """Complete the entered message once the work queued on ``stream`` so far has finished:
        its size (and shape) stored now, its sequence number stored by the GPU then."""
        stored = self._stored
        newest = self._newest_stored()
        if newest is not None and newest[2].ptr != stream.ptr:
            # Stores on two streams could land out of order, and a receiver counts a message
            # as pending only once every one before it is complete: the earlier ones first.
            self.await_stored(deadline)
        slot, seq = self._slot, self.next_seq
        self._ring.describe_slot(slot, nbytes, shape if self._dynamic else None)
        try:
            stores.store(stream.ptr, self._seq_targets[slot], seq)
        except TransportError as exc:
            # Refused on this stream though the channel's test store landed: this message is
            # completed as without the stores (its copy, and every store queued before it on
            # the stream, waited for), and so are the tensor's next ones.
            log.warning(
                "tensor %r: %s; its GPU writes wait for their copies from now on",
                self.spec.name,
                exc,
            )
            self._stores = None
            with cupy().cuda.Device(self._device):  # the legacy default stream is per device
                stream.synchronize()
            self._publish(nbytes, shape)
            return
        with self._unfinished_lock:
            stored.append((slot, seq, stream, source))
        self._channel.storing(self, True)
        self._slots.wrote(slot, seq)
        self.next_seq = seq + 1
        # The GPU's store will ring nobody: say it is coming and ring now, so that a receiver
        # asleep on this tensor wakes and watches for it (measured on an H200: a 4 KiB round
        # trip took 2.3 ms while the receiver looked again only every millisecond).
        self._ring.queued_device_store(seq)
        self._ring.ring_receiver()

    # The heartbeat thread's tick (ShmChannel.tick) reaps too, without the sender's lock: the
    # last message in flight may end between a look at the deque and a read of it.

    def _oldest_stored(self) -> tuple[int, int, Any, Any] | None:
        """The oldest message whose completion store is still on its way (None: none)."""
        try:
            return self._stored[0]
        except IndexError:
            return None

    def _newest_stored(self) -> tuple[int, int, Any, Any] | None:
        """The newest message whose completion store is still on its way (None: none)."""
        try:
            return self._stored[-1]
        except IndexError:
            return None

    def reap(self, all_ran: bool = False) -> None:
        """End the writes whose GPU-made completion store has landed, oldest first (every one,
        with ``all_ran``: their stream has run them), and ring the receiver if any did (it may
        sleep: those stores ring nobody)."""
        stored = self._stored
        seq_at = self._ring.seq_at
        landed = 0
        with self._unfinished_lock:
            while stored and (all_ran or seq_at(stored[0][0]) >= stored[0][1]):
                stored.popleft()
                landed += 1
            self._forget(landed)
        if landed:
            self._ring.ring_receiver()

    def _forget(self, landed: int) -> None:
        """(Under ``_unfinished_lock``.) ``landed`` stored messages are complete."""
        self._unfinished -= landed
        if landed and not self._unfinished:
            self._ring.leave_write()  # after the completion stores: a new claim sees them
        if not self._stored:
            self._channel.storing(self, False)

    def await_stored(self, deadline: float | None) -> None:
        """Return once every GPU-made completion store of ours has landed. A stream that has
        not run them by ``deadline``, or that failed, loses the channel (the GPU is stuck, or
        the copy faulted): :class:`WireTimeoutError` or :class:`PeerLostError` then."""
        while self._stored:
            self.reap()
            newest = self._newest_stored()
            if newest is None:
                return
            try:
                # everything queued on it has run, the stores included: also those whose slot
                # a new registration of the tensor zeroed meanwhile (under the device: the
                # legacy default stream is the current device's)
                with cupy().cuda.Device(self._device):
                    ran = bool(newest[2].done)
            except Exception as exc:  # cupy's CUDARuntimeError: the copy failed
                lost = f"a GPU copy to {self._channel.address} failed: {exc}"
                self._channel.mark_lost(lost)
                raise PeerLostError(lost) from None
            if ran:
                self.reap(all_ran=True)
                return
            if deadline is not None and time.monotonic() >= deadline:
                lost = (
                    f"GPU copies to {self._channel.address} did not land in time (the GPU is "
                    "busy with work queued before them, or stuck)"
                )
                self._channel.mark_lost(lost)
                raise WireTimeoutError(lost)
            time.sleep(STORED_POLL)
