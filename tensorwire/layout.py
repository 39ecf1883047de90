"""Memory layout: where every word and payload lives inside a registered region.

A region is one large slab of registered memory. It starts with a page-sized header (magic,
state, generation, the receiver's doorbell), followed by the rings of many tensors. A ring is one
tensor's double (or deeper) buffer::

    ring control block (128 B)  released counter | credit doorbell ... | sender-waiting flag
    slot headers (depth x H)    seq | nbytes | ndim | dims (dynamic only)
    payloads (depth x capacity) each aligned to 64 B, or to a page from 4 KiB up

A GPU tensor's payloads live in a span of GPU memory instead (the layout's ``payload_region``);
its control block and slot headers stay in host memory, where the words are stored and waited on.
Each hot word sits on its own cache line so that the sender's and the receiver's stores do not
false-share. The offsets here are the "remote address" published to senders; both ends compute
nothing else about the layout.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import LocalProtocolError

CACHE_LINE = 64
PAGE = 4096

# Region header (offsets in bytes from the region start).
REGION_HEADER_SIZE = PAGE
REGION_MAGIC = 0x54574952_45474E31  # "TWIREGN1"
OFF_MAGIC = 0  # u64
OFF_STATE = 8  # u32: REGION_OPEN or REGION_CLOSED
OFF_GENERATION = 16  # u64
OFF_DOORBELL = 64  # u32 futex word, bumped by every writer after a slot completes
OFF_RX_WAITING = 128  # u32, non-zero while the receiver is (about to be) blocked on the doorbell
OFF_SCRATCH = 256  # 64 bytes nobody reads: remote writers warm their connection up here
SCRATCH_SIZE = CACHE_LINE
REGION_OPEN = 1
REGION_CLOSED = 2

#: What a ring of automatic depth holds at least: enough messages in flight that the credits
#: coming back cover the time they take (the bandwidth-delay product: on this project's 2-core
#: VM a 4 KiB tcp round trip takes 40-150 us and a raw socket moves 2.5-5 GB/s at 64 KiB and
#: up, 0.1-0.75 MB in flight), so small tensors stream instead of waiting for each credit.
CREDIT_WINDOW = 1 << 20
MIN_AUTO_DEPTH, MAX_AUTO_DEPTH = 2, 32
#: The deepest ring a caller may ask for: a registration sets up each slot's words one by one
#: (a million slots took 15 s, a billion never ended), and a consumer that needs more messages
#: in flight than this is better served by several tensors
MAX_DEPTH = 1 << 16


def auto_depth(max_bytes: int) -> int:
    """Slots for a tensor of ``max_bytes`` when the user chose no depth: 32 up to 32 KiB, 16 at
    64 KiB, 8 at 128 KiB, 4 at 256 KiB, 2 (double buffering) from 512 KiB; at most 1 MiB of
    slots per tensor. Measured in pairs within one run (``python -m tensorwire.bench.depths``:
    tensors of each depth streamed in turn between the same two processes, BENCHMARKS.md): tcp
    streams 1.32x and 1.37x faster at 4 and 16 KiB with 32 slots than with 8, 1.07x at 64 KiB
    with 16 (32 slots, 2 MiB, were 0.77x), 1.14x at 128 KiB with 8 against 4, 1.17x at 256 KiB
    with 4 against 2; shm and nixl unchanged within the machine's noise (a shm writer reuses
    the slot it wrote last whenever the consumer keeps up, so a deeper ring is mostly memory
    nobody touches)."""
    return max(MIN_AUTO_DEPTH, min(MAX_AUTO_DEPTH, -(-CREDIT_WINDOW // max(max_bytes, 1))))


# Ring control block (offsets from the ring start).
RING_CTRL_SIZE = 2 * CACHE_LINE
OFF_RELEASED = 0  # u64: how many messages the receiver has released (credits returned)
OFF_CREDIT_BELL = 8  # u32 futex word, bumped by the receiver on every release
OFF_TX_WAITING = CACHE_LINE  # u32, non-zero while the sender is (about to be) blocked for credit
# Fencing a writer the receiver dropped (see RingMemory.enter_write). The receiver stores the
# epoch of the current claim in OWNER (0: nobody may write); a shared-memory writer stores its own
# epoch in WRITING for as long as it is inside a write. Each word sits on its writer's cache line.
OFF_OWNER = 16  # u64, written by the receiver
OFF_WRITING = CACHE_LINE + 8  # u64, written by the writer
#: u64, written by the writer: non-zero once the GPU completes its messages (the sequence-number
#: store is a stream memory operation, tensorwire.cuda_stores), which rings no doorbell; then the
#: sequence number of the last message whose store the writer has queued. The writer rings the
#: doorbell as it queues a store, and a receiver that finds a store queued for a message it waits
#: for yields the CPU until it lands instead of sleeping (consumer.Consumer._block).
OFF_DEVICE_STORES = CACHE_LINE + 16

# Slot header (offsets from the slot header start).
OFF_SEQ = 0  # u64: sequence number of the message in the slot, written after the payload
OFF_NBYTES = 8  # u64: payload byte count (dynamic tensors)
OFF_NDIM = 16  # u32
OFF_DIMS = CACHE_LINE  # i64 x ndim (dynamic tensors only)


def align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def slot_header_size(ndim: int, dynamic: bool) -> int:
    return CACHE_LINE + (align(8 * ndim, CACHE_LINE) if dynamic else 0)


def payload_alignment(capacity: int) -> int:
    return PAGE if capacity >= PAGE else CACHE_LINE


@dataclass(frozen=True, slots=True)
class RingLayout:
    """Where one tensor's ring lives: region index and byte offsets inside that region."""

    region: int
    ctrl: int
    #: a ``range`` where evenly spaced (as plan_ring lays them out; see as_offsets)
    headers: Offsets
    payloads: tuple[int, ...]
    capacity: int
    #: the region the payloads are in, when not ``region`` (a GPU tensor's: -1 means ``region``)
    payload_region: int = -1

    def __post_init__(self) -> None:
        # one form for the same offsets however given, so that layouts compare equal
        object.__setattr__(self, "headers", as_offsets(self.headers))

    @property
    def payloads_in(self) -> int:
        """Index of the region holding the payloads."""
        return self.region if self.payload_region < 0 else self.payload_region

    @property
    def depth(self) -> int:
        return len(self.payloads)

    @property
    def end(self) -> int:
        return self.payloads[-1] + self.capacity

    def to_wire(self, compact: bool = False) -> list[Any]:
        """The layout as the address book carries it: every slot's offsets, or, ``compact``
        (for a sender that asked for it), the headers and payloads as two progressions, which
        is how :func:`plan_ring` lays every ring out: ``[region, ctrl, depth, first header,
        header stride, first payload, payload stride, capacity, payload region]``. A book of
        50,000 small tensors (32 slots each) was 18.9 MB in full, past what a control message
        may be (control.MAX_CONTROL_MESSAGE), and the sender's lookup went unanswered."""
        if compact:
            steps = progression(self.headers), progression(self.payloads)
            if steps[0] is not None and steps[1] is not None:
                return [
                    self.region,
                    self.ctrl,
                    self.depth,
                    self.headers[0],
                    steps[0],
                    self.payloads[0],
                    steps[1],
                    self.capacity,
                    self.payload_region,
                ]
        out = [self.region, self.ctrl, list(self.headers), list(self.payloads), self.capacity]
        if self.payload_region >= 0:
            out.append(self.payload_region)
        return out

    @classmethod
    def from_wire(cls, value: Any, region_sizes: list[int]) -> RingLayout:
        """Decode and bounds-check a layout received from a peer."""
        try:
            if len(value) == COMPACT_FIELDS and not isinstance(value[2], list):
                region, ctrl, depth, h0, hstep, p0, pstep, capacity, payload_region = map(
                    int, value
                )
                # bounded before it is expanded; slots in ascending order, as laid out
                if not 1 <= depth <= MAX_DEPTH or (depth > 1 and min(hstep, pstep) <= 0):
                    raise ValueError(f"depth {depth}, steps {hstep} and {pstep}")
                headers = range(h0, h0 + depth * hstep, hstep) if depth > 1 else [h0]
                payloads = range(p0, p0 + depth * pstep, pstep) if depth > 1 else [p0]
                rest = [payload_region] if payload_region >= 0 else []
            else:
                region, ctrl, headers, payloads, capacity, *rest = value
            if len(rest) > 1:
                raise ValueError("too many fields")
            layout = cls(
                region=int(region),
                ctrl=int(ctrl),
                headers=as_offsets(headers),
                payloads=tuple(map(int, payloads)),
                capacity=int(capacity),
                payload_region=int(rest[0]) if rest else -1,
            )
        except (TypeError, ValueError) as exc:
            raise LocalProtocolError(f"malformed ring layout: {value!r}") from exc
        for index in (layout.region, layout.payloads_in):
            if not 0 <= index < len(region_sizes):
                raise LocalProtocolError(f"ring layout names unknown region {index}")
        size = region_sizes[layout.region]
        payload_size = region_sizes[layout.payloads_in]
        # Payloads in the control region must keep clear of its header; another region (GPU
        # memory) holds payloads only.
        payload_floor = REGION_HEADER_SIZE if layout.payloads_in == layout.region else 0
        # (by each list's extremes, not slot by slot: a sender's first claims of many tensors
        # spent a fifth of their time here, three passes over every slot of every ring)
        if layout.depth == 0 or len(layout.headers) != layout.depth:
            raise LocalProtocolError(
                f"ring layout with {len(layout.headers)} slot headers for {layout.depth} payloads"
            )
        first_header, last_header = _extremes(layout.headers)
        first_payload, last_payload = _extremes(layout.payloads)
        if (
            layout.capacity < 0
            or min(layout.ctrl, first_header) < REGION_HEADER_SIZE
            or max(layout.ctrl + RING_CTRL_SIZE, last_header + CACHE_LINE) > size
            or first_payload < payload_floor
            or last_payload + layout.capacity > payload_size
            or layout.ctrl % 8
            or not _aligned(layout.headers, 8)
        ):
            raise LocalProtocolError(f"ring layout out of bounds for a {size}-byte region")
        return layout


