"""The ``shm`` transport: one-sided writes into a same-host receiver's shared memory.

The sender maps the receiver's regions (pre-populated at connect), copies each payload straight into
the slot's memory with a single ``np.copyto``, then stores the slot's sequence number and rings the
receiver's doorbell. The receiver's CPU does nothing per byte. Credits come back through the ring's
``released`` word in the same memory, so there is no per-message control traffic at all.

A GPU tensor's slots are in the receiver's GPU memory: the sender opens each of its GPU regions
once by the CUDA IPC handle the address book publishes, copies the payload (from host or GPU
memory) with ``cudaMemcpyAsync`` on a stream of its own, synchronises that stream and only then
stores the sequence number. A sender killed mid-copy never makes that store.

The receiver is watched through a pidfd and the region's state word: a write to a receiver that died
or closed raises :class:`~tensorwire.errors.PeerLostError` instead of landing in orphaned memory.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ..cuda import OpenedMemory, copier, data_pointer, synchronize_current
from ..errors import PeerLostError, TransportError
from ..layout import OFF_STATE, REGION_CLOSED
from ..memory import RegionInfo
from ..process import ProcessWatch, host_identity
from ..region import Region
from ..ring import RingMemory, SlotChooser
from .base import Channel, PeerInfo, TensorEntry, TensorWriter

#: How often a writer asks the kernel whether the receiver process still lives.
WATCH_INTERVAL = 0.005


def unavailable_reason(info: PeerInfo) -> str | None:
    """Why shm cannot reach this receiver, or None when it can."""
    if "shm" not in info.welcome.transports:
        return "the receiver's regions are not in shared memory"
    if info.welcome.host != host_identity():
        return "the receiver is on another host (or in another container/namespace)"
    return None


class ShmChannel(Channel):
    transport = "shm"

    def __init__(self, info: PeerInfo) -> None:
        reason = unavailable_reason(info)
        if reason is not None:
            raise TransportError(f"transport 'shm' cannot reach {info.control_address}: {reason}")
        self.address = info.control_address
        self._region_specs = list(info.regions)
        self._regions: dict[int, Region] = {}
        self._device_regions: dict[int, OpenedMemory] = {}
        self._same_process = info.welcome.pid == os.getpid()
        self._watch = ProcessWatch(info.welcome.pid)
        self._next_watch = 0.0
        self._closed = False
        try:
            self._bell_region = self._region(0)
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
            region = Region.attach(info.name, info.size)
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
        self.raise_if_lost()
        if self._bell_region.words32[OFF_STATE // 4] == REGION_CLOSED:
            self.lost = f"receiver at {self.address} closed"
            raise PeerLostError(self.lost)
        # A receiver that closes says so in its region header (checked above, for free). One that
        # was killed can only be seen through its pidfd: a syscall, so not on every tiny write.
        now = time.monotonic()
        if now >= self._next_watch:
            self._next_watch = now + WATCH_INTERVAL
            if not self._watch.alive():
                self.lost = f"receiver at {self.address} (pid {self._watch.pid}) died"
                raise PeerLostError(self.lost)

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

    def goodbye(self, timeout: float) -> bool:
        self._next_watch = 0.0  # look at the receiver now, not at the next interval
        self.check_peer()
        return False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.lost = f"channel to {self.address} is closed"
        self._watch.close()
        for region in self._regions.values():
            region.close()
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

    def acquire(self, shape: tuple[int, ...], deadline: float | None) -> Any:
        self._enter(deadline)
        return self._ring.slot_view(self._slot, shape if self._dynamic else None)

    def _enter(self, deadline: float | None) -> None:
        """Wait for a credit, announce the write and choose its slot."""
        seq = self.next_seq
        self._channel.check_peer()
        if not self._ring.has_credit(seq):
            self._ring.wait_credit(seq, deadline, self._channel.check_peer)
        if not self._ring.enter_write(self._epoch):
            raise PeerLostError(
                f"tensor {self.spec.name!r}: the receiver at {self._channel.address} revoked this "
                "sender's claim (it dropped the session, e.g. after no heartbeat for longer than "
                "its heartbeat timeout); nothing was written"
            )
        self._slot = self._slots.choose(self._ring.released)

    def commit(self, shape: tuple[int, ...]) -> None:
        nbytes = int(np.prod(shape)) * self.spec.dtype.itemsize
        if self._ring.device is not None:
            try:  # the kernels that filled the slot are queued on the current stream
                synchronize_current(self._ring.device)
            except BaseException:
                self.abort()
                raise
        self._publish(nbytes, shape)

    def abort(self) -> None:
        self._ring.leave_write()

    def _publish(self, nbytes: int, shape: tuple[int, ...]) -> None:
        seq = self.next_seq
        self._ring.publish(self._slot, seq, nbytes, shape if self._dynamic else None)
        self._ring.leave_write()  # after the completion store: a new claim sees the message
        self._slots.wrote(self._slot, seq)
        self.next_seq = seq + 1

    def write(self, array: Any, deadline: float | None) -> None:
        ring = self._ring
        host = isinstance(array, np.ndarray)
        if host and ring.device is None:
            dst = self.acquire(array.shape, deadline)
            try:
                np.copyto(dst, array, casting="no")
            except BaseException:
                self.abort()
                raise
        else:  # GPU memory at either end: CUDA copies (and is synchronised before the store)
            self._enter(deadline)
            try:
                device = ring.device if host else int(array.device.id)
                assert device is not None
                dst = ring.payload_addresses[self._slot]
                copier().copy(dst, data_pointer(array), array.nbytes, device, ordered=not host)
            except BaseException:
                self.abort()
                raise
        self._publish(array.nbytes, array.shape)
