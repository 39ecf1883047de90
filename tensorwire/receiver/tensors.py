"""The receiver's registry of tensors and the memory they live in.

Registering a tensor reserves its ring (slot headers, payloads, credit words) in the receiver's
regions: page-aligned slabs of registered memory (:class:`~tensorwire.memory.Memory`), allocated
a few megabytes at a time so that many small tensors share few registrations. A GPU tensor's
payloads go to a span of GPU memory on its device (:class:`~tensorwire.cuda.DeviceMemory`,
allocated the same way) while its words stay in host memory. Each new span is handed to
``on_new_memory`` (the data servers register it with their libraries). The first region also
holds the doorbell every consumer waits on and every writer rings.

The registry knows each tensor's spec, ring, read-only views and claim state; the other parts of
the receiver look tensors up here, by name (the consumer API) or by id (claims and writes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..checks import check_count
from ..doorbell import ring_bell
from ..errors import SpecMismatchError, TensorWireError, UnknownTensorError
from ..layout import (
    MAX_DEPTH,
    OFF_DOORBELL,
    OFF_GENERATION,
    OFF_MAGIC,
    OFF_RX_WAITING,
    OFF_STATE,
    PAGE,
    REGION_CLOSED,
    REGION_HEADER_SIZE,
    REGION_MAGIC,
    REGION_OPEN,
    RingLayout,
    align,
    auto_depth,
    control_footprint,
    payloads_footprint,
    plan_parts,
    plan_ring,
    ring_footprint,
)
from ..memory import Memory, RegionInfo
from ..metrics import Traffic
from ..process import ProcessWatch
from ..received import received
from ..region import Region
from ..ring import RingMemory
from ..spec import TensorSpec, names_listed, shown_name
from .state import ReceiverState

if TYPE_CHECKING:
    from ..transports.base import Poller
    from .sessions import Session

#: Rings a moved tensor keeps before it moves back into the oldest (TensorTable.move): a
#: dropped writer would have to stay stalled through the sessions of this many writers after it.
RETIRED_RINGS = 2

#: Seconds a region made ahead for a move (ready_to_move) is kept unused before the control
#: thread's tick closes it: the claim it was made for asks again every 50 ms, and one that
#: does not (its sender died or gave up) left it, as large as the ring, until the receiver
#: closed or a later region was made from it.
SPARE_KEPT = 5.0

#: A networked writer hears of released slots in batches of up to depth // CREDIT_BATCH_DIVISOR
#: (Consumer.release): a credit message per release costs the receiver of a small message about
#: as much as the message itself.
CREDIT_BATCH_DIVISOR = 2


#: A loss's ``until`` while no writer has claimed the tensor after the lost one.
UNCLAIMED = 1 << 64


@dataclass(eq=False)
class Loss:
    """A lost writer's notice, owed to the consumer: raised (PeerLostError) once every message
    that writer completed has been handed out, before the first message of its successor,
    whose sequence number is ``until`` (UNCLAIMED while none has claimed the tensor). Before,
    the successor's claim cleared the notice: a consumer that had not waited in between read
    the dead writer's messages and then the new one's, never told of the loss (a CI run: a
    sender restarted on another host, its successor's message handed out first)."""

    reason: str
    until: int = UNCLAIMED


@dataclass(eq=False)
class RegisteredTensor:
    """Receiver-side state of one registered tensor."""

    tensor_id: int
    spec: TensorSpec
    ring: RingMemory
    #: static tensors: each slot's view as wait() hands it out (a read-only ReceivedArray, or
    #: cupy), made at its first use (make_view)
    views: list[Any] | None
    consumed: int = 0  # messages handed out by wait()
    released: int = 0  # messages handed back by release()
    credited: int = 0  # of those, how many the owner has been told of (networked writers)
    owner: Session | None = None
    transport: str = ""
    #: the writer stores into our memory and completes slots itself (shm), rather than one of
    #: our own threads doing it for the data it receives
    sender_completes: bool = False
    #: what a waiting consumer calls to complete the owner's messages itself (DataServer.poller)
    poll: Poller | None = None
    expected_seq: int = 1  # next sequence number a networked writer must send
    #: notices of lost writers the consumer has not been told of yet, oldest first (None when
    #: there are none: the per-message paths read only that)
    lost: list[Loss] | None = None
    #: (epoch, highest complete sequence number) when the consumer last drained the tensor: it
    #: declared that writer gone, so the receiver's own later notice of its loss is stale
    drained: tuple[int, int] | None = None
    epoch: int = 0  # claims granted so far; the ring's owner word holds the current one
    #: a shared-memory writer that was dropped while its process lived: it may be inside a write
    stale_writer: ProcessWatch | None = None
    #: the session whose payload is landing right now through one of our own threads
    inflight: Session | None = None
    #: a GPU tensor's host staging area for payloads that arrive over a network (pinned memory)
    staging: Any = None
    #: how much of the payload arriving there has been queued for the copy into the slot
    staged_upto: int = 0
    #: where messages handed to the consumer are counted (by name and the claim's transport)
    traffic: Traffic = dataclasses.field(default_factory=Traffic)
    #: a static host tensor's slots as one read-only array, whose rows are its views
    view_block: Any = None
    #: a part of a tensor registered in parts: its payload lies within the whole's view
    in_group: bool = False
    #: its writer was dropped while it could still store into our memory (nixl): the next
    #: claim moves the ring to memory that writer never reached (TensorTable.move)
    move_before_claim: bool = False
    #: rings the tensor moved away from, oldest first: each layout with how many messages the
    #: consumer had taken then (held views of it may still be read until they are released)
    retired: list[tuple[RingLayout, int]] = dataclasses.field(default_factory=list)

    def make_view(self, slot: int) -> Any:
        """``slot``'s view, made and kept in ``views`` (a registration made all of them at
        once, 32 of a small tensor: BENCHMARKS.md, "Slot views made at first use"). Each row
        of the read-only block is read-only; GPU memory cannot be marked read-only, so a
        device tensor's views are plain cupy arrays."""
        assert self.views is not None
        if self.view_block is not None:
            view = self.view_block[slot]
        elif self.ring.device is None:
            view = received(self.ring.static_view(slot))
        else:
            view = self.ring.static_view(slot)
        self.views[slot] = view
        return view

    @property
    def device(self) -> int | None:
        """The CUDA device its slots are on (None: host memory)."""
        return self.ring.device

    #: releases a networked writer may hear of together (see Consumer.release); set from the
    #: ring's depth once, not computed per release
    credit_batch: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.credit_batch = max(1, self.ring.depth // CREDIT_BATCH_DIVISOR)

    @property
    def slot_free(self) -> bool:
        """May the consumer take another message (it holds fewer than the ring's depth)?"""
        return self.consumed - self.released < self.ring.depth

    def wire_entry(self, compact: bool = False) -> list[Any]:
        return [self.tensor_id, self.spec.to_wire(), self.ring.layout.to_wire(compact)]


class TensorTable:
    """Every tensor of one receiver, and the regions they live in. Mutated under the state's
    lock."""

    def __init__(
        self,
        state: ReceiverState,
        *,
        ring_depth: int | None,
        region_bytes: int,
        shared: bool,
        on_new_memory: Callable[[Memory], None],
    ) -> None:
        self._state = state
        self._ring_depth = ring_depth
        self._region_bytes = max(align(region_bytes, PAGE), 2 * PAGE)
        #: regions in shared memory, so that senders on this host can map them
        self.shared = shared
        self._on_new_memory = on_new_memory
        #: every span, host and GPU, in the order the address book publishes them
        self.regions: list[Any] = []
        self._next_offset = 0  # in the newest host region
        self._host_index = 0  # the newest host region's place in ``regions``
        #: per CUDA device: its newest span's place in ``regions``, and the next free offset
        self._device_cursor: dict[int, tuple[int, int]] = {}
        self.by_name: dict[str, RegisteredTensor] = {}
        self.by_id: dict[int, RegisteredTensor] = {}
        # registration order, which wait_any() serves round-robin: a list appended to, and the
        # tuple that ``order`` hands out, rebuilt only after a registration (before, every
        # registration copied the tuple: registering 20,000 tensors took 11.5 s, most of it
        # copying)
        self._order: list[RegisteredTensor] = []
        self._order_version = 0
        self._order_snapshot: tuple[int, tuple[RegisteredTensor, ...]] = (0, ())
        self._groups: dict[str, Any] = {}  # register_parts: name -> whole view
        #: a host region made outside the lock for the next reservation that needs one
        #: (make_room), and the lock of that one field (never held while the state's is sought)
        self._spare: Region | None = None
        self._spare_made = 0.0  # when (time.monotonic())
        self._spare_lock = threading.Lock()
        self._making: threading.Thread | None = None  # a thread making the spare for a move
        self._made = True  # whether the last one made it
        self.bell = self._new_region(self._region_bytes)

    # -- memory ------------------------------------------------------------------------------

    def _region_size(self, need: int) -> int:
        """The size of a new host region with room for ``need`` bytes."""
        return max(self._region_bytes, REGION_HEADER_SIZE + align(need, PAGE))

    def _room_at_hand(self, need: int) -> bool:
        """Whether a reservation of ``need`` bytes needs no region made: the newest has room,
        or one made ahead (make_room) is large enough. Read unlocked by make_room: a hint."""
        if self._next_offset + need <= self.regions[self._host_index].size:
            return True
        spare = self._spare
        return spare is not None and spare.size >= self._region_size(need)

    def make_room(self, need: int) -> bool:
        """Make, without the lock, the region a later reservation of ``need`` bytes under it
        will take, where the newest host region has no room for them: a ring's move calls it
        on a thread of its own (:meth:`ready_to_move`), a registration through
        :meth:`room_for`. Creating a region takes long (its pages allocated and faulted in:
        0.1-0.3 s for 64-256 MiB on the development VM), and under the lock every other
        tensor's claims, waits and releases waited for it (``bench.registration
        --large-mib``). What it reads unlocked is a hint: the reservation takes the region only
        if it still needs one and it is large enough, and makes its own where this failed (a
        full ``/dev/shm`` says so there). False where it failed."""
        return self._make_spare(need) is not None

    def _make_spare(self, need: int) -> Region | bool | None:
        """make_room's work: the region it made (kept as the spare, closed by the control
        thread's tick if no reservation takes it within :data:`SPARE_KEPT`), True where none
        was needed, None where making it failed."""
        if self._state.closed or self._room_at_hand(need):
            return True
        try:
            made = Region.create(self._region_size(need), shared=self.shared)
        except (OSError, MemoryError, TensorWireError):
            return None
        with self._spare_lock:
            unused, self._spare = _larger(made, self._spare)
            self._spare_made = time.monotonic()
        if unused is not None:
            unused.close()
        if self._state.closed:  # (closed meanwhile: close() may have passed the spare by)
            self._drop_spare()
        return made

    @contextlib.contextmanager
    def room_for(self, need: int) -> Iterator[None]:
        """:meth:`make_room` around a registration's reservation (made within, under the
        lock): a region made for it that it did not take is closed after it. A registration
        refused under the lock (a name already registered) left its region, of the size it
        asked for, in ``/dev/shm`` until the next region or the receiver's close."""
        made = self._make_spare(need)
        try:
            yield
        finally:
            if isinstance(made, Region):
                self._drop_spare(made)

    def _take_spare(self, size: int) -> Region | None:
        """The region make_room made, if it has ``size`` bytes."""
        with self._spare_lock:
            spare = self._spare
            if spare is None or spare.size < size:
                return None
            self._spare = None
            return spare

    def _drop_spare(self, only: Region | None = None) -> None:
        """Close the spare region (``only``: if it is still that one)."""
        with self._spare_lock:
            spare = self._spare
            if spare is None or (only is not None and spare is not only):
                return
            self._spare = None
        spare.close()

    def drop_unused_spare(self) -> None:
        """Close a region made ahead and left unused for over :data:`SPARE_KEPT` seconds (the
        control thread's tick)."""
        with self._spare_lock:
            spare = self._spare
            if spare is None or time.monotonic() - self._spare_made < SPARE_KEPT:
                return
            self._spare = None
        spare.close()

    def _new_region(self, size: int) -> Region:
        region = self._take_spare(size) or Region.create(size, shared=self.shared)
        q = region.words64
        q[OFF_GENERATION // 8] = self._state.generation
        region.words32[OFF_STATE // 4] = REGION_OPEN
        q[OFF_MAGIC // 8] = REGION_MAGIC
        self._publish(region)
        self._host_index = len(self.regions) - 1
        self._next_offset = REGION_HEADER_SIZE
        return region

    def _publish(self, memory: Memory) -> None:
        self.regions.append(memory)
        try:
            self._on_new_memory(memory)
        except BaseException:
            self.regions.pop()
            memory.close()
            raise

    def _reserve(self, need: int) -> tuple[Region, int]:
        """``need`` bytes in the newest host region (or a new one): the region and the offset."""
        region: Region = self.regions[self._host_index]
        if self._next_offset + need > region.size:
            region = self._new_region(self._region_size(need))
        return region, self._next_offset

    def _reserve_device(self, device: int, need: int) -> tuple[int, int]:
        """``need`` bytes of GPU memory on ``device``: the span's index and the offset."""
        from ..cuda import DeviceMemory  # only GPU tensors import cupy

        index, offset = self._device_cursor.get(device, (-1, 0))
        if index < 0 or align(offset, PAGE) + need > self.regions[index].size:
            self._publish(DeviceMemory(max(self._region_bytes, align(need, PAGE)), device))
            index, offset = len(self.regions) - 1, 0
        return index, align(offset, PAGE)

    def _host_ring(self, spec: TensorSpec, depth: int) -> RingLayout:
        """Room for a ring of ``depth`` slots of ``spec`` in the newest host region (a new one
        where it does not fit): its layout, the region's index in it."""
        _, base = self._reserve(ring_footprint(depth, spec.max_bytes, spec.ndim, spec.dynamic))
        layout = plan_ring(base, depth, spec.max_bytes, spec.ndim, spec.dynamic)
        self._next_offset = max(self._next_offset, align(layout.end, PAGE))
        return dataclasses.replace(layout, region=self._host_index)

    def movable(self, tensor: RegisteredTensor) -> bool:
        """Whether :meth:`move` can move ``tensor``: a host tensor of its own (a part's payload
        lies within its whole's view; a GPU ring's payloads are in device memory, not moved)."""
        return tensor.ring.device is None and not tensor.in_group

    def move(self, tensor: RegisteredTensor) -> None:
        """Move ``tensor``'s ring to memory that no writer of it has reached, its messages and
        words with it: a dropped ``nixl`` writer may still post a WRITE into the ring it knew
        (one stalled between reading its notifications and posting), and nothing here can stop
        it (UCX's cross-memory attach writes by pid, and over TCP UCX does not check a
        deregistration, ``bench.nixl_fence``); the next writer is told where the ring is now
        in its claim's answer. The old ring's memory is kept, and used again only once
        RETIRED_RINGS later moves have been made and the consumer released what it held of
        it. Under the lock, with no payload arriving (the claim's fence checked it)."""
        old = tensor.ring
        retired = tensor.retired
        if len(retired) >= RETIRED_RINGS and retired[0][1] <= tensor.released:
            layout = retired.pop(0)[0]
        else:
            try:
                layout = self._host_ring(tensor.spec, old.depth)
            except (OSError, MemoryError, TensorWireError):
                # no memory for a fresh ring (a full /dev/shm): the oldest ring it left whose
                # messages the consumer released serves, if there is one
                free = [k for k, (_, taken) in enumerate(retired) if taken <= tensor.released]
                if not free:
                    raise
                layout = retired.pop(free[0])[0]
        ring = RingMemory(tensor.spec, layout, self.regions[layout.region], self.bell)
        ring.take_over(old, tensor.released)
        retired.append((old.layout, tensor.consumed))
        old.forget_views()  # (held views of it keep its bytes readable: the region stays)
        tensor.ring = ring
        if tensor.views is not None:
            tensor.views = [None] * ring.depth
        tensor.view_block = None if ring.static_block is None else received(ring.static_block)
        self._order_version += 1  # wait_any indexes the rings' words per order: anew

    def _add(
        self, spec: TensorSpec, layout: RingLayout, payload_region: int | None = None
    ) -> RegisteredTensor:
        """Publish a tensor whose ring ``layout`` lies in the newest host region (its payloads
        in GPU span ``payload_region`` when given)."""
        region = self.regions[self._host_index]
        payload = None
        if payload_region is None:
            layout = dataclasses.replace(layout, region=self._host_index)
            self._next_offset = max(self._next_offset, align(layout.end, PAGE))
        else:
            layout = dataclasses.replace(
                layout, region=self._host_index, payload_region=payload_region
            )
            self._next_offset = max(self._next_offset, align(layout.headers[-1] + 1, PAGE))
            payload = self.regions[payload_region]
            self._device_cursor[payload.device] = (payload_region, layout.end)
        ring_mem = RingMemory(spec, layout, region, self.bell, payload)
        ring_mem.reset_slots()
        views = None if ring_mem.static_views is None else [None] * ring_mem.depth
        tensor = RegisteredTensor(len(self.by_id) + 1, spec, ring_mem, views)
        if ring_mem.static_block is not None:
            tensor.view_block = received(ring_mem.static_block)
        self.by_name[spec.name] = tensor
        self.by_id[tensor.tensor_id] = tensor
        self._order.append(tensor)
        self._order_version += 1  # after the append: a reader of this version sees the tensor
        return tensor

    @property
    def order(self) -> tuple[RegisteredTensor, ...]:
        """Every tensor in registration order: a snapshot that registrations do not change.
        Safe without the lock: a snapshot is kept with the version read before it was copied,
        so one that missed a registration made meanwhile is copied again at the next read."""
        version = self._order_version
        kept, snapshot = self._order_snapshot
        if kept != version:
            snapshot = tuple(self._order)
            self._order_snapshot = (version, snapshot)
        return snapshot

    # -- registration --------------------------------------------------------------------------

    def _check_new(self, name: str) -> None:
        self._state.check_open()
        if name in self.by_name or name in self._groups:
            raise SpecMismatchError(f"tensor {name!r} is already registered")

    def _footprint(self, spec: TensorSpec, depth: int, device: int | None) -> int:
        """The host bytes a ring of ``depth`` slots of ``spec`` takes (on a GPU tensor, its
        control words only), page-aligned as the rings are laid out one after another."""
        if device is None:
            return align(ring_footprint(depth, spec.max_bytes, spec.ndim, spec.dynamic), PAGE)
        return align(control_footprint(depth, spec.ndim, spec.dynamic), PAGE)

    def ready_to_move(self, tensor: RegisteredTensor) -> bool:
        """Under the lock, at a claim that moves ``tensor`` (:meth:`move`): whether the memory
        of its new ring is at hand (a ring it left, room in the newest region, or a region
        made ahead). If not, the region is made on a thread of its own, and False until it
        is: the claim is fenced (the claimant retries) meanwhile. Made here, the allocation
        held the lock, and the control thread with it: every other sender's requests, and the
        consumer's waits and releases, waited for it."""
        making = self._making
        if making is not None:
            if making.is_alive():
                return False
            self._making = None
            if not self._made:
                return True  # (no memory: the move tries all the same, and says what failed)
        retired = tensor.retired
        if len(retired) >= RETIRED_RINGS and retired[0][1] <= tensor.released:
            return True  # (it moves back into the oldest ring it left)
        need = self._footprint(tensor.spec, tensor.ring.depth, None)
        if self._room_at_hand(need):
            return True

        def make() -> None:
            self._made = self.make_room(need)

        self._making = threading.Thread(target=make, name="tensorwire-make-room", daemon=True)
        self._making.start()
        return False

    def register(self, spec: TensorSpec, ring: int | None, device: int | None = None) -> None:
        if ring is None:
            ring = self._ring_depth
        depth = (
            auto_depth(spec.max_bytes) if ring is None else check_count("ring", ring, 1, MAX_DEPTH)
        )
        with self.room_for(self._footprint(spec, depth, device)), self._state.lock:
            self._check_new(spec.name)
            if device is None:
                self._add(spec, self._host_ring(spec, depth))
                return
            index, offset = self._reserve_device(device, payloads_footprint(depth, spec.max_bytes))
            _, base = self._reserve(control_footprint(depth, spec.ndim, spec.dynamic))
            layout = plan_ring(base, depth, spec.max_bytes, spec.ndim, spec.dynamic, offset)
            self._add(spec, layout, index)

    def register_many(self, specs: list[TensorSpec], device: int | None) -> list[TensorSpec]:
        """Register ``specs`` at the receiver's default depth, once all of their names are
        known to be new (none registered if one is not)."""
        depth = self._ring_depth  # (None: each its own, as register picks it)
        need = sum(self._footprint(s, depth or auto_depth(s.max_bytes), device) for s in specs)
        with self.room_for(need), self._state.lock:
            seen: set[str] = set()
            for spec in specs:
                if spec.name in seen:
                    raise SpecMismatchError(f"tensor {spec.name!r} is named twice")
                seen.add(spec.name)
                self._check_new(spec.name)
            host_index, next_offset = self._host_index, self._next_offset
            added: list[RegisteredTensor] = []
            try:
                for spec in specs:
                    self.register(spec, None, device)
                    added.append(self.by_name[spec.name])
            except BaseException:
                # Memory ran out part way (a full /dev/shm): none of the batch stays, so it may
                # be retried whole (before, its first items stayed registered, and the retry was
                # refused "already registered"). Under the lock, no sender has seen them.
                for tensor in added:
                    del self.by_name[tensor.spec.name]
                    del self.by_id[tensor.tensor_id]
                    self._order.remove(tensor)
                self._order_version += 1
                if self._host_index == host_index:  # their bytes are free again
                    self._next_offset = next_offset
                raise
        return specs

    def register_parts(
        self, name: str, shape: Any, dtype: Any, rows: list[int], device: int | None = None
    ) -> list[TensorSpec]:
        whole = TensorSpec.create(name, shape, dtype)
        dims = whole.static_shape
        # A scalar (a model's temperature, a learned scale) is one part of one "row": the
        # parameter server's plan counts it so. Before, it could not be registered in parts,
        # and a PSClient of a model with one failed to join.
        first = dims[0] if dims else 1
        if sum(rows) != first or any(r < 0 for r in rows) or not rows or (not dims and rows != [1]):
            raise SpecMismatchError(
                f"tensor {name!r}: parts of {rows} rows do not add up to the first dimension of "
                f"{whole.describe()}" + ("" if dims else " (a scalar is one part of one row: [1])")
            )
        row_bytes = whole.max_bytes // first if first else 0
        parts = [
            TensorSpec.create(f"{name}@{k}", (r, *dims[1:]) if dims else (), dtype)
            for k, r in enumerate(rows)
        ]
        capacities = [r * row_bytes for r in rows]
        if device is None:  # the host bytes: every part's control words and payload, or words
            need = plan_parts(0, capacities, len(dims))[-1].end
        else:
            need = control_footprint(1, len(dims), False) * len(rows)
        with self.room_for(need), self._state.lock:
            self._check_new(name)
            for part in parts:
                self._check_new(part.name)
            index = None
            if device is None:
                region, base = self._reserve(need)
                layouts = plan_parts(base, capacities, len(dims))
            else:
                index, offset = self._reserve_device(device, whole.max_bytes)
                region, base = self._reserve(need)
                layouts = plan_parts(base, capacities, len(dims), offset)
            for part, layout in zip(parts, layouts, strict=True):
                self._add(part, layout, index).in_group = True
            start = layouts[0].payloads[0]
            if index is None:
                whole_bytes = region.array[start : start + whole.max_bytes]
                self._groups[name] = received(whole_bytes.view(whole.dtype).reshape(dims))
            else:
                self._groups[name] = self.regions[index].view(start, whole.dtype, dims)
        return parts

    # -- lookup ------------------------------------------------------------------------------

    def group(self, name: str) -> Any:
        self._state.check_open()
        try:
            return self._groups[name]
        except KeyError:
            raise UnknownTensorError(f"no tensor {name!r} was registered in parts") from None

    def get(self, name: str) -> RegisteredTensor:
        self._state.check_open()
        try:
            return self.by_name[name]
        except KeyError:
            raise UnknownTensorError(
                f"no tensor {shown_name(name)} is registered on {self._state.name}; "
                f"registered: {names_listed(name, self.by_name)}"
            ) from None

    def specs(self) -> dict[str, TensorSpec]:
        with self._state.lock:
            return {name: t.spec for name, t in self.by_name.items()}

    def address_book_regions(self) -> list[list[Any]]:
        """Each span as the address book publishes it (:class:`~tensorwire.memory.RegionInfo`)."""
        out = []
        for r in self.regions:
            if isinstance(r, Region):
                out.append(RegionInfo(r.name, r.size).to_wire())
            else:
                info = RegionInfo(None, r.size, r.kind, r.device, r.ipc_handle(), r.address)
                out.append(info.to_wire())
        return out

    # -- the doorbell --------------------------------------------------------------------------

    def wake(self) -> None:
        """Ring the doorbell every consumer waits on (a loss, a close)."""
        bell = self.bell
        if not bell.closed:
            ring_bell(
                bell.words32,
                OFF_DOORBELL // 4,
                bell.address + OFF_DOORBELL,
                bell.words32,
                OFF_RX_WAITING // 4,
            )

    def mark_closed(self) -> None:
        """Tell every writer mapping our memory that the receiver closed, and wake consumers."""
        self.bell.words32[OFF_STATE // 4] = REGION_CLOSED
        self.wake()

    # -- teardown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Drop every view and unmap every region (after the data servers stopped using them)."""
        with self._state.lock:
            self._groups.clear()
            for tensor in self.order:
                if tensor.stale_writer is not None:
                    tensor.stale_writer.close()
                    tensor.stale_writer = None
                tensor.views = tensor.view_block = None
                tensor.staging = None
                tensor.ring.forget_views()
            self._order.clear()
            self._order_version += 1
            self.by_name.clear()
            self.by_id.clear()
            for region in self.regions:
                region.close()
            making = self._making
        if making is not None:
            making.join()  # (an allocation's time at most; its region is dropped as closed)
        self._drop_spare()


def _larger(a: Region, b: Region | None) -> tuple[Region | None, Region]:
    """Of two spare regions, (the one to close, the one to keep): the larger is kept."""
    if b is None:
        return None, a
    return (b, a) if a.size > b.size else (a, b)
