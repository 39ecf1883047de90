"""The consumer's side of a receiver: wait for landed messages, hand them out, release them.

A message is complete when a slot's sequence number says so (whoever wrote it); ``wait`` finds
the next one, hands out a read-only zero-copy view of its slot, and ``release`` returns the slot
to the writer as one credit. Waits sleep on the receiver's doorbell (or spin briefly when the
writer is a process on this host that rings it itself). Any number of consumer threads may share
one receiver: finding a message and taking it are one step under the receiver's lock.
"""

from __future__ import annotations

import operator
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ..cuda import synchronize_current
from ..doorbell import check_timeout, deadline_of, remaining, wait_for
from ..errors import ClosedError, PeerLostError, TensorWireError
from ..layout import OFF_DOORBELL, OFF_RX_WAITING
from ..received import received
from ..transports.base import CreditLink
from .state import ReceiverState
from .tensors import RegisteredTensor, TensorTable

#: The longest a wait sleeps before it looks again at a ring whose messages a GPU completes
#: (RingMemory.device_stores) while a store the writer queued has not landed: that store rings
#: no doorbell. The writer rings as it queues the store, and a waiter that sees a store coming
#: yields the CPU until it lands (up to DEVICE_STORE_WATCH); this bounds the rest: a copy queued
#: behind long work (a backward pass still running on the producer's stream), or a writer that
#: died before its store ran. With nothing coming, a wait sleeps as on any ring: the next store
#: is rung as it is queued.
DEVICE_STORES_MAX_BLOCK = 0.0002
#: Tensors from which wait_any reads every slot's sequence number at once (numpy) to find those
#: whose next message landed, rather than looking at each tensor in turn (below it, the numpy
#: calls cost more than they save)
SCAN_ALL_FROM = 64
_CONSUMED = operator.attrgetter("consumed")
_LOST = operator.attrgetter("lost")
_POLL = operator.attrgetter("poll")
_SENDER_COMPLETES = operator.attrgetter("sender_completes")
#: How long one wait yields the CPU, at most, for a GPU completion store it was told is coming,
#: before it sleeps in DEVICE_STORES_MAX_BLOCK slices. Long enough for a copy queued behind a
#: few others, or behind the other process's turn on the GPU (a whole 4 KiB round trip between
#: two processes took 330-350 us on an H200); short enough not to hold a core for as long as a
#: copy queued behind long work takes.
DEVICE_STORE_WATCH = 0.002


