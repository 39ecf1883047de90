"""Random sequences of the API's calls, two senders and one receiver, against a model of what
each call must do: every message handed out once, in its tensor's order, with the bytes and
shape it was written with; a slot the consumer holds never written over (every view held is
checked after every call); no write without a credit; a tensor written by one sender refused
to the other until the first ends its session (then either may take it over, and its sequence
goes on); a bad array refused; a wait for nothing landed ends by its timeout, or says that
every slot is held.

The calls are drawn from writes (alone, batched, produced in place, from a non-contiguous
array), waits (one tensor, any, all, each), releases (one, many), ``pending``, and a new
session of a sender (``remove_peer`` and ``add_peer``), over static and dynamic tensors of
several dtypes and ring depths. Every end runs in the test's thread: a call's answer may need
the other side's next call only where the transport delivers by itself (credits, landings).
Then four threads draw theirs at once, each with tensors of its own, on the same receiver and
senders.
"""

from __future__ import annotations

import random
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import tensorwire as tw

#: calls per run, and how often each kind is drawn
CALLS = 600
DRAWS = (
    ["write"] * 2
    + ["write_many", "buffer", "non_contiguous", "bad_shape", "no_credit"]
    + ["wait"] * 2
    + ["wait_any", "wait_all", "wait_each"]
    + ["release"] * 2
    + ["release_many", "pending", "new_session", "not_the_writer"]
)
#: what threads sharing both ends draw, each with tensors of its own: not the calls whose
#: model spans every tensor (wait_any, pending's count, a new session ending every claim)
SHARED_DRAWS = [d for d in DRAWS if d not in ("wait_any", "pending", "new_session")]
THREADS = 4
#: a wait for a message that was written (it may still be on its way)
LANDS_WITHIN = 10.0


def content(name: str, seq: int, shape: tuple[int, ...], dtype: str) -> np.ndarray[Any, Any]:
    """Message ``seq`` of tensor ``name``: values every dtype here holds exactly."""
    size = int(np.prod(shape)) if shape else 1
    base = (np.arange(size, dtype=np.int64) * 7 + seq * 13 + zlib.crc32(name.encode())) % 97
    return base.astype(dtype).reshape(shape)


@dataclass
class Tensor:
    """What the model knows of one registered tensor."""

    static: tuple[int, ...] | None  # None: dynamic, (rows, cols) with rows drawn
    cols: int
    dtype: str
    ring: int
    sent: list[tuple[int, ...]] = field(default_factory=list)  # each message's shape
    read: int = 0  # handed out
    released: int = 0
    held: list[tuple[int, Any]] = field(default_factory=list)  # (seq, view), oldest first
    writer: int | None = None  # the sender whose session holds its claim (it wrote it)

    def has_credit(self) -> bool:
        return len(self.sent) - self.released < self.ring

    def waiting(self) -> bool:
        return len(self.sent) > self.read


