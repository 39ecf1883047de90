"""The receiver's registry of tensors and the memory they live in.

Registering a tensor reserves its ring (slot headers, payloads, credit words) in the receiver's
regions: page-aligned slabs of registered memory (:class:`~tensorwire.memory.Memory`), allocated
a few megabytes at a time so that many small tensors share few registrations. Each new span is
handed to ``on_new_memory`` (the data servers register it with their libraries). The first region
also holds the doorbell every consumer waits on and every writer rings.

The registry knows each tensor's spec, ring, read-only views and claim state; the other parts of
the receiver look tensors up here, by name (the consumer API) or by id (claims and writes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..doorbell import ring_bell
from ..errors import SpecMismatchError, UnknownTensorError
from ..layout import (
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
    plan_parts,
    plan_ring,
    ring_footprint,
)
from ..memory import Memory
from ..process import ProcessWatch
from ..received import ReceivedArray, received
from ..region import Region
from ..ring import RingMemory
from ..spec import TensorSpec
from .state import ReceiverState

if TYPE_CHECKING:
    from .sessions import Session


@dataclass(eq=False)
class RegisteredTensor:
    """Receiver-side state of one registered tensor."""

    tensor_id: int
    spec: TensorSpec
    ring: RingMemory
    views: list[ReceivedArray] | None
    consumed: int = 0  # messages handed out by wait()
    released: int = 0  # messages handed back by release()
    owner: Session | None = None
    transport: str = ""
    #: the writer stores into our memory and completes slots itself (shm), rather than one of
    #: our own threads doing it for the data it receives
    sender_completes: bool = False
    expected_seq: int = 1  # next sequence number a networked writer must send
    lost: str | None = None  # set when the owner died: the next wait() reports it
    epoch: int = 0  # claims granted so far; the ring's owner word holds the current one
    #: a shared-memory writer that was dropped while its process lived: it may be inside a write
    stale_writer: ProcessWatch | None = None
    #: the session whose payload is landing right now through one of our own threads
    inflight: Session | None = None

    @property
    def slot_free(self) -> bool:
        """May the consumer take another message (it holds fewer than the ring's depth)?"""
        return self.consumed - self.released < self.ring.depth

    def wire_entry(self) -> list[Any]:
        return [self.tensor_id, self.spec.to_wire(), self.ring.layout.to_wire()]


class TensorTable:
    """Every tensor of one receiver, and the regions they live in. Mutated under the state's
    lock."""

    def __init__(
        self,
        state: ReceiverState,
        *,
        ring_depth: int,
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
        self.regions: list[Region] = []
        self._next_offset = 0
        self.by_name: dict[str, RegisteredTensor] = {}
        self.by_id: dict[int, RegisteredTensor] = {}
        #: registration order, which wait_any() serves round-robin
        self.order: tuple[RegisteredTensor, ...] = ()
        self._groups: dict[str, ReceivedArray] = {}  # register_parts: name -> whole view
        self.bell = self._new_region(self._region_bytes)

    # -- memory ------------------------------------------------------------------------------

    def _new_region(self, size: int) -> Region:
        region = Region.create(size, shared=self.shared)
        q = region.words64
        q[OFF_GENERATION // 8] = self._state.generation
        region.words32[OFF_STATE // 4] = REGION_OPEN
        q[OFF_MAGIC // 8] = REGION_MAGIC
        self.regions.append(region)
        self._next_offset = REGION_HEADER_SIZE
        self._on_new_memory(region)
        return region

    def _reserve(self, need: int) -> tuple[Region, int]:
        """``need`` bytes in the last region (or a new one): the region and the base offset."""
        region = self.regions[-1]
        if self._next_offset + need > region.size:
            region = self._new_region(
                max(self._region_bytes, REGION_HEADER_SIZE + align(need, PAGE))
            )
        return region, self._next_offset

    def _add(self, spec: TensorSpec, region: Region, layout: RingLayout) -> RegisteredTensor:
        layout = dataclasses.replace(layout, region=len(self.regions) - 1)
        self._next_offset = max(self._next_offset, align(layout.end, PAGE))
        ring_mem = RingMemory(spec, layout, region, self.bell)
        ring_mem.reset_slots()
        views = None
        if ring_mem.static_views is not None:
            views = [received(v) for v in ring_mem.static_views]
        tensor = RegisteredTensor(len(self.by_id) + 1, spec, ring_mem, views)
        self.by_name[spec.name] = tensor
        self.by_id[tensor.tensor_id] = tensor
        self.order = (*self.order, tensor)
        return tensor

    # -- registration --------------------------------------------------------------------------

    def _check_new(self, name: str) -> None:
        self._state.check_open()
        if name in self.by_name or name in self._groups:
            raise SpecMismatchError(f"tensor {name!r} is already registered")

    def register(self, spec: TensorSpec, ring: int | None) -> None:
        depth = self._ring_depth if ring is None else int(ring)
        if depth < 1:
            raise ValueError(f"ring must be at least 1, got {ring}")
        with self._state.lock:
            self._check_new(spec.name)
            need = ring_footprint(depth, spec.max_bytes, spec.ndim, spec.dynamic)
            region, base = self._reserve(need)
            self._add(spec, region, plan_ring(base, depth, spec.max_bytes, spec.ndim, spec.dynamic))

    def register_parts(
        self, name: str, shape: Any, dtype: Any, rows: list[int]
    ) -> list[TensorSpec]:
        whole = TensorSpec.create(name, shape, dtype)
        dims = whole.static_shape
        if not dims or sum(rows) != dims[0] or any(r < 0 for r in rows) or not rows:
            raise SpecMismatchError(
                f"tensor {name!r}: parts of {rows} rows do not add up to the first dimension of "
                f"{whole.describe()}"
            )
        row_bytes = whole.max_bytes // dims[0] if dims[0] else 0
        parts = [
            TensorSpec.create(f"{name}@{k}", (r, *dims[1:]), dtype) for k, r in enumerate(rows)
        ]
        with self._state.lock:
            self._check_new(name)
            for part in parts:
                self._check_new(part.name)
            layouts = plan_parts(0, [r * row_bytes for r in rows], len(dims))
            region, base = self._reserve(layouts[-1].end)
            for part, layout in zip(
                parts, plan_parts(base, [p.max_bytes for p in parts], len(dims)), strict=True
            ):
                self._add(part, region, layout)
            start = self.by_name[parts[0].name].ring.layout.payloads[0]
            full = region.array[start : start + whole.max_bytes].view(whole.dtype).reshape(dims)
            self._groups[name] = received(full)
        return parts

    # -- lookup ------------------------------------------------------------------------------

    def group(self, name: str) -> ReceivedArray:
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
                f"no tensor {name!r} is registered on {self._state.name}; registered: "
                f"{', '.join(sorted(self.by_name)) or 'none'}"
            ) from None

    def specs(self) -> dict[str, TensorSpec]:
        with self._state.lock:
            return {name: t.spec for name, t in self.by_name.items()}

    def address_book_regions(self) -> list[list[Any]]:
        """Each region as the address book publishes it: its shared name ("" if private), size."""
        return [[r.name if r.name is not None else "", r.size] for r in self.regions]

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
                tensor.views = None
                tensor.ring.static_views = None
                tensor.ring.payload_bytes = []
            self.order = ()
            self.by_name.clear()
            self.by_id.clear()
            for region in self.regions:
                region.close()