#: fields of a compact layout (RingLayout.to_wire)
COMPACT_FIELDS = 9


#: slots' offsets: a range where they are evenly spaced, else a tuple
Offsets = range | tuple[int, ...]


def _extremes(offsets: Offsets) -> tuple[int, int]:
    """The lowest and the highest of ``offsets`` (not empty)."""
    if isinstance(offsets, range) and offsets.step > 0:
        return offsets[0], offsets[-1]
    return min(offsets), max(offsets)


def _aligned(offsets: Offsets, to: int) -> bool:
    """Whether every one of ``offsets`` is a multiple of ``to``."""
    if isinstance(offsets, range):
        return offsets.start % to == 0 and (len(offsets) == 1 or offsets.step % to == 0)
    return not any(off % to for off in offsets)


def as_offsets(values: Iterable[Any]) -> Offsets:
    """``values`` as ints: a ``range`` where they are evenly spaced and ascending (48 bytes
    however deep the ring, where a tuple of 32 offsets takes 1.3 KiB with its ints, at the
    receiver and at every sender that has the layout), else a tuple. Not for the offsets the
    per-message paths index (the payloads): a range's item costs 75 ns, a tuple's 12."""
    if isinstance(values, range) and values.step > 0:
        return values
    offsets = tuple(int(v) for v in values)
    step = progression(offsets) if offsets else None
    if step is None:
        return offsets
    step = step or 1
    return range(offsets[0], offsets[0] + len(offsets) * step, step)


