"""The consumer's side of a receiver: wait for landed messages, hand them out, release them.

A message is complete when a slot's sequence number says so (whoever wrote it); ``wait`` finds
the next one, hands out a read-only zero-copy view of its slot, and ``release`` returns the slot
to the writer as one credit. Waits sleep on the receiver's doorbell (or spin briefly when the
writer is a process on this host that rings it itself). Any number of consumer threads may share
one receiver: finding a message and taking it are one step under the receiver's lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..cuda import synchronize_current
from ..doorbell import deadline_of, wait_for
from ..errors import ClosedError, PeerLostError, TensorWireError
from ..layout import OFF_DOORBELL, OFF_RX_WAITING
from ..received import received
from .state import ReceiverState
from .tensors import RegisteredTensor, TensorTable


class Consumer:
    def __init__(self, state: ReceiverState, table: TensorTable) -> None:
        self._state = state
        self._table = table
        self._active = 0  # threads inside a wait; close() lets them leave before unmapping
        self._idle = threading.Condition(state.lock)
        self._rr = 0  # wait_any's round-robin cursor

    # -- one message -------------------------------------------------------------------------

    def _next_slot(self, tensor: RegisteredTensor) -> int | None:
        """The slot holding the tensor's next message, if complete. Raises for a lost owner."""
        slot = tensor.ring.find(tensor.consumed + 1)
        if slot >= 0:
            return slot
        if tensor.lost is not None:
            reason, tensor.lost = tensor.lost, None
            raise PeerLostError(f"tensor {tensor.spec.name!r}: {reason}")
        return None

    @staticmethod
    def _take(tensor: RegisteredTensor, slot: int) -> Any:
        """Hand out the next message, found in ``slot`` by :meth:`_next_slot`: a
        Any, or a cupy array for a GPU tensor."""
        tensor.consumed += 1
        if tensor.views is not None:
            return tensor.views[slot]
        view = tensor.ring.view(slot)
        return view if tensor.ring.device is not None else received(view)

    # -- waiting -------------------------------------------------------------------------------

    def _block(
        self, check: Callable[[], Any], timeout: float | None, what: Callable[[], str], busy: bool
    ) -> Any:
        state = self._state
        with state.lock:
            if state.closed:
                state.check_open()
            self._active += 1
        try:

            def guarded() -> Any:
                if state.closed:
                    raise ClosedError(f"receiver {state.name} was closed while waiting")
                return check()

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
        tensor = self._lookup(name)
        if not tensor.slot_free:
            raise TensorWireError(
                f"tensor {name!r}: all {tensor.ring.depth} slots are held by the consumer; "
                "release() one before waiting for the next message"
            )
        lock = self._state.lock

        def ready() -> Any | None:
            # Finding the message and taking it are one step under the lock, so two consumer
            # threads are never handed the same message.
            with lock:
                if not tensor.slot_free:  # another thread holds the last slot: wait for it
                    return None
                slot = self._next_slot(tensor)
                return None if slot is None else self._take(tensor, slot)

        view: Any = self._block(
            ready,
            timeout,
            lambda: (
                f"tensor {name!r}: message {tensor.consumed + 1} did not arrive within "
                f"{timeout} s on {self._state.name}"
            ),
            busy=tensor.sender_completes,
        )
        return view

    def wait_any(self, timeout: float | None) -> tuple[str, Any]:
        lock = self._state.lock
        table = self._table

        def ready() -> tuple[str, Any] | None:
            with lock:  # the cursor and the take are shared by every consumer thread
                order = table.order
                n = len(order)
                for k in range(n):
                    tensor = order[(self._rr + k) % n]
                    if tensor.slot_free and (slot := self._next_slot(tensor)) is not None:
                        self._rr = (self._rr + k + 1) % n
                        return tensor.spec.name, self._take(tensor, slot)
                return None

        got: tuple[str, Any] = self._block(
            ready,
            timeout,
            lambda: f"no message arrived within {timeout} s on {self._state.name}",
            busy=any(t.sender_completes for t in table.order),
        )
        return got

    # -- handing slots back ----------------------------------------------------------------

    def release(self, name: str) -> None:
        device = self._lookup(name).ring.device
        if device is not None:
            # The consumer's kernels reading the slot are queued on its current stream; the next
            # message may overwrite the slot as soon as the credit is out. (Outside the lock:
            # those kernels may take a while.)
            synchronize_current(device)
        with self._state.lock:
            tensor = self._lookup(name)
            if tensor.released >= tensor.consumed:
                raise TensorWireError(f"tensor {name!r}: no message is held, nothing to release")
            tensor.released += 1
            tensor.ring.release(tensor.released)
            owner = tensor.owner
            if owner is not None and owner.link is not None and not tensor.sender_completes:
                owner.link.send_credit(tensor.tensor_id, tensor.released)

    def drain(self, name: str) -> int:
        with self._state.lock:
            tensor = self._table.get(name)
            dropped = 0
            tensor.lost = None
            while tensor.slot_free and (slot := tensor.ring.find(tensor.consumed + 1)) >= 0:
                self._take(tensor, slot)
                self.release(name)
                dropped += 1
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