class Consumer:
    def __init__(self, state: ReceiverState, table: TensorTable) -> None:
        self._state = state
        self._table = table
        self._active = 0  # threads inside a wait; close() lets them leave before unmapping
        self._idle = threading.Condition(state.lock)
        self._rr = 0  # wait_any's round-robin cursor
        #: wait_any's index of every slot's sequence number, for the order it was made for
        self._slot_index: tuple[tuple[RegisteredTensor, ...], list[Any]] | None = None
        #: what wait_any's last look at every ring found landed and has not handed out yet
        #: (places in the order it looked at, in round-robin order; see wait_any)
        self._landed: tuple[tuple[RegisteredTensor, ...], deque[int]] | None = None
        #: the tensors of that order on a GPU (_on_gpu)
        self._gpu_of: tuple[tuple[RegisteredTensor, ...], tuple[RegisteredTensor, ...]] | None = (
            None
        )
        #: links holding back credits (release's ``defer``), with the tensors whose, by id
        self._owed: dict[int, tuple[CreditLink, dict[int, RegisteredTensor]]] = {}

    # -- one message -------------------------------------------------------------------------

    def _next_slot(self, tensor: RegisteredTensor) -> int | None:
        """The slot holding the tensor's next message, if complete. Raises for a lost owner,
        once the messages it completed are handed out: before its successor's first, or when
        none is left (the per-message paths that look at the ring themselves come here when
        a notice is owed)."""
        seq = tensor.consumed + 1
        slot = tensor.ring.find(seq)
        losses = tensor.lost
        if losses is None:
            return slot if slot >= 0 else None
        loss = losses[0]
        if slot >= 0 and seq < loss.until:
            return slot  # the lost writer's own
        del losses[0]
        if not losses:
            tensor.lost = None
        raise PeerLostError(f"tensor {tensor.spec.name!r}: {loss.reason}", tensor=tensor.spec.name)

    @staticmethod
    def _take(tensor: RegisteredTensor, slot: int) -> Any:
        """Hand out the next message, found in ``slot`` by :meth:`_next_slot`: a
        Any, or a cupy array for a GPU tensor."""
        tensor.consumed += 1
        counts = tensor.traffic  # inline, not a method call: this is the per-message path
        counts.messages += 1
        views = tensor.views
        if views is not None:
            counts.bytes += tensor.spec.max_bytes
            view = views[slot]
            return tensor.make_view(slot) if view is None else view
        view = tensor.ring.view(slot)
        counts.bytes += view.nbytes
        return view if tensor.ring.device is not None else received(view)

    # -- waiting -------------------------------------------------------------------------------

    def _block(
        self,
        check: Callable[[], Any],
        timeout: float | None,
        what: Callable[[], str],
        tensors: Iterable[RegisteredTensor],
    ) -> Any:
        """Wait until ``check()`` has something for us. Spin first where the writer completes
        messages itself (shm); where the message is completed by a data server that must be
        polled (nixl), this thread polls it while it spins, instead of being woken by the
        server's thread."""
        state = self._state
        tensors = tuple(tensors)
        # one poll per server (bound methods of one server compare equal); map and attrgetter:
        # a wait_any passes every tensor here, and a loop of attribute reads cost 0.5 us each
        polls = dict.fromkeys(map(_POLL, tensors))
        polls.pop(None, None)
        drive = tuple(polls)
        busy = bool(drive) or any(map(_SENDER_COMPLETES, tensors))
        # A GPU that completes a message rings nobody: while a completion store the writer has
        # queued is on its way, watch for it, then sleep in DEVICE_STORES_MAX_BLOCK slices. Every
        # GPU ring, also one whose writer has not said yet that its GPU stores (its word is 0,
        # never "coming"): a wait that began before the writer's first GPU message would
        # otherwise not see that message's store coming, and sleep MAX_BLOCK slices through it.
        stored_by_gpu = self._on_gpu(tensors)
        coming = None
        if stored_by_gpu:

            def coming() -> bool:
                return any(t.ring.device_store_coming(t.consumed) for t in stored_by_gpu)

        with state.lock:
            if state.closed:
                state.check_open()
            self._active += 1
            if self._owed:  # a writer must never wait for credits a waiting consumer holds
                self._pay_owed(tensors)
        try:
            polling = bool(drive)

            def guarded() -> Any:
                if state.closed:
                    raise ClosedError(f"receiver {state.name} was closed while waiting")
                if polling:
                    for poll in drive:
                        poll()
                return check()

            def rest() -> None:
                # asleep, this thread no longer polls: the servers' threads complete the
                # messages and ring the doorbell
                nonlocal polling
                polling = False
                for poll in drive:
                    poll(rest=True)

            bell = self._table.bell
            return wait_for(
                guarded,
                bell=bell.words32,
                bell_index=OFF_DOORBELL // 4,
                bell_address=bell.address + OFF_DOORBELL,
                flag=bell.words32,
                flag_index=OFF_RX_WAITING // 4,
                deadline=deadline_of(timeout),
                what=what,
                busy=busy,
                resting=rest if drive else None,
                coming=coming,
                watch=DEVICE_STORE_WATCH,
                coming_block=DEVICE_STORES_MAX_BLOCK,
            )
        finally:
            with state.lock:
                self._active -= 1
                self._idle.notify_all()

    def _lookup(self, name: str) -> RegisteredTensor:
        # Per message: one dict lookup; the registry's get() says what is wrong otherwise.
        tensor = self._table.by_name.get(name)
        if tensor is None or self._state.closed:
            return self._table.get(name)
        return tensor

    def wait(self, name: str, timeout: float | None) -> Any:
        # The message is often there already: then it is taken here, with _lookup,
        # _take_next and _next_slot inline (the per-message path), and no wait is set up.
        # A bad timeout is refused first, found there or not (before, a NaN or negative one
        # was refused only when the message had not arrived): the check is called only for
        # what is not a float >= 0 already, None aside.
        if timeout is not None and not (timeout.__class__ is float and timeout >= 0):
            check_timeout(timeout)
        state = self._state
        tensor = self._table.by_name.get(name)
        if tensor is not None and not state.closed:
            lock = state.lock
            poll = None
            lock.acquire()
            try:
                if tensor.consumed - tensor.released < tensor.ring.depth:
                    slot = tensor.ring.find(tensor.consumed + 1)
                    if slot >= 0 and tensor.lost is None:  # (a loss's notice owed: below)
                        return self._take(tensor, slot)
                    # Not complete yet. Where a consumer completes messages itself (tcp, nixl:
                    # a server it polls), the message is often in the socket already: one
                    # poll here costs less than setting a wait up. Counted as a wait, so that
                    # close() does not unmap what the poll may complete into.
                    poll = tensor.poll
                    if poll is not None and not state.closed:
                        self._active += 1
                    else:
                        poll = None
            finally:
                lock.release()
            if poll is not None:
                try:
                    poll()
                except BaseException:
                    with lock:
                        self._active -= 1
                        self._idle.notify_all()
                    raise
                lock.acquire()
                try:
                    self._active -= 1
                    if state.closed:
                        self._idle.notify_all()
                    elif tensor.consumed - tensor.released < tensor.ring.depth:
                        slot = tensor.ring.find(tensor.consumed + 1)
                        if slot >= 0 and tensor.lost is None:
                            return self._take(tensor, slot)
                finally:
                    lock.release()
        tensor = self._lookup(name)
        self._check_slot_free(tensor)
        got = self._take_next(tensor)
        if got is not None:
            return got
        view: Any = self._block(
            lambda: self._take_next(tensor),
            timeout,
            lambda: (
                f"tensor {name!r}: message {tensor.consumed + 1} did not arrive within "
                f"{timeout} s on {self._state.name}"
            ),
            (tensor,),
        )
        return view

    def _take_next(self, tensor: RegisteredTensor) -> Any | None:
        """The tensor's next message if it is complete, taken. Finding the message and taking
        it are one step under the lock, so two consumer threads are never handed the same
        message. (The lock without ``with``: half the cost, on the per-message path.)"""
        lock = self._state.lock
        lock.acquire()
        try:
            if not tensor.slot_free:  # another thread holds the last slot: wait for it
                return None
            slot = self._next_slot(tensor)
            return None if slot is None else self._take(tensor, slot)
        finally:
            lock.release()

    def wait_any(self, timeout: float | None) -> tuple[str, Any]:
        if timeout is not None and not (timeout.__class__ is float and timeout >= 0):
            check_timeout(timeout)  # (refused before a message is taken, as wait's)
        lock = self._state.lock
        table = self._table

        def ready() -> tuple[str, Any] | None:
            with lock:  # the cursor and the take are shared by every consumer thread
                order = table.order
                n = len(order)
                if n < SCAN_ALL_FROM:
                    for k in range(n):
                        tensor = order[(self._rr + k) % n]
                        if tensor.slot_free and (slot := self._next_slot(tensor)) is not None:
                            self._rr = (self._rr + k + 1) % n
                            return tensor.spec.name, self._take(tensor, slot)
                    return None
                # What the last look at every ring found and has not handed out is handed out
                # first, in the order found, and every ring is looked at again only once none
                # of it is left: a batch of N messages (a parameter server's gradients) took
                # N looks at every ring, one per message (BENCHMARKS.md, "`wait_any` of a batch").
                landed = self._landed
                if landed is not None and landed[0] is order and landed[1]:
                    got = self._take_first(order, landed[1])
                    if got is not None:
                        return got
                cursor = self._rr
                found = deque((cursor + k) % n for k in self._landed_first(order))
                self._landed = (order, found)
                return self._take_first(order, found)

        got = ready()  # (the message is often there already: no wait is set up)
        if got is not None:
            return got
        got = self._block(
            ready,
            timeout,
            lambda: f"no message arrived within {timeout} s on {self._state.name}",
            table.order,
        )
        return got

    def _take_first(
        self, order: tuple[RegisteredTensor, ...], places: deque[int]
    ) -> tuple[str, Any] | None:
        """wait_any's take: the first tensor at ``places`` (in ``order``, popped as they are
        looked at) whose next message is complete, or None; the cursor moves past it."""
        while places:
            place = places.popleft()
            tensor = order[place]
            if tensor.slot_free and (slot := self._next_slot(tensor)) is not None:
                self._rr = (place + 1) % len(order)
                return tensor.spec.name, self._take(tensor, slot)
        return None

    def _on_gpu(self, tensors: tuple[RegisteredTensor, ...]) -> tuple[RegisteredTensor, ...]:
        """The tensors of ``tensors`` whose slots are in GPU memory; for the receiver's whole
        order (a wait_any) kept until a registration changes it (sorting out 20,000 tensors
        each time took 9 ms of a wait_any's 27, under the profiler)."""
        kept = self._gpu_of
        if kept is not None and kept[0] is tensors:
            return kept[1]
        on_gpu = tuple(t for t in tensors if t.ring.device is not None)
        if tensors is self._table.order:
            self._gpu_of = (tensors, on_gpu)
        return on_gpu

    def _landed_first(self, order: tuple[RegisteredTensor, ...]) -> list[int]:
        """The places after wait_any's cursor (0 for the cursor's own tensor) of the tensors
        whose next message has landed, or whose writer was lost, in round-robin order: every
        slot's sequence number read at once per region (numpy), where looking at each tensor in
        turn read every slot of each idle one (a ring's guess of the next slot misses there):
        a message among 2000 idle tensors took 8.8 ms to find, among 20,000 106 ms. A message
        landing after the read is found at the next look, as one landing behind the turn was."""
        index = self._slot_index
        if index is None or index[0] is not order:
            index = self._slot_index = (order, self._index_slots(order))
        consumed = np.array(list(map(_CONSUMED, order)), np.uint64)
        found: set[int] = set()
        for words, where, starts, owners in index[1]:
            # a ring whose highest sequence number is not past its consumed count cannot hold
            # its next message; the others _next_slot looks at slot by slot
            newest = np.maximum.reduceat(words[where], starts)
            found.update(owners[newest > consumed[owners]].tolist())
        if any(map(_LOST, order)):
            found.update(i for i, t in enumerate(order) if t.lost is not None)
        n, cursor = len(order), self._rr
        return sorted((i - cursor) % n for i in found)

    def _index_slots(self, order: tuple[RegisteredTensor, ...]) -> list[tuple[Any, ...]]:
        """Per host region: its 64-bit words, where its rings' sequence numbers are among them
        (ring after ring), where each ring's start in that list, and whose each ring is (its
        tensor's place in ``order``). Made again when ``order`` is (a registration)."""
        by_region: dict[int, tuple[list[int], list[int], list[int]]] = {}
        for place, tensor in enumerate(order):
            where, starts, owners = by_region.setdefault(tensor.ring.layout.region, ([], [], []))
            starts.append(len(where))
            where.extend(tensor.ring.seq_words)
            owners.append(place)
        regions = self._table.regions
        return [
            (
                regions[r].array.view(np.uint64),
                np.array(where, np.intp),
                np.array(starts, np.intp),
                np.array(owners, np.intp),
            )
            for r, (where, starts, owners) in by_region.items()
        ]

    def _lookup_each(self, names: Iterable[str]) -> list[RegisteredTensor]:
        """:meth:`_lookup` of each name, its dict lookup inline (per name of a batch)."""
        if isinstance(names, str):
            # a str is an iterable of names too: wait_all("ab") took the messages of tensors
            # "a" and "b" (which another thread may have been waiting for)
            raise TypeError(f"give a list of tensor names, not the str {names!r}")
        by_name = self._table.by_name
        return [by_name.get(n) or self._lookup(n) for n in names]

    def _lookup_all(self, names: Iterable[str]) -> list[RegisteredTensor]:
        if self._state.closed:
            self._state.check_open()
        tensors = self._lookup_each(names)
        if len({id(t) for t in tensors}) != len(tensors):
            raise TensorWireError("each tensor may be named once in a wait for several")
        for t in tensors:
            if t.consumed - t.released >= t.ring.depth:  # slot_free, inline
                self._check_slot_free(t)
        return tensors

    @staticmethod
    def _check_slot_free(tensor: RegisteredTensor) -> None:
        """Refuse a wait that could never end: the consumer holds every slot itself."""
        if not tensor.slot_free:
            raise TensorWireError(
                f"tensor {tensor.spec.name!r}: all {tensor.ring.depth} slots are held by the "
                "consumer; release() one before waiting for the next message"
            )

    def wait_all(self, names: Iterable[str], timeout: float | None) -> dict[str, Any]:
        tensors = self._lookup_all(names)
        lock = self._state.lock
        cursor = 0  # tensors before it had their next message complete when last looked at
        slots = [0] * len(tensors)  # where: found under the lock, and valid while it is held
        take = self._take

        def ready() -> dict[str, Any] | None:
            nonlocal cursor
            with lock:
                # Messages stay complete until taken, so each wake-up looks on from where the
                # last one stopped: the whole wait costs one pass over the names, not one per
                # message that lands. (slot_free and _next_slot inline: per tensor.)
                start = cursor
                while cursor < len(tensors):
                    t = tensors[cursor]
                    if t.consumed - t.released >= t.ring.depth:
                        return None
                    slot = t.ring.find(t.consumed + 1)
                    if slot < 0 or t.lost is not None:
                        # raises for a lost writer whose notice is owed before this message
                        found = self._next_slot(t)
                        if found is None:
                            return None
                        slot = found
                    slots[cursor] = slot
                    cursor += 1
                # Found on an earlier wake-up, with the lock let go since: another consumer
                # thread may have taken them meanwhile. Then look again from the start.
                for k in range(start):
                    t = tensors[k]
                    again = self._next_slot(t) if t.consumed - t.released < t.ring.depth else None
                    if again is None:
                        cursor = 0
                        return None
                    slots[k] = again
                return {t.spec.name: take(t, slot) for t, slot in zip(tensors, slots, strict=True)}

        got = ready()
        if got is not None:
            return got
        out: dict[str, Any] = self._block(
            ready,
            timeout,
            lambda: (
                f"{len(tensors) - cursor} of {len(tensors)} tensors (first "
                f"{tensors[min(cursor, len(tensors) - 1)].spec.name!r}) had no message within "
                f"{timeout} s on {self._state.name}"
            ),
            tensors,
        )
        return out

    def wait_each(self, names: Iterable[str], timeout: float | None) -> Iterator[tuple[str, Any]]:
        tensors = self._lookup_all(names)
        deadline = deadline_of(timeout)
        lock = self._state.lock

        def ready() -> tuple[str, Any] | None:
            with lock:
                # In order: messages mostly land in the order they were sent, so the first
                # tensor looked at is usually the one.
                for k, t in enumerate(tensors):
                    if t.slot_free and (slot := self._next_slot(t)) is not None:
                        del tensors[k]
                        return t.spec.name, self._take(t, slot)
                return None

        while tensors:
            got = ready()
            if got is None:
                got = self._block(
                    ready,
                    remaining(deadline),
                    lambda: (
                        f"{_tensors(len(tensors))} (first {tensors[0].spec.name!r}) had no "
                        f"message within {timeout} s on {self._state.name}"
                    ),
                    tensors,
                )
            yield got

    # -- handing slots back ----------------------------------------------------------------

    def release(self, name: str) -> None:
        tensor = self._table.by_name.get(name)  # _lookup, inline: the per-message path
        if tensor is None or self._state.closed:
            tensor = self._table.get(name)
        device = tensor.ring.device
        if device is not None:
            # The consumer's kernels reading the slot are queued on its current stream; the next
            # message may overwrite the slot as soon as the credit is out. (Outside the lock:
            # those kernels may take a while.)
            synchronize_current(device)
        state = self._state
        lock = state.lock
        lock.acquire()  # not ``with``: the per-message path (half the cost)
        try:
            if state.closed:  # closed since the lookup: the ring may be unmapped by now
                state.check_open()
            if tensor.released >= tensor.consumed:
                raise TensorWireError(f"tensor {name!r}: no message is held, nothing to release")
            if tensor.sender_completes:  # _hand_back, inline: the writer reads the ring
                tensor.released += 1
                tensor.ring.release(tensor.released)
                return
            # _hand_back, inline
            released = tensor.released = tensor.released + 1
            tensor.ring.release(released)
            owner = tensor.owner
            link = None if owner is None else owner.link
            if link is not None:
                link.send_credit(tensor.tensor_id, released, self._may_defer(tensor, link))
        finally:
            lock.release()

    @staticmethod
    def _hand_back(tensor: RegisteredTensor) -> CreditLink | None:
        """Release the tensor's oldest held message; the link its credit must travel by (None:
        the writer reads it from the ring). Under the lock."""
        tensor.released += 1
        tensor.ring.release(tensor.released)
        if tensor.sender_completes:
            return None
        owner = tensor.owner
        return None if owner is None else owner.link

    def _may_defer(self, tensor: RegisteredTensor, link: CreditLink) -> bool:
        """May the credit of the release just made wait for the next ones (``defer``)? While
        the consumer holds nothing more of the tensor and fewer than ``credit_batch`` (half the
        ring) of its releases are untold: a writer then always knows of more than half the ring
        free, so it is never held up by what it has not heard, and the link sends it within
        CREDIT_DEFER_LIMIT anyway, or as soon as a consumer of this receiver waits where the
        writer could be waiting for them (:meth:`_pay_owed`). Under the lock."""
        if (
            tensor.consumed == tensor.released
            and tensor.released - tensor.credited < tensor.credit_batch
        ):
            owed = self._owed.get(id(link))
            if owed is None:  # a link new here: what ended links left goes (bounded, not per call)
                self.forget_ended_links()
                owed = self._owed[id(link)] = (link, {})
            owed[1][id(tensor)] = tensor
            return True
        tensor.credited = tensor.released
        return False

    def _pay_owed(self, waited: tuple[RegisteredTensor, ...]) -> None:
        """Before a wait for ``waited``: have each link send the credits it holds back where
        its writer could be waiting for them. Under the lock.

        A writer waits for credits when it has ``depth`` messages of a tensor beyond the last
        credit it heard of. With fewer than half the ring's releases untold (``_may_defer``),
        the rest of those messages are held by the consumer, landed and not taken, or still on
        their way. A wait for the deferred tensor itself while holding none of it leaves only
        the last: they land, wake this very wait, and their releases tell the writer. So the
        common loop (take, release, wait for the next) keeps its credits batched; a wait for
        other tensors, or while holding some of this one, pays at once: the messages it waits
        for may be behind the credits."""
        waiting_for = {id(t) for t in waited}
        for key, (link, tensors) in list(self._owed.items()):
            if _ended(link, tensors):
                del self._owed[key]
            elif any(
                id(t) not in waiting_for or t.consumed != t.released for t in tensors.values()
            ):
                del self._owed[key]
                link.send_credits([])

    def forget_ended_links(self) -> None:
        """Drop what is held back on links that ended (:func:`_ended`): when a link new here
        defers credits, and as a session ends (SessionHandler.on_drop). Under the lock. Before
        the latter, a dropped tcp sender that still ran was kept, with its connection's
        buffers, until the consumer's next wait or a new link."""
        for key, (link, tensors) in list(self._owed.items()):
            if _ended(link, tensors):
                del self._owed[key]

    def release_many(self, names: Iterable[str]) -> None:
        tensors = self._lookup_each(names)
        for device in {d for t in tensors if (d := t.ring.device) is not None}:
            synchronize_current(device)  # as in release()
        credits: dict[int, tuple[CreditLink, list[tuple[int, int]], list[bool]]] = {}
        state = self._state
        with state.lock:
            if state.closed:  # closed since the lookup: the rings may be unmapped by now
                state.check_open()
            # Every name checked before any slot is handed back. (Counted only when a name
            # repeats: each once is the usual batch, and a Counter costs more than the check.)
            repeats = len({id(t) for t in tensors}) != len(tensors)
            times = Counter(id(t) for t in tensors) if repeats else None
            for tensor in tensors:
                want = 1 if times is None else times[id(tensor)]
                if tensor.consumed - tensor.released < want:
                    raise TensorWireError(
                        f"tensor {tensor.spec.name!r}: released {want} time(s), but "
                        f"{tensor.consumed - tensor.released} message(s) held; nothing released"
                    )
            for tensor in tensors:
                link = self._hand_back(tensor)
                if link is not None:
                    _, pairs, defer = credits.setdefault(id(link), (link, [], []))
                    pairs.append((tensor.tensor_id, tensor.released))
                    defer.append(self._may_defer(tensor, link))
            # Each networked sender hears of all its credits of the batch at once.
            for link, pairs, defer in credits.values():
                link.send_credits(pairs, all(defer))

    def drain(self, name: str) -> int:
        with self._state.lock:
            tensor = self._table.get(name)
            dropped = 0
            tensor.lost = None  # every notice owed, also of writers before the last
            while tensor.slot_free and (slot := tensor.ring.find(tensor.consumed + 1)) >= 0:
                self._take(tensor, slot)
                self.release(name)
                dropped += 1
            # The consumer may learn of a loss before this receiver does (its own sender to the
            # writer's host failed): the notice this receiver raises later is then stale, and
            # would fail the first wait for the writer's successor (Sessions.drop)
            tensor.drained = (tensor.epoch, tensor.ring.last_complete())
            return dropped

    def pending(self, name: str) -> int:
        tensor = self._table.get(name)
        return max(tensor.ring.last_complete() - tensor.consumed, 0)

    # -- closing -------------------------------------------------------------------------------

    def let_waiters_leave(self, seconds: float) -> None:
        """After the receiver is marked closed and the doorbell rung: give the threads inside a
        wait up to ``seconds`` to leave it, before the memory they read is unmapped. Called
        under the state's lock."""
        deadline = time.monotonic() + seconds
        while self._active and time.monotonic() < deadline:
            self._idle.wait(0.05)
        self._slot_index = self._gpu_of = None  # (their views would keep the regions mapped)


def _ended(link: CreditLink, tensors: dict[int, RegisteredTensor]) -> bool:
    """Forget the tensors of ``tensors`` (credits held back on ``link``) whose writer is gone,
    or another writer's now: nothing is owed on ``link`` for them. True once none is left.
    Kept, every ended link stayed in ``Consumer._owed`` for good, with its buffers (over tcp
    about 250 KiB a sender that came and went: a parameter server's worker restarted, a client
    that connects per request)."""
    for gone in [k for k, t in tensors.items() if t.owner is None or t.owner.link is not link]:
        del tensors[gone]
    return not tensors


def _tensors(count: int) -> str:
    """``count`` tensors, in words ("1 tensor", "3 tensors")."""
    return f"{count} tensor" if count == 1 else f"{count} tensors"