def progression(offsets: Offsets) -> int | None:
    """The common step of ``offsets`` (0 for one), or None where they are not evenly spaced."""
    if len(offsets) == 1:
        return 0
    if isinstance(offsets, range):
        return offsets.step if offsets.step > 0 else None
    step = offsets[1] - offsets[0]
    if step <= 0 or offsets != tuple(range(offsets[0], offsets[0] + len(offsets) * step, step)):
        return None
    return step


def plan_ring(
    base: int,
    depth: int,
    capacity: int,
    ndim: int,
    dynamic: bool,
    payload_base: int | None = None,
) -> RingLayout:
    """Lay out a ring of ``depth`` slots of ``capacity`` bytes starting at ``base``.

    With ``payload_base`` the payloads go to another region (GPU memory) from that offset on,
    and only the control block and slot headers take room at ``base``."""
    if depth < 1:
        raise ValueError(f"a ring needs at least one slot, got depth={depth}")
    hsize = slot_header_size(ndim, dynamic)
    headers = range(base + RING_CTRL_SIZE, base + RING_CTRL_SIZE + depth * hsize, hsize)
    first, stride = _payloads_from(base, depth, hsize, capacity, payload_base)
    payloads = tuple(range(first, first + depth * stride, stride))
    return RingLayout(region=-1, ctrl=base, headers=headers, payloads=payloads, capacity=capacity)