class Run:
    """One random run: the receiver's tensors, the senders, and the model of them all."""

    def __init__(
        self, rx: tw.Receiver, txs: list[tw.Sender], transport: str, seed: int, prefix: str = ""
    ) -> None:
        self.rx, self.txs, self.transport = rx, txs, transport
        self.rnd = random.Random(seed)
        self.tensors: dict[str, Tensor] = {}
        for i in range(self.rnd.randint(2, 5)):
            dtype = self.rnd.choice(["float32", "int64", "uint8", "float16", "int32", "float64"])
            ring = self.rnd.randint(1, 4)
            if self.rnd.random() < 0.3:
                cols = self.rnd.randint(1, 6)
                itemsize = np.dtype(dtype).itemsize
                name = f"{prefix}d{i}"
                rx.register(name, (None, cols), dtype, max_bytes=8 * cols * itemsize, ring=ring)
                self.tensors[name] = Tensor(None, cols, dtype, ring)
            else:
                shape = tuple(self.rnd.randint(1, 5) for _ in range(self.rnd.randint(0, 3)))
                rx.register(f"{prefix}s{i}", shape, dtype, ring=ring)
                self.tensors[f"{prefix}s{i}"] = Tensor(shape, 0, dtype, ring)

    def shape_of_next(self, t: Tensor) -> tuple[int, ...]:
        return t.static if t.static is not None else (self.rnd.randint(0, 8), t.cols)

    def next_message(self, name: str) -> tuple[np.ndarray[Any, Any], tuple[int, ...]]:
        t = self.tensors[name]
        shape = self.shape_of_next(t)
        return content(name, len(t.sent), shape, t.dtype), shape

    def check(self, name: str, seq: int, view: Any) -> None:
        t = self.tensors[name]
        want = content(name, seq, t.sent[seq], t.dtype)
        assert view.shape == want.shape, (name, seq, view.shape, want.shape)
        assert np.array_equal(np.asarray(view), want), f"{name} message {seq}: other bytes"

    def take(self, name: str, view: Any) -> None:
        t = self.tensors[name]
        self.check(name, t.read, view)
        t.held.append((t.read, view))
        t.read += 1

    def give_back(self, name: str) -> None:
        t = self.tensors[name]
        t.held.pop(0)
        t.released += 1

    def writer_of(self, t: Tensor) -> int:
        """The sender that writes ``t`` next: the one holding its claim, else one drawn (its
        write claims the tensor)."""
        return t.writer if t.writer is not None else self.rnd.randrange(len(self.txs))

    def step(self, call: str) -> None:
        rnd, rx = self.rnd, self.rx
        names = list(self.tensors)
        name = rnd.choice(names)
        t = self.tensors[name]
        writer = self.writer_of(t)
        tx = self.txs[writer]
        if call == "write" and t.has_credit():
            array, shape = self.next_message(name)
            tx.write(name, array)
            t.sent.append(shape)
            t.writer = writer
        elif call == "write_many":  # (of the tensors the drawn tensor's writer writes)
            batch = {}
            for n in names:
                other = self.tensors[n]
                if other.writer in (writer, None) and other.has_credit() and rnd.random() < 0.7:
                    batch[n], shape = self.next_message(n)
                    other.sent.append(shape)
            if batch:
                tx.write_many(batch)
                for n in batch:
                    self.tensors[n].writer = writer
        elif call == "buffer" and t.has_credit():
            array, shape = self.next_message(name)
            with tx.buffer(name, **({"shape": shape} if t.static is None else {})) as out:
                out[...] = array
            t.sent.append(shape)
            t.writer = writer
        elif call == "non_contiguous" and t.has_credit():
            array, shape = self.next_message(name)
            wider = np.zeros((*shape, 2), array.dtype)
            wider[..., 1] = array
            strided = wider[..., 1]
            if strided.size > 1:
                with pytest.raises(tw.SpecMismatchError):
                    tx.write(name, strided)  # (a copy only where asked for)
            tx.write(name, strided, allow_copy=True)
            t.sent.append(shape)
            t.writer = writer
        elif call == "bad_shape":
            with pytest.raises(tw.SpecMismatchError):
                tx.write(name, np.zeros((3, 99), t.dtype), timeout=0)
        elif call == "no_credit" and not t.has_credit() and t.writer is not None:
            with pytest.raises(tw.WireTimeoutError):
                tx.write(name, self.next_message(name)[0], timeout=0)
        elif call == "wait":
            if t.waiting():
                self.take(name, rx.wait(name, timeout=LANDS_WITHIN))
            elif len(t.held) < t.ring:
                with pytest.raises(tw.WireTimeoutError):
                    rx.wait(name, timeout=0)
            else:
                with pytest.raises(tw.TensorWireError, match="held by the consumer"):
                    rx.wait(name, timeout=0)
        elif call == "wait_any" and any(self.tensors[n].waiting() for n in names):
            got, view = rx.wait_any(timeout=LANDS_WITHIN)
            assert self.tensors[got].waiting(), f"wait_any handed out {got}, never written"
            self.take(got, view)
        elif call == "wait_all":
            wanted = [n for n in names if self.tensors[n].waiting() and rnd.random() < 0.7]
            if wanted:
                views = rx.wait_all(wanted, timeout=LANDS_WITHIN)
                assert sorted(views) == sorted(wanted)
                for n in wanted:
                    self.take(n, views[n])
        elif call == "wait_each":
            wanted = [n for n in names if self.tensors[n].waiting() and rnd.random() < 0.7]
            if wanted:
                seen = []
                for n, view in rx.wait_each(wanted, timeout=LANDS_WITHIN):
                    seen.append(n)
                    self.take(n, view)
                assert sorted(seen) == sorted(wanted)
        elif call == "release":
            if t.held:
                rx.release(name)
                self.give_back(name)
            else:
                with pytest.raises(tw.TensorWireError):
                    rx.release(name)
        elif call == "release_many":
            chosen = [n for n in names if self.tensors[n].held and rnd.random() < 0.6]
            if chosen:
                rx.release_many(chosen)
                for n in chosen:
                    self.give_back(n)
        elif call == "pending":
            for n in names:
                landed, written = rx.pending(n), len(self.tensors[n].sent) - self.tensors[n].read
                # (over shm a write has landed when it returns; elsewhere it may be on its way)
                assert landed == written if self.transport == "shm" else 0 <= landed <= written
        elif call == "not_the_writer" and t.writer is not None:
            other = self.txs[1 - t.writer]
            with pytest.raises(tw.RemoteProtocolError, match="already written by") as refused:
                other.write(name, self.next_message(name)[0], timeout=LANDS_WITHIN)
            assert refused.value.code == "busy"
        elif call == "new_session" and rnd.random() < 0.3:
            # its claims end with it (a goodbye): either sender may take each tensor over
            which = rnd.randrange(len(self.txs))
            self.txs[which].remove_peer(rx.address)
            self.txs[which].add_peer(rx.address)
            for other in self.tensors.values():
                if other.writer == which:
                    other.writer = None
        for n, tensor in self.tensors.items():  # no held slot was written over
            for seq, view in tensor.held:
                self.check(n, seq, view)

    def finish(self) -> int:
        """Take and release what is left; the number of messages the run wrote."""
        for name, t in self.tensors.items():
            while t.waiting():
                self.take(name, self.rx.wait(name, timeout=LANDS_WITHIN))
            while t.held:
                self.rx.release(name)
                self.give_back(name)
            assert self.rx.pending(name) == 0
        return sum(len(t.sent) for t in self.tensors.values())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_calls_keep_every_contract(transport: str, seed: int) -> None:
    with (
        tw.Receiver() as rx,
        tw.Sender.connect(rx.address, transport=transport, timeout=30) as a,
        tw.Sender.connect(rx.address, transport=transport, timeout=30) as b,
    ):
        run = Run(rx, [a, b], transport, seed)
        for _ in range(CALLS):
            run.step(run.rnd.choice(DRAWS))
        assert run.finish() > CALLS // 10  # (the draws wrote: not a run of refusals)


def test_random_calls_from_threads_sharing_both_ends(transport: str) -> None:
    """Four threads, each with tensors of its own, draw their calls at once on one receiver and
    the same two senders (their locks, the slots a write waits for and gives way on, one
    connection per receiver): each thread's model holds as it does alone."""
    failures: list[BaseException] = []
    with (
        tw.Receiver() as rx,
        tw.Sender.connect(rx.address, transport=transport, timeout=30) as a,
        tw.Sender.connect(rx.address, transport=transport, timeout=30) as b,
    ):
        runs = [Run(rx, [a, b], transport, 10 + k, prefix=f"t{k}.") for k in range(THREADS)]
        written = [0] * THREADS

        def calls(k: int) -> None:
            try:
                for _ in range(CALLS):
                    runs[k].step(runs[k].rnd.choice(SHARED_DRAWS))
                written[k] = runs[k].finish()
            except BaseException as exc:  # (the test's thread says it)
                failures.append(exc)

        threads = [threading.Thread(target=calls, args=(k,)) for k in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), "a thread's calls hung"
    if failures:
        raise failures[0]
    assert all(n > CALLS // 10 for n in written), written
