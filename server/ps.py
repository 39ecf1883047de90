"""One parameter-server shard: gradients in, optimizer step, fresh parameters out, all one-sided.

The shard registers, for every worker, a gradient tensor per parameter chunk it owns (plus a small
``meta`` tensor: step, loss, accuracy), so every step's traffic is writes into preallocated slots.
It writes updated chunks straight into each worker's registered parameter storage, followed by a
``status`` word (step, run/stop). Consistency:

* ``bsp``: wait for every worker's gradient of step t, average, one update, send to all;
* ``asp``: apply each worker's gradient as soon as it has landed, answer that worker at once;
* ``ssp``: as ``asp``, but a worker more than ``staleness`` steps ahead of the slowest waits.

Built only on the public API of tensorwire.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import tensorwire as tw
from tensorwire import curve
from tensorwire.client import models

from . import checkpoint, optim
from .plan import (
    META_FIELDS,
    STATUS_FIELDS,
    STATUS_RUN,
    STATUS_STOP,
    Chunk,
    grad_name,
    join_name,
    meta_name,
    parse_grad_name,
    plan,
    status_name,
)

log = logging.getLogger("tensorwire.ps")

SYNC_MODES = ("bsp", "asp", "ssp")
#: what gradients and parameters travel as; the server keeps float32 parameters and optimizer
#: state whatever the wire carries (mixed precision: half the bytes per step in 16 bits)
WIRE_DTYPES = ("float32", "bfloat16", "float16")


class PSError(tw.TensorWireError):
    """The parameter server cannot go on (a worker never came, a step timed out, bad setup)."""


class _WorkerLost(Exception):
    """One worker died or hung in the middle of a step."""


@dataclass
class PSConfig:
    bind: str = "tcp://127.0.0.1:5700"
    shard: int = 0
    shards: int = 1
    workers: int = 1
    model: str = "digits"
    steps: int = 300
    sync: str = "bsp"
    staleness: int = 2
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    transport: str = "auto"
    secret: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 50
    resume: bool = False
    join_timeout: float = 60.0
    step_timeout: float = 120.0
    split_bytes: int = 1 << 20
    seed: int = 0
    heartbeat: float = 5.0  # seconds between our heartbeats to each worker
    heartbeat_timeout: float = 30.0  # a worker silent this long is lost
    curve_keys: str | None = None  # directory of the job's CURVE key pair
    nixl: tw.NixlOptions | None = None  # NIXL/UCX settings when transport is "nixl"
    wire_dtype: str = "float32"  # one of WIRE_DTYPES


@dataclass
class StepReport:
    step: int
    loss: float
    accuracy: float | None
    seconds: float


@dataclass
class _Worker:
    rank: int
    address: str = ""
    step: int = 0  # the step whose gradient we expect next
    got: set[str] = field(default_factory=set)
    meta: Any = None
    stopped: bool = False
    alive: bool = True


class ParameterServer:
    def __init__(self, cfg: PSConfig, on_step: Callable[[StepReport], None] | None = None) -> None:
        if cfg.sync not in SYNC_MODES:
            raise PSError(f"unknown sync mode {cfg.sync!r}; choose one of {', '.join(SYNC_MODES)}")
        if not 0 <= cfg.shard < cfg.shards:
            raise PSError(f"shard {cfg.shard} does not exist among {cfg.shards} shards")
        if cfg.workers < 1 or cfg.steps < 0:
            raise PSError("need at least one worker and a non-negative number of steps")
        if cfg.wire_dtype not in WIRE_DTYPES:
            raise PSError(
                f"unknown wire dtype {cfg.wire_dtype!r}; choose one of {', '.join(WIRE_DTYPES)}"
            )
        self.cfg = cfg
        self.on_step = on_step or (lambda report: None)
        spec = models.model(cfg.model)
        self.chunks: list[Chunk] = [
            c for c in plan(spec.shapes(), cfg.shards, cfg.split_bytes) if c.server == cfg.shard
        ]
        init = spec.init(cfg.seed)
        self.params = {c.cid: init[c.param][c.start : c.stop].copy() for c in self.chunks}
        self.opt = optim.make(cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.momentum)
        self.fingerprint = (
            f"{cfg.model}/shards={cfg.shards}/shard={cfg.shard}/split={cfg.split_bytes}/"
            f"{cfg.optimizer}"
        )
        self.step = 0
        self.ckpt = (
            checkpoint.path_for(cfg.checkpoint_dir, cfg.shard) if cfg.checkpoint_dir else None
        )
        if cfg.resume:
            if self.ckpt is None or not os.path.exists(self.ckpt):
                raise PSError(f"--resume: no checkpoint at {self.ckpt or '(no --checkpoint-dir)'}")
            try:
                self.step, params, self.opt.state = checkpoint.load(self.ckpt, self.fingerprint)
            except (ValueError, OSError, KeyError) as exc:
                raise PSError(f"cannot resume: {exc}") from exc
            for cid, value in params.items():
                np.copyto(self.params[cid], value)
            log.info("resumed shard %d from %s at step %d", cfg.shard, self.ckpt, self.step)
        self.acc = {c.cid: np.zeros(c.shape, np.float32) for c in self.chunks}
        # Parameters go out in the wire dtype: converted into these, allocated once.
        self._outgoing = (
            None
            if cfg.wire_dtype == "float32"
            else {
                c.cid: np.empty(c.shape, tw.TensorSpec.create("w", (), cfg.wire_dtype).dtype)
                for c in self.chunks
            }
        )
        self.workers = [_Worker(r, step=self.step) for r in range(cfg.workers)]
        self.losses: list[float] = []
        self.last_accuracy: float | None = None
        self._stop_requested = False
        self.started_at = time.monotonic()
        keys = curve.load(cfg.curve_keys) if cfg.curve_keys else None
        self.rx = tw.Receiver(
            cfg.bind,
            secret=cfg.secret,
            name=f"ps{cfg.shard}",
            heartbeat_timeout=cfg.heartbeat_timeout,
            curve_keys=keys,
            # None: nixl is served on demand if installed; given: started now, with these
            nixl=cfg.nixl,
        )
        self.tx = tw.Sender(
            transport=cfg.transport,
            nixl=cfg.nixl,
            secret=cfg.secret,
            timeout=cfg.step_timeout,
            name=f"ps{cfg.shard}",
            heartbeat=cfg.heartbeat,
            curve_server_key=keys.public if keys else None,
        )
        try:
            for w in range(cfg.workers):
                for c in self.chunks:
                    self.rx.register(grad_name(w, c.cid), c.shape, cfg.wire_dtype)
                self.rx.register(meta_name(w), (META_FIELDS,), "float64")
                self.rx.register(join_name(w), (None,), "uint8", max_bytes=1024)
        except BaseException:
            self.close()
            raise
        self.address = self.rx.address

    # -- lifetime ----------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Finish the current step, checkpoint, tell the workers to stop (signal-safe)."""
        self._stop_requested = True

    def close(self) -> None:
        self.tx.close()
        self.rx.close()

    def __enter__(self) -> ParameterServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- protocol pieces -----------------------------------------------------------------------

    def _join(self) -> None:
        deadline = time.monotonic() + self.cfg.join_timeout
        pending = {w.rank for w in self.workers}
        while pending:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise tw.WireTimeoutError("join timeout")
                name, view = self.rx.wait_any(timeout=min(left, 1.0))
            except tw.WireTimeoutError:
                if time.monotonic() < deadline and not self._stop_requested:
                    continue
                raise PSError(
                    f"workers {', '.join(map(str, sorted(pending)))} of {self.cfg.workers} did "
                    f"not join within {self.cfg.join_timeout:g} s (is each started with "
                    f"--servers {self.address} and its --rank?)"
                ) from None
            rank = int(name.split("/")[1]) if name.startswith("join/") else -1
            if rank not in pending:
                self.rx.release(name)
                raise PSError(f"unexpected {name!r} while workers were joining")
            address = bytes(view).decode()
            self.rx.release(name)
            self.tx.add_peer(address)
            self.workers[rank].address = address
            pending.discard(rank)
            log.info(
                "worker %d joined from %s over %s", rank, address, self.tx.transport_of(address)
            )

    def _send(self, w: _Worker, flags: int) -> None:
        """Fresh parameter chunks, then the status word, into worker ``w``'s memory."""
        for c in self.chunks:
            params = self.params[c.cid]
            if self._outgoing is not None:
                out = self._outgoing[c.cid]
                out[...] = params  # float32 -> the wire dtype, rounding to nearest
                params = out
            self.tx.write(c.cid, params, peer=w.address)
        status = np.array([w.step, flags, self.step, 0], dtype=np.int64)
        assert status.shape == (STATUS_FIELDS,)
        self.tx.write(status_name(self.cfg.shard), status, peer=w.address)
        if flags == STATUS_STOP:
            w.stopped = True

    def _checkpoint(self) -> None:
        if self.ckpt is None:
            return
        os.makedirs(os.path.dirname(self.ckpt) or ".", exist_ok=True)
        checkpoint.save(self.ckpt, self.step, self.params, self.opt.state, self.fingerprint)
        log.info("checkpoint at step %d written to %s", self.step, self.ckpt)

    def _report(self, step: int, losses: list[float], accuracy: float | None, t0: float) -> None:
        loss = float(np.mean(losses)) if losses else float("nan")
        self.losses.append(loss)
        if accuracy is not None:
            self.last_accuracy = accuracy
        self.on_step(StepReport(step, loss, self.last_accuracy, time.monotonic() - t0))

    @staticmethod
    def _accuracy(meta: Any) -> float | None:
        return float(meta[4]) if meta[4] >= 0 else None

    # -- the loops -----------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until every worker has done ``steps`` steps (or a stop was requested)."""
        self._join()
        self.started_at = time.monotonic()  # steps/s counts from here, not from start-up
        for w in self.workers:
            self._send(w, STATUS_STOP if self.step >= self.cfg.steps else STATUS_RUN)
        if self.cfg.sync == "bsp":
            self._run_bsp()
        else:
            self._run_async(10**9 if self.cfg.sync == "asp" else self.cfg.staleness)
        self._checkpoint()

    def _worker_tensors(self, w: _Worker) -> list[str]:
        return [*(grad_name(w.rank, c.cid) for c in self.chunks), meta_name(w.rank)]

    def _lose(self, w: _Worker, reason: str) -> None:
        """Go on without ``w``: forget what it left half sent, stop writing to it."""
        w.alive = False
        log.warning(
            "worker %d lost at step %d (%s); going on with %d worker(s)",
            w.rank,
            self.step,
            reason,
            sum(x.alive for x in self.workers),
        )
        for name in self._worker_tensors(w):
            self.rx.drain(
                name
            )  # its unfinished step, and the loss notice: a successor starts clean
        with contextlib.suppress(tw.TensorWireError):
            self.tx.remove_peer(w.address)

    def _rejoin(self) -> None:
        """Workers (re)started after a loss join at the current step."""
        for w in self.workers:
            if w.alive or not self.rx.pending(join_name(w.rank)):
                continue
            view = self.rx.wait(join_name(w.rank), timeout=0)
            w.address = bytes(view).decode()
            self.rx.release(join_name(w.rank))
            self.tx.add_peer(w.address)
            w.alive, w.step = True, self.step
            log.warning("worker %d rejoined from %s at step %d", w.rank, w.address, self.step)

    def _collect(self, w: _Worker) -> tuple[dict[str, Any], list[str]]:
        """All of ``w``'s gradient chunks and its meta for this step, held (not yet released)."""
        got: dict[str, Any] = {}
        try:
            for name in self._worker_tensors(w):
                try:
                    got[name] = self.rx.wait(name, timeout=self.cfg.step_timeout)
                except tw.PeerLostError as exc:
                    raise _WorkerLost(str(exc)) from None
                except tw.WireTimeoutError:
                    raise _WorkerLost(f"nothing for {self.cfg.step_timeout:g} s") from None
        except _WorkerLost:
            for name in got:
                self.rx.release(name)
            raise
        return got, list(got)

    def _run_bsp(self) -> None:
        while self.step < self.cfg.steps:
            t0 = time.monotonic()
            losses, accuracy = [], None
            contributors = 0
            for w in self.workers:
                if not w.alive:
                    continue
                try:
                    got, held = self._collect(w)
                except _WorkerLost as exc:
                    self._lose(w, str(exc))
                    continue
                meta = got[meta_name(w.rank)]
                if int(meta[0]) != self.step:
                    raise PSError(f"worker {w.rank} sent step {int(meta[0])}, expected {self.step}")
                for c in self.chunks:
                    grad = got[grad_name(w.rank, c.cid)]
                    if contributors == 0:
                        np.copyto(self.acc[c.cid], grad)
                    else:
                        self.acc[c.cid] += grad
                contributors += 1
                losses.append(float(meta[1]))
                accuracy = self._accuracy(meta) if accuracy is None else accuracy
                for name in held:
                    self.rx.release(name)
            if contributors:
                # The average over the workers that finished the step: a lost worker's share
                # is rescaled away, not counted as zero.
                for c in self.chunks:
                    self.opt.step(
                        c.cid, self.params[c.cid], self.acc[c.cid], scale=1.0 / contributors
                    )
                self.step += 1
                if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
                    self._checkpoint()
            self._rejoin()
            if not any(w.alive for w in self.workers):
                self._await_any_worker()
            for w in self.workers:
                w.step = self.step
            done = self.step >= self.cfg.steps or self._stop_requested
            for w in self.workers:
                if w.alive:
                    try:
                        self._send(w, STATUS_STOP if done else STATUS_RUN)
                    except tw.PeerLostError as exc:
                        self._lose(w, str(exc))
            if contributors:
                self._report(self.step, losses, accuracy, t0)
            if done:
                break

    def _await_any_worker(self) -> None:
        deadline = time.monotonic() + self.cfg.step_timeout
        while not any(w.alive for w in self.workers):
            if time.monotonic() > deadline or self._stop_requested:
                raise PSError(
                    f"every worker was lost and none came back within {self.cfg.step_timeout:g} s"
                )
            time.sleep(0.1)
            self._rejoin()

    def _run_async(self, staleness: int) -> None:
        by_rank = {w.rank: w for w in self.workers}
        expected = {grad_name(0, c.cid).split("/", 2)[2] for c in self.chunks} | {"meta"}
        held: list[_Worker] = []
        t0 = time.monotonic()
        while not all(w.stopped for w in self.workers):
            try:
                name, view = self.rx.wait_any(timeout=self.cfg.step_timeout)
            except tw.WireTimeoutError:
                waiting = [w.rank for w in self.workers if not w.stopped and w not in held]
                raise PSError(
                    f"workers {waiting} sent nothing for {self.cfg.step_timeout:g} s"
                ) from None
            except tw.PeerLostError as exc:
                raise PSError(
                    f"a worker was lost ({exc}); only --sync bsp goes on without it"
                ) from None
            parsed = parse_grad_name(name)
            if parsed is not None:
                rank, param, part = parsed
                cid = f"{param}@{part}"
                # Applied as it lands: the gradient of one worker, one chunk, one step.
                np.copyto(self.acc[cid], view)
                self.opt.step(cid, self.params[cid], self.acc[cid])
                w = by_rank[rank]
                w.got.add(cid)
            elif name.startswith("meta/"):
                w = by_rank[int(name.split("/")[1])]
                w.meta = view.copy()
                w.got.add("meta")
            else:
                self.rx.release(name)
                continue
            self.rx.release(name)
            if w.got != expected:
                continue
            w.got = set()
            w.step += 1
            floor = min(x.step for x in self.workers)
            if floor > self.step:  # the slowest worker finished a step: that is a global step
                self.step = floor
                if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
                    self._checkpoint()
            self._report(w.step, [float(w.meta[1])], self._accuracy(w.meta), t0)
            t0 = time.monotonic()
            held.append(w)
            floor = min(x.step for x in self.workers)
            for h in list(held):
                if h.step >= self.cfg.steps or self._stop_requested:
                    self._send(h, STATUS_STOP)
                    held.remove(h)
                elif h.step - floor <= staleness:
                    self._send(h, STATUS_RUN)
                    held.remove(h)
