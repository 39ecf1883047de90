"""Where the networked transports land payloads: the receiver's :class:`DataSink`.

A data server (TCP, gRPC, NIXL) calls these on its own threads. Each data connection is admitted
by the token its session was welcomed with; each write's header is checked against the claim
(the session owns the tensor), the sequence (the next message, in order), the credits (a free
slot, no overrun) and the spec (the exact byte count, a shape only for a dynamic tensor) before
the server gets the slot's bytes to receive into, and the slot is completed only once the whole
payload is there and its session still holds the claim. Nothing here copies a host payload; a GPU
tensor's payload is received into pinned host memory and copied to the slot before it completes
(tcp and grpc move host bytes; nixl writes GPU memory itself and only reports it, ``landed``).
"""

from __future__ import annotations

import dataclasses
import time

from .. import wire
from ..cuda import PinnedBuffer, copier, data_pointer
from ..errors import ClosedError, LocalProtocolError, SpecMismatchError
from ..ring import SlotChooser
from ..transports import TRANSPORTS
from ..transports.base import CreditLink, DataSink
from .sessions import Session, SessionHandler
from .state import ReceiverState
from .tensors import RegisteredTensor, TensorTable


def _queue_staged(tensor: RegisteredTensor, slot: int, upto: int) -> None:
    """Queue the copy of the staged payload's bytes not yet on their way, up to ``upto``, into
    the GPU slot (on the device's own stream). No lock: the staging and ``staged_upto`` belong
    to the payload being received, which only its connection's reader touches, and the claim
    and the credits keep every other writer out of the slot."""
    done, device = tensor.staged_upto, tensor.ring.device
    assert device is not None
    if upto > done:
        copier().queue(
            tensor.ring.payload_addresses[slot] + done,
            data_pointer(tensor.staging.array) + done,
            upto - done,
            device,
        )
        tensor.staged_upto = upto


