"""One tensor's ring of slots in a region, seen from either end.

The same class serves the receiver (which waits for slots to complete and releases them) and every
writer (the shared-memory sender in another process, or the receiver's own network threads), so
the completion protocol is written once:

* the writer may start message ``n`` (1-based) only when ``n - released <= depth`` (credits);
* it writes into a *free* slot, one whose message has been released, choosing the one it wrote
  most recently when it is free (a :class:`SlotChooser`): when the consumer keeps up, every
  message goes into the same slot, which is still in the writer's cache, instead of alternating
  between two; otherwise the slot of the oldest message;
* the writer copies the payload, then the dynamic shape, then stores ``seq = n``; message ``n`` is
  complete exactly when some slot's ``seq`` equals ``n``. A writer that dies mid-copy never
  stores ``seq``, so a torn payload is never handed out.

A GPU tensor's payloads are in GPU memory (``payload``, a
:class:`~tensorwire.cuda.DeviceMemory` or the :class:`~tensorwire.cuda.OpenedMemory` a sender
reaches it by); its words stay in the host region, and ``seq`` is stored only once the copy has
landed: by the writer after synchronising it, or by the GPU itself behind it (a stream memory
operation, :mod:`tensorwire.cuda_stores`, which rings no doorbell: the ring's DEVICE_STORES word
says so to the receiver). So the protocol is the same.

Word stores are single aligned 8-byte stores, which x86-64 keeps in program order for other cores
(TSO). On weakly ordered CPUs the large copies release the GIL (a full barrier), but small ones may
not: this port is untested there.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from typing import Any

import numpy as np

from .doorbell import futex_wake, ring_bell, wait_for
from .layout import (
    OFF_CREDIT_BELL,
    OFF_DEVICE_STORES,
    OFF_DIMS,
    OFF_DOORBELL,
    OFF_NBYTES,
    OFF_NDIM,
    OFF_OWNER,
    OFF_RELEASED,
    OFF_RX_WAITING,
    OFF_SEQ,
    OFF_TX_WAITING,
    OFF_WRITING,
    RingLayout,
    control_footprint,
    progression,
)
from .region import Region
from .spec import TensorSpec

# A slot header's words, as distances from its sequence number's: in 64-bit words, but the
# ndim word's index among 32-bit words is twice the sequence number's index plus this
_NBYTES_AFTER_SEQ = (OFF_NBYTES - OFF_SEQ) // 8
_DIMS_AFTER_SEQ = (OFF_DIMS - OFF_SEQ) // 8
_NDIM32_AFTER_SEQ32 = (OFF_NDIM - OFF_SEQ) // 4


class RingMemory:
    """Word-level access to one ring, plus the receiver doorbell of the region it lives in."""

    # Slots, not an instance dict, for the ring's thirty-odd fields: the dict was 1.5 KiB of
    # each ring, at the receiver and at every sender of the tensor. ``__dict__`` stays for
    # what is made at first use (the cached addresses below), and only then takes room.
    __slots__ = (
        "__dict__",
        "_after",
        "_bell32",
        "_credit_bell",
        "_device_stores",
        "_found_seq",
        "_found_slot",
        "_i",
        "_owner",
        "_payload",
        "_payload_base",
        "_q",
        "_region_address",
        "_region_array",
        "_released",
        "_rows",
        "_rx_bell",
        "_rx_waiting",
        "_seq",
        "_tx_waiting",
        "_writing",
        "credit_bell_address",
        "depth",
        "device",
        "layout",
        "payload_bytes",
        "payload_offsets",
        "region_bytes",
        "rx_bell_address",
        "spec",
        "static_block",
        "static_views",
    )

    def __init__(
        self,
        spec: TensorSpec,
        layout: RingLayout,
        region: Region,
        bell_region: Region,
        payload: Any = None,
    ) -> None:
        self.spec = spec
        self.layout = layout
        self.depth = layout.depth
        self._q = region.words64
        self._i = region.words32
        # Each slot's sequence-number word; its header's other words are at fixed distances
        # from it (_NBYTES_AFTER_SEQ, ...), where each had a list of its own: four lists of 32
        # ints a small tensor were a third of a registered tensor's heap, at both ends
        self._seq = [(h + OFF_SEQ) // 8 for h in layout.headers]
        self._released = (layout.ctrl + OFF_RELEASED) // 8
        self._credit_bell = (layout.ctrl + OFF_CREDIT_BELL) // 4
        self.credit_bell_address = region.address + layout.ctrl + OFF_CREDIT_BELL
        self._tx_waiting = (layout.ctrl + OFF_TX_WAITING) // 4
        self._owner = (layout.ctrl + OFF_OWNER) // 8
        self._writing = (layout.ctrl + OFF_WRITING) // 8
        self._device_stores = (layout.ctrl + OFF_DEVICE_STORES) // 8
        self._region_address = region.address
        # find()'s guess: the last message found, and which slot followed each slot last time
        self._found_seq = 0
        self._found_slot = 0
        self._after = [0] * self.depth
        # The receiver's doorbell lives in its first region, shared by every ring.
        self._bell32 = bell_region.words32
        self._rx_bell = OFF_DOORBELL // 4
        self._rx_waiting = OFF_RX_WAITING // 4
        self.rx_bell_address = bell_region.address + OFF_DOORBELL
        #: the GPU the payloads are on (None: they are in ``region``, host memory)
        self.device: int | None = None if payload is None else int(payload.device)
        self._payload = payload
        self._payload_base = region.address if payload is None else int(payload.address)
        #: each slot's payload as host bytes (none for GPU payloads), made at its first use
        #: (payload_row): a ring made every view of its 32 slots at once, twice over for a
        #: static tensor, much of its cost and memory where thousands of small tensors are
        #: registered or claimed, and a sender writes few of a receiver's tensors
        self.payload_bytes: list[np.ndarray[Any, Any] | None] = []
        #: static tensors: each slot as an array of the spec's dtype and shape (numpy or cupy),
        #: a host slot's made at its first use (static_view); None for dynamic tensors
        self.static_views: list[Any] | None = None
        #: the same slots as one ``(depth, *shape)`` array, where they are made from one
        #: (host slots, evenly spaced, of a tensor that is not 0-d)
        self.static_block: np.ndarray[Any, Any] | None = None
        #: host payloads: their region as bytes, and each slot's offset there, for small copies
        #: (``region_bytes[p : p + n] = src``: a plain memcpy, less call overhead than numpy's;
        #: one memoryview per region, where one per slot, 32 for a small tensor, were objects
        #: the garbage collector went over again and again as thousands of tensors registered)
        self.region_bytes: memoryview | None = None if payload is not None else region.bytes
        self.payload_offsets = layout.payloads
        #: host slots as rows of one strided array, where the payloads are evenly spaced (as
        #: plan_ring lays them out): a slot's view is a row of it, not a slicing of the region
        #: (with region_bytes, 20,000 small tensors registered in 5.35 s, not 9.07:
        #: BENCHMARKS.md, "Many tensors")
        self._rows = self._host_rows(region) if payload is None else None
        self._region_array = region.array if payload is None and self._rows is None else None
        if payload is None:
            self.payload_bytes = [None] * self.depth
        if not spec.dynamic:
            shape = spec.static_shape
            if self._rows is not None and shape:
                nbytes = math.prod(shape) * spec.dtype.itemsize
                typed = self._rows[:, :nbytes].view(spec.dtype).reshape((self.depth, *shape))
                self.static_block = typed
            if payload is None:
                self.static_views = [None] * self.depth
            else:  # GPU slots: made at once, where their device is current
                self.static_views = [self._over(slot, shape) for slot in range(self.depth)]

    # The slots' addresses serve GPU copies and stores only: made at their first use, as the
    # views are (two lists of 32 ints a small tensor, 45 MB of 20,000 tensors' rings).

    @functools.cached_property
    def seq_addresses(self) -> list[int]:
        """Each slot's sequence-number word, as an address in this process (what the GPU
        stores into when it completes messages: tensorwire.cuda_stores)."""
        return [self._region_address + h + OFF_SEQ for h in self.layout.headers]

    @functools.cached_property
    def payload_addresses(self) -> list[int]:
        """Each slot's payload address, in this process."""
        return [self._payload_base + p for p in self.layout.payloads]

    def forget_views(self) -> None:
        """Drop every view of the ring's memory (its region is about to be unmapped: a view
        kept would hold the mapping's buffer exported)."""
        self.static_views = None
        self.static_block = None
        self.payload_bytes = []
        self.region_bytes = None
        self._rows = None
        self._region_array = None

    def payload_row(self, slot: int) -> np.ndarray[Any, Any]:
        """Host ``slot``'s payload as bytes (its whole capacity), made at its first use."""
        row = self.payload_bytes[slot]
        if row is None:
            if self._rows is not None:
                row = self._rows[slot]
            else:
                at = self.layout.payloads[slot]
                assert self._region_array is not None
                row = self._region_array[at : at + self.layout.capacity]
            self.payload_bytes[slot] = row
        return row

    def static_view(self, slot: int) -> Any:
        """A static tensor's ``slot`` as an array of its spec, made at its first use (the hot
        paths look in ``static_views`` first, inline)."""
        assert self.static_views is not None
        view = self.static_views[slot]
        if view is None:
            if self.static_block is not None:
                view = self.static_block[slot]
            else:  # (a 0-d tensor's row would come out as a numpy scalar, not a view)
                view = self._over(slot, self.spec.static_shape)
            self.static_views[slot] = view
        return view

    def _host_rows(self, region: Region) -> np.ndarray[Any, Any] | None:
        """The host payloads as a ``(depth, capacity)`` byte array over the region (row ``i``
        is slot ``i``), or None where they are not evenly spaced."""
        payloads, capacity = self.layout.payloads, self.layout.capacity
        step = progression(payloads)
        if step is None or (step and step < capacity):
            return None
        step = step or max(capacity, 1)
        arr = region.array
        first, depth = payloads[0], len(payloads)
        if first + depth * step <= arr.shape[0]:
            # a reshape and a slice, where the region reaches a whole step past the last slot:
            # 0.6 us, where as_strided's round trip through an array interface takes 4.7 (a
            # sender makes one for each tensor it claims, a receiver for each it registers)
            return arr[first : first + depth * step].reshape(depth, step)[:, :capacity]
        return np.lib.stride_tricks.as_strided(
            arr[first : payloads[-1] + capacity], (depth, capacity), (step, 1)
        )

    def _over(self, slot: int, shape: tuple[int, ...]) -> Any:
        """``slot``'s payload as an array of ``shape`` (host or GPU memory)."""
        if self._payload is not None:
            return self._payload.view(self.layout.payloads[slot], self.spec.dtype, shape)
        # math.prod, not np.prod: a ring makes one view per slot (32 for a small tensor), and
        # np.prod's dispatch took about 5 us of each (profiled: 1.6 s of 10,000 registrations)
        nbytes = math.prod(shape) * self.spec.dtype.itemsize
        return self.payload_row(slot)[:nbytes].view(self.spec.dtype).reshape(shape)

    # -- sequence numbers ------------------------------------------------------------------

    @property
    def seq_words(self) -> list[int]:
        """Each slot's sequence-number word, as an index into the region's 64-bit words."""
        return self._seq

    def seq_at(self, slot: int) -> int:
        return int(self._q[self._seq[slot]])

    def slot_seqs(self) -> list[int]:
        return [int(self._q[i]) for i in self._seq]

    def find(self, seq: int) -> int:
        """The slot holding complete message ``seq``, or -1.

        It looks first where the message after the last one found went the last time: writers
        reuse slots in a stable order (the same slot while the consumer keeps up, round the ring
        in release order while it lags), so the guess nearly always holds and a deep ring costs
        no more than a shallow one; a miss scans the slots."""
        q = self._q
        seqs = self._seq
        last = self._found_slot
        follows = seq == self._found_seq + 1
        if follows:
            guess = self._after[last]
            if q[seqs[guess]] == seq:  # the usual case, first and with the fewest steps
                self._found_seq = seq
                self._found_slot = guess
                return guess
        elif q[seqs[last]] == seq:
            return last
        for slot, i in enumerate(seqs):
            if q[i] == seq:
                if follows:
                    self._after[last] = slot
                self._found_seq = seq
                self._found_slot = slot
                return slot
        return -1

    def last_complete(self) -> int:
        """Highest sequence number present in any slot (0 when none was ever written)."""
        return max(self._q[i] for i in self._seq)

    @property
    def released(self) -> int:
        return self._q[self._released]  # a "Q" memoryview: an int already

    def has_credit(self, seq: int) -> bool:
        return seq - self._q[self._released] <= self.depth

    # -- fencing a dropped writer -----------------------------------------------------------
    #
    # A shared-memory writer needs nobody's permission to store into the ring, so a writer the
    # receiver has dropped (silent past its heartbeat timeout, yet alive) must stop by itself. The
    # receiver stores the current claim's epoch in OWNER, and 0 when it drops the owner. A writer
    # announces itself in WRITING *before* it checks OWNER, and clears WRITING after its
    # completion store. So when the receiver later grants a new claim it can tell: either the old
    # writer's WRITING is visible (it may still be storing: the claim waits for it to finish or
    # die), or the old writer will read the changed OWNER and write nothing. That is Dekker's
    # handshake; the writer's half has no fence (Python cannot issue one cheaply), so the receiver
    # issues the fence for both sides with membarrier(2) before it reads WRITING.

    def set_owner(self, epoch: int) -> None:
        """Receiver: ``epoch`` may write from now on (0: nobody may)."""
        self._q[self._owner] = epoch

    def writer_inside(self) -> int:
        """Receiver: the epoch of a writer that is inside a write now (0: none)."""
        return int(self._q[self._writing])

    def clear_writer(self) -> None:
        """Receiver: forget a writer that died inside a write."""
        self._q[self._writing] = 0

    def enter_write(self, epoch: int) -> bool:
        """Writer: announce a write by claim ``epoch``; False if the receiver no longer lets
        that claim write.

        The WRITING word is one for the ring, and another claim's writer may be inside a write,
        announced there: a writer looks at its claim before it stores anything, and one that
        lost its claim never stores 0 over another's announcement (see :func:`_withdraw`)."""
        q = self._q
        owner = self._owner
        if q[owner] != epoch:
            return False
        q[self._writing] = epoch
        if q[owner] == epoch:
            return True
        _withdraw(q, self._writing, owner)
        return False

    def owned_by(self, epoch: int) -> bool:
        """Writer: may claim ``epoch`` still write? (For a writer whose WRITING announcement
        is still up from an earlier message: see ShmWriter's deferred completions.)"""
        return bool(self._q[self._owner] == epoch)

    def leave_write(self) -> None:
        """Writer: the write is complete (or abandoned)."""
        self._q[self._writing] = 0

    def announce_device_stores(self) -> None:
        """Writer: the GPU completes our messages from now on, without ringing the receiver."""
        self._q[self._device_stores] = 1

    def queued_device_store(self, seq: int) -> None:
        """Writer: the GPU will store message ``seq``'s completion (queued behind its copy)."""
        self._q[self._device_stores] = seq

    def device_stores(self) -> bool:
        """Receiver: does a GPU complete messages here (so a wait must look again soon)?"""
        return bool(self._q[self._device_stores])

    def device_store_coming(self, after: int) -> bool:
        """Receiver: has the writer queued the GPU's completion store of a message later than
        ``after``? (It lands once the copy before it has, without ringing anyone.)"""
        return bool(self._q[self._device_stores] > after)

    # -- writer side -----------------------------------------------------------------------

    def slot_view(self, slot: int, shape: tuple[int, ...] | None = None) -> Any:
        """A writable view of ``slot``'s payload, in the tensor's dtype (``shape`` if dynamic):
        a numpy array, or a cupy array for a GPU tensor."""
        if self.static_views is not None:
            view = self.static_views[slot]
            return self.static_view(slot) if view is None else view
        assert shape is not None
        return self._over(slot, shape)

    def describe_slot(self, slot: int, nbytes: int, shape: tuple[int, ...] | None) -> None:
        """Store the size (and a dynamic tensor's shape) of the message going into free
        ``slot``: before its completion store, which :meth:`publish` makes, or the GPU."""
        q = self._q
        word = self._seq[slot]
        if shape is not None:
            base = word + _DIMS_AFTER_SEQ
            for k, d in enumerate(shape):
                q[base + k] = d
            self._i[2 * word + _NDIM32_AFTER_SEQ32] = len(shape)
        q[word + _NBYTES_AFTER_SEQ] = nbytes

    def publish(
        self, slot: int, seq: int, nbytes: int, shape: tuple[int, ...] | None, bell: bool = True
    ) -> None:
        """Mark message ``seq`` complete in ``slot`` (payload in place) and ring the receiver
        (``bell=False``: the caller rings it once for several messages, :meth:`ring_receiver`)."""
        q = self._q
        word = self._seq[slot]
        if shape is None:  # describe_slot, inline for a static tensor: every networked message
            q[word + _NBYTES_AFTER_SEQ] = nbytes
        else:
            self.describe_slot(slot, nbytes, shape)
        q[word] = seq  # the completion store: after the payload and the shape
        if bell:
            # ring_bell, inline: this is the per-message path
            b = self._bell32
            i = self._rx_bell
            b[i] = (b[i] + 1) & 0xFFFFFFFF
            if b[self._rx_waiting]:
                futex_wake(self.rx_bell_address)

    def write_next(
        self, slots: SlotChooser, seq: int, epoch: int, array: np.ndarray[Any, Any], bell: bool
    ) -> int:
        """Writer: message ``seq`` of a static host tensor, whole, in one call, where a credit
        is there: announce the write (:meth:`enter_write`), choose its slot (``slots``, told of
        the write), copy ``array`` (checked: the spec's dtype and shape), :meth:`publish` it and
        leave (:meth:`leave_write`). Returns 1 when written; 0 when there is no credit for
        ``seq`` (nothing done: wait for one and call again); -1 when claim ``epoch`` may no longer
        write (nothing written). The steps of the calls named inline: this is the per-message
        path of small ``shm`` messages, where each method call costs as much as the copy."""
        q = self._q
        released = q[self._released]
        if seq - released > self.depth:
            return 0
        writing = self._writing
        owner = self._owner
        if q[owner] != epoch:  # before the announcement: see enter_write
            return -1
        q[writing] = epoch
        if q[owner] != epoch:
            _withdraw(q, writing, owner)
            return -1
        try:
            # The slot is chosen once the claim is known to hold: a writer dropped while it was
            # stopped finds the ring's released count another writer's, which may free none of
            # the slots it mirrors (a soak with frozen senders met SlotChooser's "no free slot"
            # RuntimeError here, where the write was to raise PeerLostError). SlotChooser's
            # choose() and wrote() inline where the slot written last is free again, as it is
            # whenever the consumer keeps up (one-process timing: 0.09 us a message).
            last = slots.last
            slot = last if slots.seqs[last] <= released else slots.choose(released)
            # Into the slot's own array: numpy's assignment of an array of the same dtype and
            # shape is a plain copy, and it needs no byte view of the source, which costs more
            # to make than a 4 KiB copy (one-process timing: 0.28 us against 0.41 us through
            # memoryviews at 4 KiB; 1.33 against 1.68 us at 64 KiB)
            view = self.static_views[slot]  # type: ignore[index]
            if view is None:
                view = self.static_view(slot)
            view[...] = array
            # publish(), inline for a static tensor (no shape words)
            word = self._seq[slot]
            q[word + _NBYTES_AFTER_SEQ] = self.spec.max_bytes
            q[word] = seq  # the completion store: after the payload
            if bell:
                b = self._bell32
                i = self._rx_bell
                b[i] = (b[i] + 1) & 0xFFFFFFFF
                if b[self._rx_waiting]:
                    futex_wake(self.rx_bell_address)
        finally:
            q[writing] = 0  # after the completion store: a new claim sees the message
        if slot == last:
            slots.seqs[slot] = seq
        else:
            slots.wrote(slot, seq)
        return 1

    def ring_receiver(self) -> None:
        """Ring the receiver's doorbell (after publishing with ``bell=False``)."""
        ring_bell(self._bell32, self._rx_bell, self.rx_bell_address, self._bell32, self._rx_waiting)

    def wait_credit(
        self, seq: int, deadline: float | None, check_peer: Any, busy: bool = True
    ) -> None:
        """Block until message ``seq`` may be written; ``check_peer()`` raises if the peer died.
        ``busy=False`` when the consumer is a thread of this very process (see ``wait_for``)."""

        def ready() -> bool | None:
            if seq - self._q[self._released] <= self.depth:
                return True
            check_peer()
            return None

        wait_for(
            ready,
            bell=self._i,
            bell_index=self._credit_bell,
            bell_address=self.credit_bell_address,
            flag=self._i,
            flag_index=self._tx_waiting,
            deadline=deadline,
            busy=busy,
            what=lambda: (
                f"tensor {self.spec.name!r}: no free slot for message {seq}: the receiver has "
                f"released {self.released} of {seq - 1} (ring depth {self.depth})"
            ),
        )

    # -- receiver side ---------------------------------------------------------------------

    def view(self, slot: int) -> Any:
        """The landed tensor in ``slot`` (which must be complete): a numpy view, or a cupy one
        for a GPU tensor."""
        if self.static_views is not None:
            view = self.static_views[slot]
            return self.static_view(slot) if view is None else view
        word = self._seq[slot]
        ndim = self._i[2 * word + _NDIM32_AFTER_SEQ32]
        base = word + _DIMS_AFTER_SEQ
        return self._over(slot, tuple(int(self._q[base + k]) for k in range(ndim)))

    def release(self, upto: int) -> None:
        """Return credits for every message up to ``upto`` and wake a blocked writer."""
        self._q[self._released] = upto
        # ring_bell, inline: this is the per-message path
        b = self._i
        i = self._credit_bell
        b[i] = (b[i] + 1) & 0xFFFFFFFF
        if b[self._tx_waiting]:
            futex_wake(self.credit_bell_address)

    def take_over(self, old: RingMemory, released: int) -> None:
        """Become ``old``, a host ring of the same spec and depth elsewhere: its words (the
        control block and the slot headers, one span: copied whole) and the payloads of its
        slots whose message is unread or held (past ``released``); a free slot's bytes matter
        to nobody. Where a tensor moves to fresh memory (TensorTable.move)."""
        spec = self.spec
        words = control_footprint(self.depth, spec.ndim, spec.dynamic) // 8
        at, was = self.layout.ctrl // 8, old.layout.ctrl // 8
        self._q[at : at + words] = old._q[was : was + words]
        for slot in range(self.depth):
            if old.seq_at(slot) > released:
                self.payload_row(slot)[:] = old.payload_row(slot)

    def reset_slots(self) -> None:
        """Forget all messages (a fresh registration)."""
        for i in self._seq:
            self._q[i] = 0
        self._q[self._released] = 0
        self._q[self._owner] = 0
        self._q[self._writing] = 0
        self._q[self._device_stores] = 0