def _payloads_from(
    base: int, depth: int, hsize: int, capacity: int, payload_base: int | None
) -> tuple[int, int]:
    """Where a ring's first payload goes and the stride between its payloads."""
    palign = payload_alignment(capacity)
    stride = align(max(capacity, 1), palign)
    if payload_base is None:
        return align(base + RING_CTRL_SIZE + depth * hsize, palign), stride
    return align(payload_base, palign), stride


def ring_footprint(depth: int, capacity: int, ndim: int, dynamic: bool) -> int:
    """Bytes a ring takes when it starts on a page boundary: its plan's end, computed without
    laying every slot out (a registration asks three times a tensor, and making the plan's
    offsets each time was a third of registering 5,000 small tensors, under the profiler)."""
    if depth < 1:
        raise ValueError(f"a ring needs at least one slot, got depth={depth}")
    first, stride = _payloads_from(0, depth, slot_header_size(ndim, dynamic), capacity, None)
    return first + (depth - 1) * stride + capacity


def control_footprint(depth: int, ndim: int, dynamic: bool) -> int:
    """Bytes a ring's control block and slot headers take (a GPU tensor's host part)."""
    return RING_CTRL_SIZE + depth * slot_header_size(ndim, dynamic)


def payloads_footprint(depth: int, capacity: int) -> int:
    """Bytes a ring's payloads take in a region of their own, from an aligned offset."""
    return depth * align(max(capacity, 1), payload_alignment(capacity))


def plan_parts(
    base: int, capacities: list[int], ndim: int, payload_base: int | None = None
) -> list[RingLayout]:
    """Lay out one-slot rings whose payloads follow each other with no gap.

    The parts of one tensor split along its first axis then form a single contiguous array, so a
    receiver can hand out the whole tensor as one view while each part is written (by different
    senders) as a tensor of its own. ``payload_base``: the payloads go to another region (GPU
    memory) from that offset on.
    """
    hsize = slot_header_size(ndim, False)
    per_part = RING_CTRL_SIZE + hsize
    if payload_base is None:
        start = align(base + len(capacities) * per_part, PAGE)
    else:
        start = align(payload_base, PAGE)
    out = []
    offset = start
    for k, capacity in enumerate(capacities):
        ctrl = base + k * per_part
        out.append(RingLayout(-1, ctrl, (ctrl + RING_CTRL_SIZE,), (offset,), capacity))
        offset += capacity
    return out