class Landing(DataSink):
    def __init__(self, state: ReceiverState, table: TensorTable, sessions: SessionHandler) -> None:
        self._state = state
        self._table = table
        self._sessions = sessions

    def admit(self, token: bytes, generation: int, link: CreditLink, transport: str) -> object:
        with self._state.lock:
            session = self._sessions.by_token(token)
            if session is None or not session.alive:
                raise LocalProtocolError(f"{transport} connection presented an unknown token")
            if generation != self._state.generation:
                raise LocalProtocolError(
                    f"{transport} connection for stale generation {generation}"
                )
            if session.link is not None:
                raise LocalProtocolError(f"{session.describe()} already has a data connection")
            session.link = link
            known = TRANSPORTS.get(transport)
            session.link_server = (known.server if known is not None else None) or transport
            return session

    def await_slot(
        self, session: object, header: wire.DataHeader, deadline: float | None
    ) -> wire.DataHeader:
        assert isinstance(session, Session)
        state = self._state
        with state.lock:
            tensor = self._table.by_id.get(header.tensor_id)
            if tensor is None or tensor.owner is not session or not session.alive:
                return header  # begin_write says what is wrong
            if header.seq != tensor.expected_seq:
                return header
            ring = tensor.ring

        def check_peer() -> None:
            if state.closed:
                raise ClosedError(f"receiver {state.name} is closing")
            if not session.alive:
                raise session.dropped_error()

        # On this server thread, as the shm writer waits in the sender: the ring's credit bell.
        # The consumer is a thread of this process: spinning would only take its core and GIL.
        ring.wait_credit(header.seq, deadline, check_peer, busy=False)
        with state.lock:
            slot = SlotChooser(ring.slot_seqs()).choose(tensor.released)
        return dataclasses.replace(header, slot=slot)

    def begin_write(self, session: object, header: wire.DataHeader) -> memoryview:
        assert isinstance(session, Session)
        with self._state.lock:
            tensor, nbytes = self._check_write(session, header)
            tensor.inflight = session
            if tensor.ring.device is None:
                return tensor.ring.payload_row(header.slot)[:nbytes].data
            # A GPU slot: the bytes arrive in pinned host memory first (arrived() and end_write
            # copy them on).
            if tensor.staging is None:
                tensor.staging = PinnedBuffer()
                tensor.staging.bytes(tensor.spec.max_bytes)
            tensor.staged_upto = 0
            staged: memoryview = tensor.staging.bytes(nbytes).data
            return staged

    def _check_write(
        self, session: Session, header: wire.DataHeader
    ) -> tuple[RegisteredTensor, int]:
        """The tensor ``header`` writes and its payload's byte count, once the header is found
        true to the claim, the sequence, the credits and the spec."""
        return self._check(
            session,
            header.tensor_id,
            header.slot,
            header.generation,
            header.seq,
            header.nbytes,
            header.shape,
        )

    def _check(
        self,
        session: Session,
        tensor_id: int,
        slot: int,
        generation: int,
        seq: int,
        header_nbytes: int,
        shape: tuple[int, ...] | None,
    ) -> tuple[RegisteredTensor, int]:
        """:meth:`_check_write` of a header's fields."""
        if not session.alive:
            raise session.dropped_error()
        tensor = self._table.by_id.get(tensor_id)
        if tensor is None or tensor.owner is not session:
            raise LocalProtocolError(
                f"write to tensor id {tensor_id} that this sender has not claimed"
            )
        ring = tensor.ring
        name = tensor.spec.name
        if generation != self._state.generation:
            raise LocalProtocolError(f"tensor {name!r}: write for stale generation")
        if seq != tensor.expected_seq:
            raise LocalProtocolError(
                f"tensor {name!r}: expected message {tensor.expected_seq}, got {seq}"
            )
        if slot >= ring.depth or ring.seq_at(slot) > tensor.released:
            raise LocalProtocolError(
                f"tensor {name!r}: message {seq} aimed at slot {slot}, which is not "
                f"free (depth {ring.depth}, released {tensor.released})"
            )
        if seq - tensor.released > ring.depth:
            raise LocalProtocolError(
                f"tensor {name!r}: message {seq} overruns the credits "
                f"(released {tensor.released}, depth {ring.depth})"
            )
        if tensor.spec.dynamic:
            if shape is None:
                raise LocalProtocolError(f"tensor {name!r} is dynamic but the header has no shape")
            try:
                nbytes = tensor.spec.check_shape(shape)
            except SpecMismatchError as exc:
                raise LocalProtocolError(str(exc)) from None
        elif shape is not None:
            # A static slot has no room for dims: honouring them would write past its header.
            raise LocalProtocolError(f"tensor {name!r} is static but the header carries a shape")
        else:
            nbytes = tensor.spec.max_bytes
        if header_nbytes != nbytes:
            raise LocalProtocolError(
                f"tensor {name!r}: header says {header_nbytes} bytes, the spec needs {nbytes}"
            )
        return tensor, nbytes

    def land_copy(
        self,
        session: object,
        tensor_id: int,
        slot: int,
        generation: int,
        seq: int,
        payload: memoryview,
        bell: bool = True,
    ) -> bool:
        assert isinstance(session, Session)
        with self._state.lock:
            tensor = self._table.by_id.get(tensor_id)
            if tensor is not None and tensor.ring.device is not None:
                return False  # a GPU slot: staged, then copied on (begin_write, end_write)
            tensor, nbytes = self._check(
                session, tensor_id, slot, generation, seq, len(payload), None
            )
            ring = tensor.ring
            at = ring.payload_offsets[slot]
            ring.region_bytes[at : at + nbytes] = payload  # type: ignore[index]
            _publish(session, tensor, slot, seq, nbytes, None, bell)
        return True

    def landed_fields(
        self, session: object, tensor_id: int, slot: int, generation: int, seq: int, nbytes: int
    ) -> None:
        assert isinstance(session, Session)
        with self._state.lock:
            tensor, _ = self._check(session, tensor_id, slot, generation, seq, nbytes, None)
            _publish(session, tensor, slot, seq, nbytes, None, True)

    def arrived(self, session: object, header: wire.DataHeader, nbytes: int) -> bool:
        tensor = self._table.by_id.get(header.tensor_id)
        if tensor is None or tensor.ring.device is None or tensor.staging is None:
            return False
        _queue_staged(tensor, header.slot, nbytes)  # into the slot while the next part arrives
        return True

    def end_write(self, session: object, header: wire.DataHeader, bell: bool = True) -> None:
        assert isinstance(session, Session)
        tensor = self._table.by_id[header.tensor_id]
        device = tensor.ring.device
        if device is not None and header.nbytes:
            # Into the slot before the completion store (no lock needed: this session's claim
            # and the credits keep every other writer out of the slot, and the consumer does
            # not look at it before the store). What arrived() queued is on the same stream.
            _queue_staged(tensor, header.slot, header.nbytes)
            copier().wait(device)
        with self._state.lock:
            tensor.inflight = None
            self._complete(session, tensor, header, bell)

    def landed(self, session: object, header: wire.DataHeader) -> None:
        assert isinstance(session, Session)
        with self._state.lock:
            tensor, _ = self._check_write(session, header)
            self._complete(session, tensor, header)

    def ring(self) -> None:
        with self._state.lock:
            self._table.wake()

    def _complete(
        self,
        session: Session,
        tensor: RegisteredTensor,
        header: wire.DataHeader,
        bell: bool = True,
    ) -> None:
        _publish(session, tensor, header.slot, header.seq, header.nbytes, header.shape, bell)

    def abort_write(self, session: object, header: wire.DataHeader) -> None:
        with self._state.lock:
            tensor = self._table.by_id.get(header.tensor_id)
            if tensor is not None and tensor.inflight is session:
                tensor.inflight = None

    def disconnected(self, session: object, reason: str | None) -> None:
        assert isinstance(session, Session)
        state = self._state
        with state.lock:
            for tensor in self._table.order:  # its thread stopped writing: the slot is free again
                if tensor.inflight is session:
                    tensor.inflight = None
            session.link = None
            lost = None if reason is None or state.closed else f"data connection ended ({reason})"
            self._sessions.drop(session, lost)


def _publish(
    session: Session,
    tensor: RegisteredTensor,
    slot: int,
    seq: int,
    nbytes: int,
    shape: tuple[int, ...] | None,
    bell: bool,
) -> None:
    """Complete message ``seq`` in ``slot`` (its bytes are there). Under the lock."""
    if tensor.owner is not session:  # dropped while its payload was arriving
        raise session.dropped_error(
            f" while message {seq} of {tensor.spec.name!r} was arriving (not completed)"
        )
    session.last_seen = time.monotonic()
    tensor.ring.publish(slot, seq, nbytes, shape, bell)
    tensor.expected_seq = seq + 1