def _withdraw(q: Any, writing: int, owner: int) -> None:
    """A writer that announced itself and then found its claim revoked (the receiver dropped it
    between its two looks at the OWNER word): take the announcement down only where no claim
    has been granted since. Where one has (OWNER holds another epoch), that claim's writer may
    have announced a write of its own in the same word, which this writer's store has just
    overwritten; leaving an announcement up there errs on the safe side: the next claim of the
    ring is fenced while the writer it would take over from runs, instead of granted while that
    writer may be copying (and that writer takes it down itself at the end of its next write)."""
    if q[owner] == 0:
        q[writing] = 0


class SlotChooser:
    """The writer's side of slot choice: which free slot the next message goes into.

    It mirrors the sequence number in each slot (the writer put them there, or read them at claim
    time). A slot is free when its message has been released. The slot written last is taken
    whenever it is free (it is still in the writer's cache: a consumer that keeps up sees every
    message in one slot); otherwise the slot with the oldest message, which is free whenever any
    is, since messages are released in order. Both in constant time, whatever the depth.
    """

    __slots__ = ("_order", "last", "seqs")

    def __init__(self, slot_seqs: list[int]) -> None:
        self.seqs = list(slot_seqs)
        #: slots from the oldest message to the newest (ties: by index)
        self._order = deque(sorted(range(len(self.seqs)), key=self.seqs.__getitem__))
        #: the slot written last (it holds the newest message): the answer whenever it is free
        self.last = self._order[-1]

    def choose(self, released: int) -> int:
        last = self.last
        if self.seqs[last] <= released:
            return last
        oldest = self._order[0]
        if self.seqs[oldest] > released:  # cannot happen while credits are honoured: a bug
            raise RuntimeError(f"no free slot: slots hold {self.seqs}, released {released}")
        return oldest

    def wrote(self, slot: int, seq: int) -> None:
        self.seqs[slot] = seq
        self.last = slot
        order = self._order
        if order[-1] == slot:
            return
        if order[0] == slot:
            order.rotate(-1)  # the oldest became the newest
        else:
            order.remove(slot)
            order.append(slot)
