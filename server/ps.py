"""One parameter-server shard: gradients in, optimizer step, fresh parameters out, all one-sided.

The shard registers, for every worker, a gradient tensor per parameter chunk it owns (plus a small
``meta`` tensor: step, loss, accuracy, and which chunks carry a gradient), so every step's traffic
is writes into preallocated slots.
It writes updated chunks straight into each worker's registered parameter storage, followed by a
``status`` word (step, run/stop). Consistency:

* ``bsp``: wait for every worker's gradient of step t, average, one update, send to all;
* ``asp``: apply each worker's gradient as soon as it has landed, answer that worker at once;
* ``ssp``: as ``asp``, but a worker more than ``staleness`` steps ahead of the slowest waits.

Built only on the public API of tensorwire.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import math
import os
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import tensorwire as tw
from tensorwire import curve
from tensorwire import region as tw_region
from tensorwire.job.norms import clip_coefficient, squared_norm
from tensorwire.job.plan import (
    ENDED_FIELDS,
    ENDED_JOB_DONE,
    HOW_ASYNC,
    HOW_MAY_CATCH_UP,
    JOIN_MAX_BYTES,
    LEAVE_ALONE,
    LEAVE_JOB_STOPS,
    LEAVE_MAX_BYTES,
    LEAVE_TO_RETURN,
    META_FIELDS,
    META_SQUARES,
    NORM_FIELDS,
    STATUS_DROPPED,
    STATUS_FAILED,
    STATUS_FIELDS,
    STATUS_HOW,
    STATUS_RUN,
    STATUS_STOP,
    WORKER_KINDS,
    Chunk,
    Pack,
    Specs,
    catch_up_name,
    decode_join,
    dropped_name,
    ended_name,
    first_mismatch,
    fixed_name,
    flag_slots,
    grad_name,
    init_name,
    job_info,
    join_name,
    leave_name,
    leave_session,
    meta_name,
    norm_name,
    norm_total_name,
    packs,
    plan,
    probe_name,
    status_name,
)
from tensorwire.job.wire16 import narrow_into, widen_into
from tensorwire.job.words import wait_past_losses

from . import checkpoint, optim
from .placement import Placement

log = logging.getLogger("tensorwire.ps")

SYNC_MODES = ("bsp", "asp", "ssp")
#: what gradients and parameters travel as; the server keeps float32 parameters and optimizer
#: state whatever the wire carries (mixed precision: half the bytes per step in 16 bits)
WIRE_DTYPES = ("float32", "bfloat16", "float16")
#: (asp, ssp) the rate at which each worker's gradient is applied as it lands. "mean": --lr
#: divided by --workers, so that a round in which every worker pushed once moves the parameters
#: as far as one bsp step of their mean gradient, and --lr means the same in every mode. "each":
#: every push at the full --lr (Downpour SGD's rule): N workers take N steps a round, which
#: with momentum or adam at a rate tuned for bsp left the digits MLP near chance (0.08-0.38
#: after 3000-4000 steps of 3 workers at --lr 0.1, where bsp and "mean" reached 0.98-0.99)
ASYNC_LR = ("mean", "each")


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB" if nbytes >= 1 << 30 else f"{nbytes >> 20} MiB"


#: Runs of ranks a message lists before it says how many more there are
RANK_RUNS_LISTED = 8


def _ranks(ranks: list[int]) -> str:
    """Workers by rank, in runs: "workers 0-2, 5 and 7-4999" (before, one number each: a
    server for 5000 workers that none joined wrote 24 KB in its one-line error)."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    listed, rest = runs[:RANK_RUNS_LISTED], runs[RANK_RUNS_LISTED:]
    shown = [f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in listed]
    if rest:
        shown.append(f"{sum(hi - lo + 1 for lo, hi in rest)} more")
    head = "worker" if len(ranks) == 1 else "workers"
    text = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"
    return f"{head} {text}"


class PSError(tw.TensorWireError):
    """The parameter server cannot go on (a worker never came, a step timed out, bad setup)."""


def _refused(exc: tw.RemoteProtocolError) -> str:
    """Why a worker is lost whose receiver refused our write: most often ("busy") an earlier
    session of ours there still holds the tensor (its goodbye has not reached it yet), which
    the receiver ends at its heartbeat timeout. The worker is told, or, where the notice is
    refused too, told when it asks (its probes); a server that exited here (it did, on a
    chaos run) ended the whole job for one worker's state."""
    return f"its receiver refused our parameters ({exc})"


#: Seconds the notice to a dropped worker (STATUS_DROPPED) may take: best effort, as the worker
#: may be dead or frozen, and the step of every other worker waits for it.
DROP_NOTICE_TIMEOUT = 2.0
#: Seconds the notice that we stop (STATUS_STOP) may take to reach a worker we let go of while
#: stopping: shorter, as the stop's grace has run already and every such worker adds its own
#: (a frozen worker takes a notice without answering, but over grpc a write needs it to).
STOP_NOTICE_TIMEOUT = 0.5
#: Seconds the handshake with a worker that just joined may take: its receiver answers at once
#: (the worker is waiting for us), so one that does not is unreachable at the address it gave
#: (a wrong --advertise, a firewall) or died since, and every other worker waits meanwhile.
#: Before, the handshake had --step-timeout (120 s by default).
JOIN_CONNECT_TIMEOUT = 10.0
#: The same as we stop (and within --stop-grace)
STOP_JOIN_CONNECT_TIMEOUT = 2.0
#: (while the job forms) Seconds each new try of the handshake with a worker whose address took
#: the connection and did not answer (stopped just after its join) may take: one that runs
#: again answers at once, and every other join waits meanwhile.
SILENT_RETRY_TIMEOUT = 1.0
#: Seconds between looks, while a step waits for a worker's gradients, at whether that worker
#: joined again (restarted before its loss was seen, or dropped by another server).
REJOIN_CHECK_EVERY = 1.0
#: (bsp) Seconds the workers still owed a step's gradients have at least, once per step, after
#: the server went on without one: with several servers, a worker's gradients may be late only
#: because it waits for another server's parameters, and that server for the same lost worker
#: (it times out a step behind, a few ms before us). Counted from the same deadline, it was
#: dropped with the lost one (a suite run: `test_ps.py -k tells_a_frozen_worker`, two
#: servers, the worker that was not frozen told it was dropped). At most --step-timeout.
LOSS_GRACE = 0.5
#: Times in a row a worker is lost past --step-timeout within a step of joining before the log
#: says its steps take longer than that timeout (once a streak)
QUICK_LOSSES = 3
#: Seconds between rounds of a step in which every worker taking part is on probation (each
#: joined again and has pushed nothing since), so that such a round is not a busy loop.
PROBATION_POLL = 1e-3
#: Slots of a worker's ``probe`` tensor: a worker writes one every PROBE_EVERY (2 s) that it
#: waits, and we read them at least every step and every REJOIN_CHECK_EVERY, so they fill only
#: while we are held up elsewhere for longer (the worker then skips its probe, see PSClient)
PROBE_SLOTS = 4
#: Slots of a worker's ``join`` tensor, JOIN_MAX_BYTES of memory each: it carries the worker's
#: join, then that it is ready, and we take each as it lands (released at once), so one is
#: enough. Two, as a receiver picks for a tensor that large, took 2 MiB per worker before the
#: job had started: 2.8 GB of memory and 5.8 s to start a server for 1000 workers.
JOIN_SLOTS = 1
#: Past this much memory for the workers' join slots, the server says what it is setting up
#: before it does (a server for 1000 workers, 1 GiB of them, started in 3.1 s here)
LARGE_JOIN_BYTES = 256 << 20
#: Once a stop is asked, the step in flight waits at most this long (--stop-grace; this is its
#: default) for the gradients still to come (or STOP_GRACE_STEPS times the mean step so far,
#: where steps are slower; never more than --step-timeout); then it goes on without the
#: workers not heard from (each told in a notice that we stop, best effort), and the server
#: checkpoints and exits. A frozen or stuck worker would otherwise hold the stop until its
#: heartbeats time out (--heartbeat-timeout, 30 s by default; measured: 29.5 s) or for
#: --step-timeout, whichever comes first: past an orchestrator's grace period (Kubernetes
#: gives 30 s, then SIGKILL), and the final checkpoint would be lost.
STOP_GRACE = 5.0
#: Seconds a write of parameters may wait for the worker's slot before they are owed
#: instead (ParameterServer._offer): enough for a release under way to end, so that a worker's
#: parameters go whole or not at all, and short enough that the other workers barely notice.
OFFER_TIMEOUT = 0.05
#: (--clip-grad-norm over several shards) Seconds a write of the shard's squared norm may wait
#: for a worker taking part (over grpc a write is a call the worker answers: milliseconds on a
#: loaded host); one on probation, which may not be reading them yet, gets OFFER_TIMEOUT
NORM_WRITE_TIMEOUT = 0.5
#: (--clip-grad-norm over several shards) Seconds between the looks of a wait for the norms'
#: sum at the workers it waits for (a leave, a join anew, a loss; a stop asked)
NORM_LOOK = 0.1
#: (asp, ssp) Seconds between tries of owed parameters: each may wait OFFER_TIMEOUT for the
#: worker's slot, during which the server reads nothing else, so while a worker owes (frozen,
#: for up to --step-timeout) the others lose a sixth of the server's time at most
OWED_RETRY = 0.25
#: The most threads that write a bsp step's parameters to its workers at once (--serve-threads
#: 0): each copies at memory speed, and more than a few share the memory's bandwidth.
MAX_SERVE_THREADS = 8
#: transports whose every write is a call the receiver answers (its slot free or not): there a
#: write of parameters that times out may have sent a part of them, so none is owed
CALL_TRANSPORTS = ("grpc", "grpc-stream")
#: seconds between the error lines of checkpoints that keep failing (one every
#: --checkpoint-every steps would flood the log: 40 a second measured with a small model)
CHECKPOINT_ERROR_EVERY = 60.0
STOP_GRACE_STEPS = 3


#: why a worker left, as its leave message says (plan.LEAVE_*), for the log
_WHY_LEFT = {
    LEAVE_ALONE: "it stopped on its own: stopped, or failed",
    LEAVE_JOB_STOPS: "another server said stop",
    LEAVE_TO_RETURN: "it was stopped, to be started again: waited for",
}


def fixed_mismatch(job: str | None, theirs: str | None) -> str | None:
    """How a joining worker's frozen parameters (``theirs``: their digest, plan.encode_join)
    differ from the job's, in words; None where they agree. No server keeps them, so each
    worker builds its own."""
    if theirs == job:
        return None
    if theirs is None:
        return "it has no frozen parameters, and the job's model has some"
    if job is None:
        return "it has frozen parameters, and the job's model has none"
    return (
        f"its frozen parameters differ from the job's (digest {theirs}, not {job}): build "
        "them the same on every worker (seed the factory, or load the same weights)"
    )


class _Departing(Exception):
    """This server goes away, to be started again (:meth:`ParameterServer.request_departure`)."""


class _WorkerLeft(Exception):
    """A worker said it stops (another server said stop, or it was stopped itself)."""


class _CatchUp(Exception):
    """Workers asked this server to go on at the job's ``step``: it was restarted alone, or
    it is a step behind the others with no worker that will push its step's gradients."""

    def __init__(self, step: int) -> None:
        super().__init__(step)
        self.step = step


class _NoSum(Exception):
    """(--clip-grad-norm over several shards) No worker gave the sum of the servers' norms
    within --step-timeout (ParameterServer._global_squares)."""


class _WorkerLost(Exception):
    """One worker died or hung in the middle of a step; ``tell``: whether it may still run and
    wait for us, so it is sent STATUS_DROPPED."""

    def __init__(self, reason: str, *, tell: bool = True, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.tell = tell
        self.timed_out = timed_out  # past --step-timeout


@dataclass(frozen=True)
class _Notice:
    """How a notice to a worker went (ParameterServer._notify)."""

    told: bool
    #: not told, and it may be later: frozen (the write timed out), or an earlier session of
    #: ours still held its tensor; it keeps its session for the notice it asks for
    later: bool
    why: str = ""  # the error, where not told


@dataclass
class PSConfig:
    bind: str = "tcp://127.0.0.1:5700"
    shard: int = 0
    shards: int = 1
    workers: int = 1
    steps: int = 300
    sync: str = "bsp"
    staleness: int = 2
    async_lr: str = "mean"  # one of ASYNC_LR
    optimizer: str = "sgd"
    lr: float | None = None  # None: the optimizer's own default (optim.DEFAULT_LR)
    momentum: float = 0.9
    weight_decay: float = 0.0
    #: how --lr moves over the job's --steps (optim.SCHEDULES), after warmup_steps rising to it
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    #: (bsp, one shard) the largest global norm of a step's mean gradient: one above it is
    #: scaled down to it, as torch.nn.utils.clip_grad_norm_ does; None: no clipping
    clip_grad_norm: float | None = None
    transport: str = "auto"
    secret: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 50
    resume: bool = False
    join_timeout: float = 60.0
    step_timeout: float = 120.0
    #: what a stop gives the step in flight, the notices that we stop and our last parameters
    #: (STOP_GRACE)
    stop_grace: float = STOP_GRACE
    split_bytes: int = 1 << 20
    #: whole parameters smaller than this travel together, in packs of at most split_bytes
    #: (plan.packs): one message each way for many small tensors; 0: each travels alone. 256
    #: KiB: the best of 16, 64 and 256 KiB on every transport (`bench ps --model many`)
    pack_bytes: int = 1 << 18
    seed: int = 0
    heartbeat: float = 5.0  # seconds between our heartbeats to each worker
    heartbeat_timeout: float = 30.0  # a worker silent this long is lost
    curve_keys: str | None = None  # directory of the job's CURVE key pair
    nixl: tw.NixlOptions | None = None  # NIXL/UCX settings when transport is "nixl"
    shm: bool | None = None  # tw.Receiver's: False keeps the slots in private memory
    wire_dtype: str = "float32"  # one of WIRE_DTYPES
    #: where the shard's parameters, gradient slots and optimizer state live: cpu, cuda, cuda:N
    device: str = "cpu"
    #: (bsp) threads that write a step's parameters to the workers at once; 0: one per worker,
    #: up to the machine's cores and MAX_SERVE_THREADS; 1 (the default): one worker after
    #: another. At once pays for large models (25 MB: writes 14-38 % shorter) and costs small
    #: ones over shm (the demo's: 12-40 % fewer steps/s), docs/serve-threads-2026-12-03/
    serve_threads: int = 1


@dataclass
class StepReport:
    step: int
    loss: float
    #: the latest test accuracy rank 0 measured (every --eval-every steps), and the step of the
    #: parameters it measured
    accuracy: float | None
    seconds: float
    accuracy_step: int | None = None


@dataclass
class PSStats:
    """What the shard has done, as plain numbers (read by :mod:`.metrics` when scraped)."""

    steps: int = 0  # steps done since the daemon started (the step number may start higher)
    step_seconds: float = 0.0  # their total duration
    #: the longest of them: a worker lost (--step-timeout), a straggler, a checkpoint
    longest_step: float = 0.0
    loss: float = float("nan")
    accuracy: float | None = None
    #: (--clip-grad-norm) steps whose mean gradient was scaled down (asp, ssp: pushes)
    clipped: int = 0
    #: (--clip-grad-norm over several shards) steps clipped by this shard's own norm, as no
    #: worker gave the servers' sum (every worker lost or joining again meanwhile)
    clipped_alone: int = 0
    #: per worker rank: seconds a BSP step spent waiting for that worker's gradients after the
    #: workers before it had sent theirs (the straggler's figure grows fastest)
    gradient_wait: dict[int, float] = field(default_factory=dict)
    #: (bsp) the steps' writes of parameters to the workers taking part (_serve_all): how many
    #: rounds, and their seconds
    serves: int = 0
    serve_seconds: float = 0.0
    checkpoints: int = 0
    checkpoint_seconds: float = 0.0
    checkpoint_failures: int = 0  # writes that failed (a full disk): logged, and trained on
    #: steps skipped to catch up with the job's other servers (restarted alone, see
    #: ParameterServer._catch_up)
    caught_up: int = 0
    #: worker events: "joined", "lost", "rejoined", "left"
    worker_events: dict[str, int] = field(
        default_factory=lambda: {"joined": 0, "lost": 0, "rejoined": 0, "left": 0}
    )


@dataclass
class _Worker:
    rank: int
    address: str = ""
    step: int = 0  # the step whose gradient we expect next
    got: set[str] = field(default_factory=set)
    meta: Any = None
    #: (asp, ssp) chunks of its step that landed as zeros before its meta, which says whether
    #: they are a gradient (stepped then) or none (left alone)
    deferred: set[str] = field(default_factory=set)
    #: (asp, ssp, --clip-grad-norm) its push's gradients that landed before its meta, whose
    #: norm they are clipped by: held in their slots until it comes (the tensor's name, the
    #: chunk or pack, the view)
    unclipped: list[tuple[str, str, Any]] = field(default_factory=list)
    #: (asp, ssp) what its push's gradients are multiplied by: below 1 where --clip-grad-norm
    #: clips it (from its meta's norm)
    scale: float = 1.0
    #: sent our STATUS_STOP (with parameters, or in a notice once we let it go), or it left:
    #: nothing more to tell it as we stop
    stopped: bool = False
    alive: bool = False  # joined and ready, and not lost since
    joined: bool = False  # its join (address, specs) arrived; alive once it says it is ready
    #: (while the job forms) why it is known gone after it joined and before it got ready
    #: (said once); a worker started again in its place joins as ever
    lost_joining: str | None = None
    #: (while the job forms) the address its join named, which took our connection and did not
    #: answer (the worker stopped just after its join: SIGSTOP, Ctrl-Z, a paused container):
    #: tried again until it answers, it joins again, or --join-timeout
    silent_at: str | None = None
    silent_tried: float = 0.0  # (monotonic) when that handshake was last tried
    #: the session its last join named (plan.new_session), which its leave names too: a
    #: leave of another is an earlier process's, passed over; None from an older worker
    session: int | None = None
    #: why it left, from a leave of its session taken off the ring and not yet acted on
    #: (:meth:`_leave_pending`)
    leaving: int | None = None
    #: why its last join was refused (its model differs from the job's), until one is taken:
    #: its ready message is not heeded meanwhile, and the job's failure to form says why
    refused: str | None = None
    #: rejoined, and no gradients of it seen since: not waited for (see ParameterServer._collect)
    probation: bool = False
    #: its steps' gradients taken since it last joined
    pushed: int = 0
    #: the times in a row it was lost past --step-timeout within a step of joining (said once
    #: it reaches QUICK_LOSSES: its steps take longer than that timeout allows)
    quick_losses: int = 0
    #: dropped, and the notice timed out (frozen, or over grpc): its session is kept, to tell
    #: it when it asks (ParameterServer._answer_probes)
    untold: bool = False
    #: (asp, ssp) when we last heard from it, or let it go on: silent for --step-timeout
    #: after that, it is lost
    heard: float = field(default_factory=time.monotonic)
    #: (bsp) the step whose parameters it was last sent: a round in which no worker pushed a
    #: gradient sends them to nobody again (a duplicate fills the worker's one slot, and the
    #: worker skipping to another server's step would take it for a new one)
    served: int | None = None
    #: the flags of parameters owed to it, which its slot could not take yet (it still held
    #: the last ones: waiting on another server, or holding ours from before it joined again),
    #: and since when: sent once the slot is free (asp, ssp: by _pay_owed; bsp, on probation:
    #: at each step), lost after --step-timeout
    owed: int | None = None
    owed_since: float = 0.0
    owed_next: float = 0.0  # when to try them again
    #: (asp, ssp; resumed) it did all its steps before the checkpoint we resumed from, and has
    #: exited: the job forms again without it
    finished: bool = False
    #: it left on its own (plan.LEAVE_ALONE: stopped by itself, its node drained, while the job
    #: trains on) and has not joined again: its step no longer holds the job's (asp, ssp), and
    #: checkpoints record it, so that a server restarted from one does not wait for it
    left: bool = False
    #: (resumed) it was not taking part at the checkpoint we resumed from (it had left, or
    #: was lost and had not joined again): the job forms again without it, and takes it back
    #: when it joins again
    absent: bool = False
    #: the step another server gave it as it told it to stop, as it wrote us (plan.ended_name)
    #: before its leave; None until then, and from an older worker
    told_end: int | None = None
    #: ... where that server had ended the job (plan.ENDED_JOB_DONE), not told it alone to stop
    told_done: bool = False

    def earlier(self, session: int | None) -> bool:
        """Whether a leave naming ``session`` is an earlier process's of this rank, passed over
        (not where either side predates sessions: an older worker's leave is taken as ever)."""
        return self.session is not None and session is not None and session != self.session

    @property
    def counted_on(self) -> bool:
        """The job forms with it: not recorded, by the checkpoint we resumed from, as done with
        its steps or as not taking part."""
        return not (self.finished or self.absent)


def open_receiver(
    cfg: PSConfig, bind: str, info: dict[str, object], keys: curve.CurveKeys | None
) -> tw.Receiver:
    """A server's receiver at ``bind``, as its settings have it, publishing ``info``: the job's
    (:class:`ParameterServer`), or the one that says the job is done (``server.linger``)."""
    return tw.Receiver(
        bind,
        secret=cfg.secret,
        name=f"ps{cfg.shard}",
        heartbeat_timeout=cfg.heartbeat_timeout,
        curve_keys=keys,
        # None: nixl is served on demand if installed; given: started now, with these
        nixl=cfg.nixl,
        shm=cfg.shm,
        info=info,
    )


def update_problem(steps: int, warmup_steps: int) -> str | None:
    """What is wrong with these settings of the update together, in words; None where nothing
    is. The daemon says it before it binds; a server made otherwise raises it."""
    if not 0 <= warmup_steps <= steps:
        # (a job that never reaches its rate: a warmup meant for a longer run, say)
        return (
            f"--warmup-steps {warmup_steps} is not within the job's --steps {steps}: the rate "
            "would never reach --lr"
        )
    return None


class ParameterServer:
    def __init__(self, cfg: PSConfig, on_step: Callable[[StepReport], None] | None = None) -> None:
        if cfg.sync not in SYNC_MODES:
            raise PSError(f"unknown sync mode {cfg.sync!r}; choose one of {', '.join(SYNC_MODES)}")
        if cfg.optimizer not in optim.OPTIMIZERS:
            raise PSError(
                f"unknown optimizer {cfg.optimizer!r}; choose one of {', '.join(optim.OPTIMIZERS)}"
            )
        if cfg.lr_schedule not in optim.SCHEDULES:
            raise PSError(
                f"unknown learning-rate schedule {cfg.lr_schedule!r}; choose one of "
                f"{', '.join(optim.SCHEDULES)}"
            )
        if cfg.clip_grad_norm is not None and not 0 < cfg.clip_grad_norm < math.inf:
            raise PSError(f"--clip-grad-norm must be a positive number, got {cfg.clip_grad_norm}")
        problem = update_problem(cfg.steps, cfg.warmup_steps)
        if problem:
            raise PSError(problem)
        if cfg.async_lr not in ASYNC_LR:
            raise PSError(
                f"unknown async learning-rate rule {cfg.async_lr!r}; choose one of "
                f"{', '.join(ASYNC_LR)}"
            )
        if not 0 <= cfg.shard < cfg.shards:
            raise PSError(f"shard {cfg.shard} does not exist among {cfg.shards} shards")
        if cfg.workers < 1 or cfg.steps < 0:
            raise PSError("need at least one worker and a non-negative number of steps")
        if cfg.wire_dtype not in WIRE_DTYPES:
            raise PSError(
                f"unknown wire dtype {cfg.wire_dtype!r}; choose one of {', '.join(WIRE_DTYPES)}"
            )
        if cfg.wire_dtype != "float32" and str(cfg.device).strip().lower() != "cpu":
            # cupy has no bfloat16, and a server on a GPU converts nothing on the host
            raise PSError(
                f"a server on {cfg.device} takes float32 on the wire, not {cfg.wire_dtype}: "
                "leave out --wire-dtype or run the server on the cpu"
            )
        try:
            self.place = Placement(cfg.device)
        except ValueError as exc:
            raise PSError(str(exc)) from None
        self.cfg = cfg
        self.on_step = on_step or (lambda report: None)
        self.opt = optim.make(
            cfg.optimizer, self.push_lr, cfg.weight_decay, cfg.momentum, xp=self.place.xp
        )
        self.step = 0
        self._rate_step: int | None = None  # the step the optimizer's rate was set for
        self.ckpt = (
            checkpoint.path_for(cfg.checkpoint_dir, cfg.shard) if cfg.checkpoint_dir else None
        )
        self._saved_step: int | None = None  # the step of the last checkpoint written or read
        #: the workers that finished, left, and were lost, as the last checkpoint recorded them
        self._saved_workers: tuple[dict[int, int], ...] = ({}, {}, {})
        self._failing = 0  # checkpoints failed since the last one written
        self._failure_said = -math.inf  # when a failure was last logged
        # Known once the workers join (or from the checkpoint when resuming): the parameters'
        # specs, this shard's chunks of them, the values and the optimizer's accumulators.
        self.specs: Specs = {}
        self._said_diverged = False  # a loss that is not a finite number, said once (_report)
        #: the digest of what every worker holds fixed (frozen parameters: plan.encode_join),
        #: as the first join (or the checkpoint) gave it; None: nothing held fixed
        self.fixed: str | None = None
        self.chunks: list[Chunk] = []
        #: the chunks that travel together (plan.packs), by pack name, and the chunks that
        #: travel alone: what every worker writes us, and what we write each worker
        self.packs: dict[str, Pack] = {}
        self._alone: list[Chunk] = []
        #: each pack's parameters (its members' are views into it), and (16-bit wire) their
        #: wire copy
        self._pack_params: dict[str, Any] = {}
        self._pack_outgoing: dict[str, Any] = {}
        self._has_init_tensors = False  # registered: the job started afresh, not from --resume
        #: on the shard's device (numpy or cupy arrays)
        self.params: dict[str, Any] = {}
        self.acc: dict[str, Any] = {}
        self._outgoing: dict[str, np.ndarray[Any, Any]] | None = None
        #: (16-bit wire) a gradient widened to float32 before it is added to a sum: as large
        #: as the largest tensor a worker writes us
        self._widened: np.ndarray[Any, Any] | None = None
        self._stale: set[str] = set()  # chunks updated since their wire copy was made
        #: parameters may be owed to a worker (set where they become owed, cleared by
        #: _pay_owed once it finds none): a look at every worker, skipped otherwise
        self._owing = False
        self._serve_pool: ThreadPoolExecutor | None = None  # (bsp) see _serving_pool
        self._needs_init = False
        self.fingerprint = ""
        self.workers = [_Worker(r, step=self.step) for r in range(cfg.workers)]
        #: the mean loss of the last step reported (one number, not one a step: a list of
        #: them grew by about 43 bytes a step, 180 MB an hour at the digits job's pace)
        self.last_loss: float | None = None
        self.last_accuracy: float | None = None
        self.last_accuracy_step: int | None = None  # the parameters' step it was measured at
        self.stats = PSStats(gradient_wait={r: 0.0 for r in range(cfg.workers)})
        self._stop_requested = False
        self._stop_asked_at = 0.0
        self._departing = False  # (request_departure)
        #: it went away at request_departure, checkpointed, the workers not told
        self.departed = False
        #: why the job never formed, where a stop was asked during the join (None otherwise)
        self.stopped_while_joining: str | None = None
        self._ended = False  # (ended)
        self._final_failure: PSError | None = None  # _checkpoint_last's, if it failed
        #: resumed at the job's last step: who did not come to hear it (None otherwise)
        self.done_unjoined: str | None = None
        #: no step done since start: this server may have been restarted alone, behind the
        #: job's other servers, and takes the workers' request to go on at their step (BSP
        #: only: the other modes do not survive a lost server)
        self._may_catch_up = cfg.sync == "bsp"
        #: the latest step the workers asked us to go on at (their ``catch-up`` tensors, read
        #: as they come so that their slots never fill; see _read_catch_up)
        self._asked_step = 0
        #: (bsp, --clip-grad-norm over several shards) each step's global norm is the sum of
        #: every shard's, which the workers add up for the servers (:meth:`_global_squares`)
        self._norm_round = cfg.clip_grad_norm is not None and cfg.shards > 1 and cfg.sync == "bsp"
        self._norm_word = np.zeros(NORM_FIELDS, np.float64)  # [step, squares], written to each
        #: (asp, ssp, --clip-grad-norm) each worker's push is clipped by the norm of its whole
        #: gradient, which it sends in its meta (:meth:`_clip_factor`)
        self._clip_each = cfg.clip_grad_norm is not None and cfg.sync != "bsp"
        #: the step at which another server ended the job, as a worker it told to stop told
        #: us (:meth:`_heard_end`); None while nobody did
        self._ended_elsewhere: int | None = None
        self.started_at = time.monotonic()
        #: seconds from our start to the job formed (every worker joined and ready); None
        #: while it has not, or where it never did
        self.formed_after: float | None = None
        # before we serve: a worker reaching a server that then refused its checkpoint took
        # the settings it published for the job's (one given --shards 2 by mistake made a
        # worker exit 1, "the job has 2 shards"), and the refusal came only after the bind
        self._layout = self._resumable() if cfg.resume else None
        keys = curve.load(cfg.curve_keys) if cfg.curve_keys else None
        # what a worker checks before it joins: the job's size, the settings we share
        self.rx = open_receiver(cfg, cfg.bind, self.published(), keys)
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
            self._check_room(cfg)
            for w in range(cfg.workers):
                self.rx.register(
                    join_name(w), (None,), "uint8", max_bytes=JOIN_MAX_BYTES, ring=JOIN_SLOTS
                )
                # (of dynamic length: a reason and its session; one number from an older worker)
                self.rx.register(leave_name(w), (None,), "int64", max_bytes=LEAVE_MAX_BYTES, ring=2)
                self.rx.register(ended_name(w), (ENDED_FIELDS,), "int64", ring=2)
                self.rx.register(catch_up_name(w), (1,), "int64", ring=2)
                self.rx.register(probe_name(w), (1,), "int64", ring=PROBE_SLOTS)
                if self._norm_round:
                    self.rx.register(norm_total_name(w), (NORM_FIELDS,), "float64", ring=2)
            if cfg.resume:
                self._resume()
        except BaseException:
            self.close()
            raise
        self.address = self.rx.address

    @staticmethod
    def _check_room(cfg: PSConfig) -> None:
        """Refuse a --workers whose join slots alone the machine cannot hold, before a byte is
        allocated: each is allocated whole as it is registered, and 5000 workers took 13.8 GB
        and a minute before failing (or not: the machine swapped), 100 000 filled /dev/shm."""
        need = cfg.workers * JOIN_SLOTS * JOIN_MAX_BYTES
        shared = cfg.shm is not False and tw_region.shm_available()
        room = tw_region.room(shared=shared)
        if room is not None and need > room:
            where = "its available memory" + (" and the free space of /dev/shm" if shared else "")
            raise PSError(
                f"--workers {cfg.workers}: their join slots alone need {_gib(need)} of memory "
                f"({_gib(JOIN_SLOTS * JOIN_MAX_BYTES)} a worker), and this machine can give them "
                f"{_gib(room)} ({where}): run fewer workers per server, or give the machine "
                "more memory" + (" (or /dev/shm more room)" if shared else "")
            )
        if need >= LARGE_JOIN_BYTES:
            log.info(
                "setting up the join slots of %d workers (%s of memory)", cfg.workers, _gib(need)
            )

    # -- the parameters, once known ------------------------------------------------------------

    def _resumable(self) -> checkpoint.Layout:
        """What --resume resumes from: the checkpoint's layout, once it is known to be one of
        this server's setup (its shard of as many, cut and stepped alike; the model is the
        checkpoint's own). PSError naming what differs otherwise, and the flags it needs."""
        if self.ckpt is None or not os.path.exists(self.ckpt):
            # (one moved aside as a server started without --resume: the daemon says so)
            # (the newest: its name's step sorts as text, so "step20" came after "step300")
            kept = glob.glob(glob.escape(self.ckpt) + ".before-*") if self.ckpt else []
            raise PSError(
                f"--resume: no checkpoint at {self.ckpt or '(no --checkpoint-dir)'}"
                + (
                    f" (one kept aside as a server started without --resume: "
                    f"{max(kept, key=os.path.getmtime)}; move it back to go on from it)"
                    if kept
                    else ""
                )
            )
        try:
            layout = checkpoint.layout_of(self.ckpt)  # what it was written for, read once
        except (ValueError, OSError, KeyError) as exc:
            raise PSError(f"cannot resume: {exc}") from exc
        cfg = self.cfg
        setup = [  # (flag, the checkpoint's, ours): what its fingerprint names but the model
            ("--shards", layout.shards, cfg.shards),
            ("--shard", layout.shard, cfg.shard),
            ("--split-bytes", layout.split_bytes, cfg.split_bytes),
            ("--optimizer", layout.optimizer, cfg.optimizer),
        ]
        differ = [f"{flag} {ours}" for flag, theirs, ours in setup if theirs != ours]
        if differ:
            raise PSError(
                f"cannot resume from {self.ckpt}: it was written by a server of "
                + " ".join(f"{flag} {theirs}" for flag, theirs, _ in setup)
                + f", and this one was started with {', '.join(differ)}: start it with the "
                "checkpoint's, or without --resume to start afresh"
            )
        return layout

    def _resume(self) -> None:
        layout = self._layout
        assert layout is not None and self.ckpt is not None  # (_resumable, as we started)
        try:
            finished, left, lost = layout.finished, layout.left, layout.lost
            self.fixed = layout.fixed
            self._setup(layout.specs, needs_init=False)
            self.step, params, state = checkpoint.load(self.ckpt, self.fingerprint)
        except (ValueError, OSError, KeyError) as exc:
            raise PSError(f"cannot resume: {exc}") from exc
        for cid, value in params.items():
            self.params[cid][...] = self.place.from_host(value)
        self.opt.adopt(state, self.place.from_host)
        self._link_packs()  # (the adopted state of the packs' members, made one array each)
        for w in self.workers:
            w.step = self.step
        self._saved_step, self._saved_workers = self.step, (finished, left, lost)
        log.info("resumed shard %d from %s at step %d", self.cfg.shard, self.ckpt, self.step)
        self._not_waited_for(finished, left, lost)

    def _not_waited_for(
        self, finished: dict[int, int], left: dict[int, int], lost: dict[int, int]
    ) -> None:
        """(Resumed.) Mark the workers the job forms again without, as the checkpoint recorded
        them: those that did all their steps (asp, ssp) and exited, those that left on their
        own while the job trained on, and those lost that had not joined again; each of the
        last two is taken back when it joins (started again). Waited for, a worker that is not
        coming back kept the job from forming again, and at --join-timeout the server exited 1,
        and the workers with it; a running job goes on without such a worker."""
        if self.done:
            return  # nothing left to train: none is waited for beyond --join-timeout anyway
        if self.cfg.sync != "bsp":
            # (asp, ssp: each worker ends on its own)
            for rank, step in finished.items():
                if 0 <= rank < len(self.workers) and step >= self.cfg.steps:
                    w = self.workers[rank]
                    w.step, w.stopped, w.finished = step, True, True
            done = [w.rank for w in self.workers if w.finished]
            if done:
                log.info(
                    "%s did all %d steps before: not waited for",
                    _ranks(done),
                    self.cfg.steps,
                )
        away = {**lost, **left}
        gone = [w for w in self.workers if w.rank in away and not w.finished]
        if len(gone) == sum(not w.finished for w in self.workers):
            # No worker still to train was taking part: the job was stopped by stopping its
            # workers (or lost them all), and is started again as a whole. Waited for.
            return
        for w in gone:
            w.absent, w.left = True, w.rank in left
            w.stopped = w.left  # (one lost, not waited for, is not done with the job either)
            log.info(
                "worker %d %s before (at step %d): not waited for: it joins again once started",
                w.rank,
                "left" if w.left else "was lost",
                away[w.rank],
            )

    def _setup(self, specs: Specs, *, needs_init: bool) -> None:
        """Plan this shard's chunks of ``specs`` and register what every worker writes."""
        cfg = self.cfg
        odd = [n for n, (_, dt) in specs.items() if dt != "float32"]
        if odd:
            raise PSError(
                f"parameter {odd[0]!r} is {specs[odd[0]][1]}: the servers keep float32 "
                "parameters (use --wire-dtype for 16-bit traffic)"
            )
        self.specs = specs
        # (registered before the workers' tensors: a worker that finds them finds this too)
        self.rx.register(fixed_name(self.fixed), (1,), "uint8", ring=1)
        shapes = {n: shape for n, (shape, _) in specs.items()}
        self.chunks = [
            c for c in plan(shapes, cfg.shards, cfg.split_bytes) if c.server == cfg.shard
        ]
        self._flag_at = flag_slots(c.cid for c in self.chunks)
        self.fingerprint = checkpoint.fingerprint(
            specs, cfg.shards, cfg.shard, cfg.split_bytes, cfg.optimizer
        )
        self.packs = {p.cid: p for p in packs(self.chunks, shapes, cfg.pack_bytes, cfg.split_bytes)}
        packed = {c.cid for p in self.packs.values() for c in p.members}
        self._alone = [c for c in self.chunks if c.cid not in packed]
        if self.packs:
            log.info(
                "%d small parameters travel in %d pack%s, %d chunks alone (--pack-bytes %d)",
                len(packed),
                len(self.packs),
                "" if len(self.packs) == 1 else "s",
                len(self._alone),
                cfg.pack_bytes,
            )
        # A packed member's parameters are a view into its pack's: the pack goes out as they
        # are, no gather (the optimizer updates them in place); its accumulator too, so that a
        # step of a pack's gradients sums (and the optimizer steps) the pack as one array.
        self._pack_params, self.params = self._by_chunk(self.place.zeros)
        self._pack_acc, self.acc = self._by_chunk(self.place.zeros)
        self._link_packs()
        # Parameters go out in the wire dtype: converted into these, allocated once.
        wire = tw.TensorSpec.create("wire", (), cfg.wire_dtype).dtype
        self._outgoing = None
        if cfg.wire_dtype != "float32":
            self._pack_outgoing, self._outgoing = self._by_chunk(
                lambda shape: np.empty(shape, wire)
            )
            sizes = [math.prod(c.shape) for c in self._alone]
            sizes += [p.size for p in self.packs.values()]
            self._widened = np.empty(max(sizes, default=0), np.float32)
        self._stale = {c.cid for c in self.chunks}
        self._needs_init = needs_init
        self._has_init_tensors = needs_init
        device = self.place.name  # gradients and initial values land where they are used
        if needs_init:  # registered before the workers' tensors: rank 0 finds them with its own
            for c in self.chunks:
                self.rx.register(init_name(c.cid), c.shape, "float32", ring=1, device=device)
        incoming = [(c.cid, c.shape) for c in self._alone]
        incoming += [(cid, (p.size,)) for cid, p in self.packs.items()]
        for w in range(cfg.workers):
            for cid, shape in incoming:
                # two slots: this step's gradients, and the next step's arriving early (ASP, SSP)
                self.rx.register(grad_name(w, cid), shape, cfg.wire_dtype, ring=2, device=device)
            # last: workers wait for it (its figures, then a flag per chunk: plan.flag_slots)
            self.rx.register(meta_name(w), (META_FIELDS + len(self.chunks),), "float64")

    def _specs_differ(self, specs: Specs, fixed: str | None) -> str | None:
        """How a joining worker's model differs from the job's, in words; None where they
        agree. Their order is the joiner's own affair (a worker finds its parameters by name):
        the job's plan and checkpoints follow the first specs."""
        if not self.specs:
            return None
        if dict(self.specs) != dict(specs):
            return first_mismatch(self.specs, specs)
        return fixed_mismatch(self.fixed, fixed)

    # -- lifetime ----------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Finish the current step, checkpoint, tell the workers to stop (signal-safe)."""
        if not self._stop_requested:
            self._stop_asked_at = time.monotonic()
        self._stop_requested = True

    def request_departure(self) -> None:
        """Go away, to be started again (an orchestrator moving this server: a Kubernetes pod
        deleted, evicted or rolled), the job going on (signal-safe): at the next wait, write
        the checkpoint of where the job is, and return from :meth:`run` without a word to the
        workers, which wait for this server (their --reconnect-timeout) as for one that
        failed, and rejoin it once it is back from that checkpoint. A stop
        (:meth:`request_stop`) instead ends the job, telling every worker."""
        self._departing = True

    @property
    def departing(self) -> bool:
        """A departure was asked (:meth:`request_departure`)."""
        return self._departing

    def _check_departure(self) -> None:
        if self._departing:
            raise _Departing

    @property
    def stop_requested(self) -> bool:
        """A stop was asked (:meth:`request_stop`)."""
        return self._stop_requested

    @property
    def done(self) -> bool:
        """Every step of the job is done (``--steps``), whether here or before a resume."""
        return self.step >= self.cfg.steps

    @property
    def resumed_done(self) -> bool:
        """Resumed from a checkpoint of the job's last step: nothing is left to train."""
        return self.cfg.resume and self.done

    @property
    def awaited(self) -> int:
        """How many workers the job forms with: all, but for those a checkpoint we resumed from
        says finished, or not taking part (:meth:`_not_waited_for`)."""
        return sum(w.counted_on for w in self.workers)

    @property
    def ended(self) -> bool:
        """The job ended by itself, not at a stop request: every step done (here, or before a
        resume), or, under asp and ssp, every worker stopped, its steps done or having left
        (where every one left, the job's step is short of --steps; one lost is waited for).
        Nothing more will be trained."""
        return self._ended

    def published(self, done_at: int | None = None) -> dict[str, object]:
        """What this server publishes about its job (``Receiver(info=...)``); ``done_at``: the
        step at which it ended, once it has (with the path of its checkpoint of that step,
        where it wrote or resumed from one)."""
        final = None
        if done_at is not None and self.ckpt is not None and self._saved_step == done_at:
            final = os.path.abspath(self.ckpt)
        return job_info(
            self.cfg.workers, self._shared_settings(), done_at, final, shard=self.cfg.shard
        )

    @property
    def _ending(self) -> bool:
        """Every step is done, a stop was asked, or the job ended on another server: it ends
        at this step."""
        return self.done or self._stop_requested or self._ended_elsewhere is not None

    @property
    def ended_elsewhere(self) -> int | None:
        """The step at which another server ended the job, as a worker told us (the job ended
        there while we were lost, frozen or behind); None where none did."""
        return self._ended_elsewhere

    @property
    def push_lr(self) -> float:
        """The rate at which the optimizer applies one update: --lr under bsp (one update a
        step, of the workers' mean gradient); under asp and ssp, one update per worker's push,
        at --lr divided by --workers unless --async-lr each (see ASYNC_LR)."""
        cfg = self.cfg
        if cfg.sync == "bsp" or cfg.async_lr == "each":
            return self.lr
        return self.lr / cfg.workers

    @property
    def rate(self) -> float:
        """The rate of an update at the job's step: :attr:`push_lr` moved by --warmup-steps
        and --lr-schedule (optim.rate_factor)."""
        cfg = self.cfg
        factor = optim.rate_factor(cfg.lr_schedule, self.step, cfg.steps, cfg.warmup_steps)
        return self.push_lr * factor

    @property
    def lr(self) -> float:
        """--lr, or the optimizer's own default when it was left out (optim.DEFAULT_LR)."""
        return optim.default_lr(self.cfg.optimizer) if self.cfg.lr is None else self.cfg.lr

    def _shared_settings(self) -> dict[str, object]:
        """What every server of the job must agree on, as the workers compare it (plan's
        job_info): when the job ends, and how each shard trains."""
        cfg = self.cfg
        return {
            "shards": cfg.shards,
            # how the tensors are cut into chunks: each server plans its shard by it, and two
            # that differ leave some rows with two servers and others with none (the worker
            # said "servers hold 32 rows, model has (64, 128) (wrong model?)")
            "split-bytes": cfg.split_bytes,
            # which parameters travel together: the workers compute the same packs from it
            "pack-bytes": cfg.pack_bytes,
            # what the tensors travel as: the workers' buffers were registered for it
            "wire-dtype": cfg.wire_dtype,
            # the workers' data order and cut: each compares its own --seed with it (PSClient)
            "seed": cfg.seed,
            "steps": cfg.steps,
            "sync": cfg.sync,
            "staleness": cfg.staleness if cfg.sync == "ssp" else "-",
            "async-lr": cfg.async_lr if cfg.sync != "bsp" else "-",
            "optimizer": cfg.optimizer,
            "lr": repr(self.lr),  # exact: 1e-3 and 0.001 agree, 0.0012345 and 0.00123451 not
            "momentum": repr(cfg.momentum) if cfg.optimizer == "momentum" else "-",
            "weight-decay": repr(cfg.weight_decay),
            "lr-schedule": cfg.lr_schedule,
            "warmup-steps": cfg.warmup_steps,
            "clip-grad-norm": repr(cfg.clip_grad_norm),
        }

    @property
    def _join_connect_timeout(self) -> float:
        """How long the handshake with a worker whose join we take may take: JOIN_CONNECT_TIMEOUT,
        or STOP_JOIN_CONNECT_TIMEOUT as we stop (a join taken then only hears that we stop; one
        from a worker gone since would otherwise hold our exit 10 s), and never past our
        --stop-grace then."""
        if self._ending:
            return min(self.cfg.step_timeout, self.cfg.stop_grace, STOP_JOIN_CONNECT_TIMEOUT)
        return min(self.cfg.step_timeout, JOIN_CONNECT_TIMEOUT)

    def _stop_grace(self) -> float | None:
        """The grace a stop gives the step in flight (see STOP_GRACE); None without a stop."""
        if not self._stop_requested:
            return None
        stats = self.stats
        mean = stats.step_seconds / stats.steps if stats.steps else 0.0
        return min(self.cfg.step_timeout, max(self.cfg.stop_grace, STOP_GRACE_STEPS * mean))

    def _stop_overdue(self) -> float | None:
        """The grace a stop gives the step in flight, once it has passed; None before, or
        without a stop."""
        grace = self._stop_grace()
        if grace is None or time.monotonic() - self._stop_asked_at < grace:
            return None
        return grace

    def _within_stop_grace(self, wait: float) -> float:
        """``wait``, cut to what is left of a stop's grace: a wait for a worker's gradients
        ends with it. Before, a wait begun just before it ended took REJOIN_CHECK_EVERY (1 s)
        more, for each worker still waited for in turn."""
        grace = self._stop_grace()
        if grace is None:
            return wait
        return min(wait, max(self._stop_asked_at + grace - time.monotonic(), 0.0))

    def close(self) -> None:
        if self._serve_pool is not None:
            self._serve_pool.shutdown(wait=True)  # (no write is in flight between steps)
            self._serve_pool = None
        self.tx.close()
        self.rx.close()

    def __enter__(self) -> ParameterServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- protocol pieces -----------------------------------------------------------------------

    def _join(self) -> bool:
        """Every worker joins (address and specs: the first one's specs plan the job unless a
        checkpoint did), then says it is ready, its parameters registered; rank 0 has then
        written the initial values, unless we resumed. Resumed, it goes on without the workers
        not back by --join-timeout where some are. False: a stop was asked first (the workers
        that were ready are told to stop; :attr:`stopped_while_joining` says who was missing),
        or a worker said that the job ended elsewhere."""
        deadline = time.monotonic() + self.cfg.join_timeout
        next_look = time.monotonic() + REJOIN_CHECK_EVERY
        while not all(w.alive or not w.counted_on for w in self.workers):
            try:
                progressed = self._take_join_messages(during_join=True)
            except PSError:
                # (a join we cannot use: the workers that joined would wait out their
                # --reconnect-timeout for a server that is gone)
                self._tell_failed()
                raise
            if progressed:
                continue
            if time.monotonic() >= next_look:
                self._reach_the_silent()
                next_look = time.monotonic() + REJOIN_CHECK_EVERY
                self._note_the_unready_gone()
            if self._departing:  # (nothing trained since we started: nothing to checkpoint)
                self.departed = True
                return False
            if self._ended_elsewhere is not None:
                # A worker says another server ended the job while we were away (lost,
                # frozen, or restarted behind it): those ready hear it, the others are not
                # waited for (they have exited, or hear it from that server as they join).
                self._adopt_end(self._ended_elsewhere)
                self._stop_those_ready()
                self._tell_those_left_out(take_joins=False)
                return False
            stopped = self._stop_requested
            if time.monotonic() >= deadline or stopped:
                missing = [w.rank for w in self.workers if not w.joined and w.counted_on]
                unready = [w.rank for w in self.workers if w.joined and not w.alive]
                detail = (
                    f"{_ranks(missing)} of {self.cfg.workers} did not join"
                    if missing
                    else f"{_ranks(unready)} joined but never got ready"
                )
                refused = [w.refused for w in self.workers if not w.alive and w.refused]
                lost = [w for w in self.workers if w.joined and not w.alive and w.lost_joining]
                if lost:
                    detail += (
                        f" ({_ranks([w.rank for w in lost])} joined and "
                        f"{'was' if len(lost) == 1 else 'were'} lost before getting ready; "
                        f"the first: {lost[0].lost_joining})"
                    )
                silent = [w for w in self.workers if not w.joined and w.silent_at]
                if silent:
                    detail += (
                        f" ({_ranks([w.rank for w in silent])} joined from an address that "
                        "took the connection and never answered, the first "
                        f"{silent[0].silent_at}: stopped (SIGSTOP, Ctrl-Z, a paused "
                        "container), or not the worker's receiver?)"
                    )
                # Resumed from a checkpoint of the job's last step (restarted after the job
                # ended: a Kubernetes StatefulSet restarts a server that exits 0): there is
                # nothing left to train, and the workers that did not come are not missed.
                # Before, this ended in exit 1, and an orchestrator restarted it again.
                if stopped or self.resumed_done:
                    # Asked to stop (SIGTERM: an orchestrator taking the job down) before the
                    # job formed: an orderly end, not a timeout. Those ready would otherwise
                    # wait for us to come back: told to stop, as at the end of a job.
                    self._stop_those_ready()
                    asked = "before the stop was asked"
                    if not self.resumed_done:
                        self.stopped_while_joining = f"{detail} {asked}"
                    else:  # (its job was done: not a job stopped before it began)
                        within = asked if stopped else f"within {self.cfg.join_timeout:g} s"
                        self.done_unjoined = f"{detail} {within}"
                    self._tell_those_left_out(take_joins=False)
                    return False
                if self.cfg.resume and not stopped and any(w.alive for w in self.workers):
                    # Resumed, and some workers are back: the job goes on without the others,
                    # as a running job goes on without a lost worker; each joins again once
                    # started. Before, the server exited 1, and the workers that had come back
                    # with it: one drained, or lost, while this server was down (no checkpoint
                    # records it) never came.
                    for w in self.workers:
                        if not w.alive and w.counted_on:
                            w.absent = True
                    log.warning(
                        "%s within %g s (--join-timeout): going on without %s, as a running job "
                        "goes on without a lost worker; each joins again once started",
                        detail,
                        self.cfg.join_timeout,
                        "it" if len(missing) + len(unready) == 1 else "them",
                    )
                    break
                self._tell_failed()
                raise PSError(
                    f"{detail} within {self.cfg.join_timeout:g} s ("
                    + (
                        "; ".join(refused)
                        if refused
                        else f"is each started with --servers {self.address} and its --rank?"
                    )
                    + ")"
                )
            time.sleep(0.01)
        self._take_initial_values()
        return True

    def _stop_those_ready(self) -> None:
        """(The job ends before it formed.) Tell the workers that are ready to stop, with the
        parameters they would have started from (never with the zeros we hold before rank 0's
        initial values: a worker evaluates and saves what it is sent last). Without rank 0
        ready there are none to send."""
        if self.workers[0].alive:
            self._take_initial_values()
        if not self._needs_init:
            for w in self.workers:
                if w.alive:
                    self._serve(w, STATUS_STOP)

    def _note_the_unready_gone(self) -> None:
        """(While the job forms.) Say at once that a worker that joined is known gone
        (:meth:`_gone`: its process exited, or it left our heartbeats unanswered) before it
        said it is ready: the job waits for it to join again, or for one started in its
        place, until --join-timeout, whose error says it too. Before, nothing said it until
        then (60 s by default), and only as "joined but never got ready". Its join is kept:
        one frozen that long may still say it is ready."""
        for w in self.workers:
            if not w.joined or w.alive or w.lost_joining is not None:
                continue
            why = self._gone(w)
            if why is not None:
                w.lost_joining = why
                log.warning(
                    "worker %d joined and was lost before it got ready (%s): waiting for it "
                    "to join again",
                    w.rank,
                    why,
                )

    def _tell_failed(self) -> None:
        """The job did not form and we exit: tell each worker that joined (best effort,
        within STOP_GRACE), so that it exits too, at once and in failure; before, each waited
        out its --reconnect-timeout (120 s by default) for a server that would not come back.
        One that has not registered its ``dropped`` tensor yet (joined, not ready) cannot be
        told, and waits as before."""
        deadline = time.monotonic() + self.cfg.stop_grace
        for w in self.workers:
            left = deadline - time.monotonic()
            if not w.joined or not w.address or left <= 0:
                continue
            notice = self._notify(w, STATUS_FAILED, min(left, STOP_NOTICE_TIMEOUT))
            log.info(
                "worker %d %s",
                w.rank,
                "told that the job did not form"
                if notice.told
                else f"could not be told that the job did not form ({notice.why})",
            )

    def _take_initial_values(self) -> None:
        """Rank 0's initial values of our chunks, once it is ready (unless we resumed)."""
        if self._needs_init:
            for c in self.chunks:
                try:
                    # (past the loss of a rank 0 that died and was started again meanwhile)
                    view = wait_past_losses(self.rx, init_name(c.cid), self.cfg.step_timeout)
                except tw.TensorWireError as exc:
                    raise PSError(f"rank 0 did not send the initial {c.cid}: {exc}") from None
                self.params[c.cid][...] = view
                self.rx.release(init_name(c.cid))
            self._needs_init = False

    def _settle_leaves(self, w: _Worker) -> None:
        """(``w`` is ready.) Pass over the leaves an earlier process of its rank left (as one
        started again after it left to return), and the notice of that session's end; a leave
        of this session, already there, is taken (``w.leaving``) and acted on once the worker
        takes part (the job forms with it, and goes on without it). Before, every leave was
        drained here: a worker stopped between its ready and our reading it (a pod scaled down
        as it started) left unheard and was taken for lost, and under asp and ssp the job
        waited for it at its end and exited 1 at --join-timeout (seen once in a suite run under
        load, `test_ps.py -k lost_after_one_left`; `-k lands_with_a_worker` since). A worker
        older than sessions is drained as before."""
        if w.session is not None and self._leave_pending(w):
            return  # (its ended message, if any, is this session's too: kept for the leave)
        self.rx.drain(leave_name(w.rank))
        self.rx.drain(ended_name(w.rank))

    def _leave_pending(self, w: _Worker) -> bool:
        """Whether ``w`` wrote a leave this session: the leaves on its ring are taken in turn,
        those of another session passed over, and this session's kept in ``w.leaving`` (one
        taken already counts). A leave whose writer was lost since is taken as the job
        stopping, as before."""
        name = leave_name(w.rank)
        while w.leaving is None and self.rx.pending(name):  # bounded: its ring holds two
            try:
                view = wait_past_losses(self.rx, name, 0.0)
            except tw.TensorWireError:  # (lost since: taken as the job stopping, as before)
                w.leaving = LEAVE_JOB_STOPS
                break
            why, earlier = self._leave_reason(view), w.earlier(leave_session(view))
            self.rx.release(name)
            if earlier:
                log.info("worker %d: a leave of an earlier process of its rank passed over", w.rank)
                continue
            w.leaving = why
        return w.leaving is not None

    @staticmethod
    def _reached(w: _Worker, address: str) -> None:
        """Worker ``w``'s join is taken: we reached its receiver at ``address``."""
        w.address, w.joined, w.lost_joining, w.silent_at = address, True, None, None
        # a session anew: what the last one was told (a stop) the worker let go of as it
        # joined again, so a stop is told again (_tell_those_left_out)
        w.stopped = False

    def _reach_the_silent(self) -> None:
        """(While the job forms.) The handshake again with the workers whose join named an
        address that took the connection and did not answer (``silent_at``), those tried
        longest ago first, for SILENT_RETRY_TIMEOUT in all (a node of them paused would
        otherwise hold the other joins, a stop and --join-timeout that much longer each
        round): one that answers now has joined; one whose address takes no connection any
        more, or that is closing, went away (it joins again once started, as any)."""
        if self._stop_requested:
            return
        began = time.monotonic()
        silent = [w for w in self.workers if w.silent_at is not None and not w.joined]
        for w in sorted(silent, key=lambda w: w.silent_tried):
            if time.monotonic() - began >= SILENT_RETRY_TIMEOUT:
                return
            address = w.silent_at
            assert address is not None
            w.silent_tried = time.monotonic()
            try:
                self.tx.add_peer(address, connect_timeout=SILENT_RETRY_TIMEOUT)
            except tw.TensorWireError as exc:
                if isinstance(exc, tw.WireTimeoutError) and exc.silent:
                    continue  # still silent
                w.silent_at = None
                log.warning(
                    "worker %d, which joined from %s and did not answer, went away (%s): "
                    "waiting for it to join again",
                    w.rank,
                    address,
                    exc,
                )
                continue
            self._reached(w, address)
            log.warning("worker %d answers at %s now: joined", w.rank, address)

    def _take_join_messages(self, *, during_join: bool) -> bool:
        """Handle the join and ready messages that have landed, for workers not yet alive;
        True if there was one."""
        took = False
        for w in self.workers:
            if w.alive and not during_join and self.rx.pending(join_name(w.rank)):
                # It joined again while taking part here: it reconnected to every server
                # after losing another, and dropped what we had sent it. Its gradients may have
                # kept coming (so _collect never saw the join); left pending, the join would be
                # taken once the worker is gone, with its old address (a 2 s wait for a dead
                # receiver, with every other worker's step held up meanwhile).
                self._lose(w, "it joined again", tell=False)
            while not w.alive and self.rx.pending(join_name(w.rank)):
                took = True
                # (past the loss of its earlier session: its join again follows it)
                self._on_join(w, wait_past_losses(self.rx, join_name(w.rank), 0.0), during_join)
        self._take_leaves_of_absent()
        return took

    def _on_join(self, w: _Worker, view: Any, during_join: bool) -> None:
        """Worker ``w``'s join (address and specs) or ready message, taken: released here.
        Once ready, it takes part (asp and ssp serve it at once; bsp at the step's end)."""
        try:
            joined = decode_join(bytes(view))
        except ValueError as exc:
            raise PSError(f"worker {w.rank}: {exc}") from None
        finally:
            self.rx.release(join_name(w.rank))
        if joined is not None:  # address and specs
            address, specs, fixed, w.session = joined
            w.silent_at = None  # (a join anew supersedes the one that went unanswered)
            w.leaving = None  # (an earlier session's)
            problem = self._specs_differ(specs, fixed)
            if problem is not None:
                # Refused, and the job goes on: the worker finds the difference in the plan we
                # publish and exits, naming it. Before, this server exited 1, so one worker
                # restarted with another model (a stale image) took down a running job, and
                # the workers that had joined waited out their --reconnect-timeout for it.
                w.refused = (
                    f"worker {w.rank} joined with parameters that differ from the job's: "
                    f"{problem} (every worker must train the same model)"
                )
                log.error("%s: not taken", w.refused)
                return
            w.refused = None
            if not self.specs:
                self.fixed = fixed
                self._setup(specs, needs_init=True)
            if w.address and (w.address != address or w.untold):
                # its earlier session (kept while it was untold): a fresh one now
                with contextlib.suppress(tw.TensorWireError):
                    self.tx.remove_peer(w.address)
                w.untold = False
            try:
                self.tx.add_peer(address, connect_timeout=self._join_connect_timeout)
            except tw.PeerLostError as exc:
                # It answered, and is going (its receiver closing, its process dead): the
                # worker quit after its join (it found the job was not one it could join, or
                # was stopped). Waited for as one that has not joined. Before, a forming
                # server exited 1 blaming the address, and the workers that had joined waited
                # out their --reconnect-timeout for it.
                log.warning(
                    "worker %d joined from %s and went away before this server reached it "
                    "(%s): waiting for it to join again",
                    w.rank,
                    address,
                    exc,
                )
                return
            except tw.TensorWireError as exc:
                # While the job forms, the address is most likely wrong: said at once. Not once
                # a stop was asked: the worker may have been stopped too, after it joined.
                if during_join and not self._stop_requested:
                    if isinstance(exc, tw.WireTimeoutError) and exc.silent:
                        # Something there took the connection: the worker, stopped just after
                        # its join (a wrong address is refused, or takes none). Tried again
                        # until it answers (_reach_the_silent). Before, the server exited 1
                        # blaming the address, and the workers that had joined waited out their
                        # --reconnect-timeout for it.
                        w.silent_at = address
                        log.warning(
                            "worker %d joined from %s, which took the connection and did not "
                            "answer (%s): trying it again until --join-timeout",
                            w.rank,
                            address,
                            exc,
                        )
                        return
                    raise PSError(
                        f"worker {w.rank} joined from {address}, which does not answer: {exc} "
                        "(the address is the worker's --bind, its host replaced by --advertise)"
                    ) from None
                # gone again, or unreachable: it may join again later
                log.warning("worker %d joined but cannot be reached: %s", w.rank, exc)
                return
            self._reached(w, address)
        elif w.joined and w.refused is None:  # ready: its parameters are registered
            # What its previous session left in its tensors (a worker dropped while it ran
            # pushes the rest of its step before it learns it), and rank 0's initial values
            # once they are no longer read: its first write of this session comes only after
            # our parameters, so nothing of it is lost here.
            for name in self._worker_tensors(w):
                self.rx.drain(name)
            if self._norm_round:
                # (and the loss of its earlier process there, which the wait for the norms'
                # sum would otherwise take for this one's: a fresh clone's run met it)
                self.rx.drain(norm_total_name(w.rank))
            self._settle_leaves(w)
            w.told_end, w.told_done = None, False
            if w.rank == 0 and self._has_init_tensors and not self._needs_init:
                for c in self.chunks:
                    self.rx.drain(init_name(c.cid))
            w.alive, w.step, w.probation, w.served = True, self.step, not during_join, None
            w.pushed = 0
            w.stopped, w.got, w.owed = False, set(), None  # what it is sent now supersedes
            w.deferred = set()
            w.left = w.absent = False
            self._claim_dropped_notice(w)
            how = "joined" if during_join else "rejoined"
            self.stats.worker_events[how] += 1
            log.log(
                logging.INFO if during_join else logging.WARNING,
                "worker %d %s from %s (its parameters go over %s) at step %d",
                w.rank,
                how,
                w.address,
                self.tx.transport_of(w.address),
                self.step,
            )
            if not during_join and self.cfg.sync != "bsp":
                done = w.step >= self.cfg.steps or self._ending
                w.owed = None  # a new session: what the last one was owed goes with it
                self._offer(w, STATUS_STOP if done else STATUS_RUN)

    def _clipping(self, used: set[str], contributors: int) -> float:
        """(bsp, --clip-grad-norm) What the step's mean gradient (the sums in ``acc`` of the
        chunks in ``used``, over ``contributors``) is multiplied by so that its global norm is
        at most --clip-grad-norm: ``max / (norm + 1e-6)`` where the norm is above it, else 1,
        as ``torch.nn.utils.clip_grad_norm_`` computes it (over the parameters that have a
        gradient). With several shards the norm is of every shard's chunks: the servers'
        squared norms, added up by the workers (:meth:`_global_squares`)."""
        if self.cfg.clip_grad_norm is None:
            return 1.0
        squares = squared_norm(self.acc[cid] for cid in used) / (contributors * contributors)
        if self._norm_round:
            squares = self._global_squares(squares)
        return self._clip_factor(squares)

    def _clip_factor(self, squares: float) -> float:
        """What a gradient whose squared norm is ``squares`` is multiplied by under
        --clip-grad-norm (``clip_coefficient``), counted in ``stats.clipped`` where it clips:
        bsp, a step's mean gradient (:meth:`_clipping`); asp and ssp, a worker's push, by the
        squared norm of its whole gradient, which its meta carries (the worker takes it: no
        server sees the other shards' chunks, and every shard scales by the same number)."""
        assert self.cfg.clip_grad_norm is not None
        coefficient = clip_coefficient(self.cfg.clip_grad_norm, squares)
        if coefficient < 1.0:
            self.stats.clipped += 1
        return coefficient

    def _global_squares(self, own: float) -> float:
        """(--clip-grad-norm over several shards) The squared norm of the step's whole mean
        gradient, from ``own``, this shard's: it goes to every worker taking part (into its
        ``norm/<shard>``), each adds up the servers' in shard order and writes the sum back to
        every server (``norm-total/<rank>``), and the first sum of this step that lands is
        taken, so every shard clips by the same number. One more round trip a step; the
        workers answer as they wait for the parameters (PSClient.wait_params).

        A worker that is lost, leaves or joins again meanwhile (it does so when it loses
        another server) is handled as in :meth:`_collect`, and the others' sums are still
        taken (:meth:`_await_sum`); where none gives the sum (every one gone or without every
        server's norm, or no sum within --step-timeout), the shard clips by its own norm,
        which is at most the whole one (it clips too little), says so, and counts it
        (``clipped_alone``): the step is not lost, and the job goes on. A worker is not lost
        for a sum that does not come: it may be waiting for another server's norm, which that
        server sends once it has heard from every worker or lost one (up to its own
        --step-timeout); one that is frozen is lost at the next step's wait for its
        gradients."""
        asked: list[_Worker] = []
        declined: set[int] = set()  # the ranks that said they have no sum (NaN)
        word = self._norm_word
        word[0], word[1] = self.step, own
        for w in self.workers:
            if not w.alive:
                continue
            # Its sums of earlier rounds (another worker's was taken first) go, so that its
            # slots never fill; of this round only a NaN can be there yet (a sum comes after
            # our word below; a NaN once another server went on without its answer)
            early = self._take_total(w)
            if early is not None and math.isnan(early):
                declined.add(w.rank)
            try:
                self.tx.write(
                    norm_name(self.cfg.shard),
                    word,
                    peer=w.address,
                    timeout=OFFER_TIMEOUT if w.probation else NORM_WRITE_TIMEOUT,
                )
            except tw.PeerLostError as exc:
                self._lose(w, str(exc))
                continue
            except tw.TensorWireError as exc:
                # its slots still full (it is joining again, or frozen: its other losses are
                # found where they are), or an older worker with no such tensor: it cannot
                # answer this round, and another may
                log.debug("worker %d not asked for the step's norm: %s", w.rank, exc)
                continue
            asked.append(w)
        try:
            total = self._await_sum(asked, declined, time.monotonic() + self.cfg.step_timeout)
            why = (
                "none takes part"
                if not asked
                else "each was lost, left, joined again or missed a server's norm"
            )
        except _NoSum:
            total, why = None, f"none within {self.cfg.step_timeout:g} s"
        if total is not None:
            return total
        self.stats.clipped_alone += 1
        log.warning(
            "step %d: no worker gave the sum of the servers' gradient norms (%s): clipped by "
            "this shard's own norm, which clips less than the whole gradient's would",
            self.step,
            why,
        )
        return own

    def _await_sum(self, asked: list[_Worker], declined: set[int], deadline: float) -> float | None:
        """The first sum of the servers' squared norms of this step (:meth:`_global_squares`)
        that lands from any worker of ``asked`` taking part: every worker's is the same, so
        none is waited for in particular (one busy after its push, or not yet scheduled on a
        loaded host, held the others' sums up by a look each). None once each has said it has
        none (a NaN: a server went on without its answer; its rank goes into ``declined``),
        or is lost, has left or joins again (handled as in the wait for gradients, at each
        :data:`NORM_LOOK` of waiting); :class:`_NoSum` once ``deadline`` passes."""
        while True:  # bounded: each turn takes a message or ends a worker, or nears deadline
            by_name = {
                norm_total_name(w.rank): w for w in asked if w.alive and w.rank not in declined
            }
            if not by_name:
                return None
            left = deadline - time.monotonic()
            wait = self._within_stop_grace(max(min(left, NORM_LOOK), 0.0))
            try:
                name, view = next(self.rx.wait_each(list(by_name), timeout=wait))
            except tw.PeerLostError as exc:
                lost = by_name.get(exc.tensor or "")
                if lost is None:
                    raise  # (not of these tensors: cannot be)
                # Taken for this worker's only where our sender to it finds it gone too: the
                # notice may be of an earlier process of its rank (lost as it left, noticed
                # after the one now taking part joined), and a worker wrongly lost here
                # joins again, missing steps. One really gone is found at the next look.
                gone = self._gone(lost)
                if gone is not None:
                    self._lose(lost, str(exc))
                continue
            except tw.WireTimeoutError:
                for w in by_name.values():
                    try:
                        self._check_on(w)
                    except _WorkerLost as exc:
                        self._lose(w, str(exc), tell=exc.tell)
                    except _WorkerLeft:
                        self._leave(w)
                if time.monotonic() >= deadline:
                    raise _NoSum from None
                grace = self._stop_overdue()
                if grace is not None:  # stopping: told that we stop (_lose)
                    for w in by_name.values():
                        if w.alive:
                            self._lose(w, f"nothing within {grace:g} s of the stop")
                continue
            total = self._read_total(name, view)
            if total is not None and math.isnan(total):
                declined.add(by_name[name].rank)
            elif total is not None:
                return total

    def _take_total(self, w: _Worker) -> float | None:
        """``w``'s sum of this step's squared norms (NaN: it has none), if it has landed
        (earlier rounds' are let go of on the way: their slots hold two)."""
        name = norm_total_name(w.rank)
        while self.rx.pending(name):  # bounded: each turn takes a message or a loss's notice
            try:
                view = wait_past_losses(self.rx, name, 0.0)
            except tw.TensorWireError:  # lost: found when it is waited for, or at our writes
                return None
            total = self._read_total(name, view)
            if total is not None:
                return total
        return None

    def _read_total(self, name: str, view: Any) -> float | None:
        """The sum in ``view`` (taken from ``name``, released here), if it is this step's."""
        step, total = int(view[0]), float(view[1])
        self.rx.release(name)
        return total if step == self.step else None

    def _accumulate(
        self, rank: int, got: dict[str, Any], flags: list[float], first: bool, used: set[str]
    ) -> None:
        """(bsp) Add worker ``rank``'s gradients (``got``, its tensors by name; ``flags``, its
        meta as a list) to the step's sums (``first``: the step's first contributor, whose
        gradients are the sums), and the chunks it pushed a gradient of to ``used``. A pack
        whose members all have one is added as one array; otherwise each member alone."""
        acc, flag_at = self.acc, self._flag_at

        def add(cid: str, grad: Any) -> None:
            pushed = flags[flag_at[cid]] != 0.0
            if first:
                self._take(acc[cid], grad)  # (zeros if none)
            elif pushed:
                self._add(acc[cid], grad)
            if pushed:
                used.add(cid)

        for c in self._alone:
            add(c.cid, got[grad_name(rank, c.cid)])
        for cid, p in self.packs.items():
            flat = got[grad_name(rank, cid)]
            if all(flags[flag_at[c.cid]] != 0.0 for c in p.members):
                if first:
                    self._take(self._pack_acc[cid], flat)
                else:
                    self._add(self._pack_acc[cid], flat)
                used.update(c.cid for c in p.members)
            else:
                for c, view in p.views(flat):
                    add(c.cid, view)

    def _take(self, into: Any, grad: Any) -> None:
        """``into[...] = grad``: a gradient as it landed, into a float32 sum (widened from a
        16-bit wire: ``wire16``, where numpy's own cast is slow on small values)."""
        if self._widened is None:
            into[...] = grad
        else:
            widen_into(into, grad)

    def _add(self, into: Any, grad: Any) -> None:
        """``into += grad``: a gradient as it landed, added to a float32 sum (widened first
        from a 16-bit wire, as :meth:`_take` does)."""
        if self._widened is None:
            into += grad
        else:
            wide = self._widened[: grad.size].reshape(grad.shape)
            widen_into(wide, grad)
            into += wide

    def _update_pack(self, cid: str, pack: Pack, used: set[str], scale: float) -> None:
        """The optimizer step of pack ``cid``'s members that have a gradient in ``acc``
        (``used``; bsp: the step's sums, asp and ssp: a worker's push): all of them in one step
        of the pack's flat arrays where it can (``Optimizer.step_pack``), else each alone, as
        one not in a pack."""
        members = [c.cid for c in pack.members if c.cid in used]
        if not members:
            return
        if len(members) == len(pack.members):
            self._set_rate()
            if self.opt.step_pack(cid, self._pack_params[cid], self._pack_acc[cid], scale):
                self._stale.update(members)
                return
        for member in members:
            self._update(member, scale=scale)

    def _set_rate(self) -> None:
        """The optimizer's rate for the job's step (--lr-schedule, --warmup-steps)."""
        if self._rate_step != self.step:
            self.opt.lr = self.rate
            self._rate_step = self.step

    def _update(self, cid: str, scale: float = 1.0) -> None:
        """One optimizer step of chunk ``cid`` with the gradient accumulated in ``acc``, at the
        rate of the job's step (--lr-schedule, --warmup-steps; asp and ssp: the slowest
        worker's step, the job's)."""
        self._set_rate()
        self.opt.step(cid, self.params[cid], self.acc[cid], scale=scale)
        self._stale.add(cid)

    def _batch(self, w: _Worker, flags: int) -> list[tuple[str, Any]]:
        """What :meth:`_send` writes to ``w``: the fresh parameter chunks, then the status
        word. Built on the loop's thread (it converts what the last update changed, once)."""
        batch: list[tuple[str, Any]] = []
        outgoing = self._outgoing
        if outgoing is not None and self._stale:  # converted once per update, not per worker
            for cid in self._stale:
                narrow_into(outgoing[cid], self.params[cid])  # to the wire dtype, to nearest
            self._stale.clear()
        for c in self._alone:
            batch.append((c.cid, self.params[c.cid] if outgoing is None else outgoing[c.cid]))
        wire = self._pack_params if outgoing is None else self._pack_outgoing
        batch.extend((p.landing, wire[cid]) for cid, p in self.packs.items())  # one tensor each
        batch.append((status_name(self.cfg.shard), self._status_word(w, flags)))
        return batch

    def _send(
        self,
        w: _Worker,
        flags: int,
        timeout: float | None = None,
        batch: list[tuple[str, Any]] | None = None,
    ) -> None:
        """Fresh parameter chunks, then the status word, into worker ``w``'s memory (within
        ``timeout`` where given; the sender's own timeout, --step-timeout, otherwise).
        ``batch``: :meth:`_batch`'s, built beforehand (on the loop's thread, for a serving
        thread's write)."""
        if batch is None:
            batch = self._batch(w, flags)
        # One operation per worker: one doorbell (shm) or sendmsg (tcp) for the step's tensors.
        if timeout is None:
            self.tx.write_many(batch, peer=w.address)
        else:
            self.tx.write_many(batch, peer=w.address, timeout=timeout)
        w.served = self.step
        if flags == STATUS_STOP:
            w.stopped = True

    def _checkpoint_last(self) -> None:
        """The job's last checkpoint, written before the last worker hears that the job
        ended: one told so exits, and a server lost after telling it (its machine gone) would
        come back from an older checkpoint, its shard's last steps lost, to wait for workers
        that are gone. One that fails still lets them hear it, then ends the run (:meth:`run`)."""
        try:
            self._checkpoint(final=True)
        except PSError as exc:
            self._final_failure = exc

    def _checkpoint(self, *, final: bool = False) -> None:
        """Write the shard's state. One that fails (a full disk, a volume gone) is logged as an
        error and counted, and training goes on: exiting would lose the steps since the last
        checkpoint, and a restarted server would fail the same way. A ``final`` one that fails
        ends the run with PSError (exit 1): the job's result would be lost unsaid."""
        finished = {w.rank: w.step for w in self.workers if w.step >= self.cfg.steps}
        left = {w.rank: w.step for w in self.workers if w.left and w.rank not in finished}
        # lost, and not joined again (not waited for by a server resumed from this)
        lost = {
            w.rank: w.step
            for w in self.workers
            if not w.alive and w.rank not in finished and w.rank not in left
        }
        if self.ckpt is None or (
            final
            and self._saved_step == self.step
            and self._saved_workers == (finished, left, lost)
        ):
            return  # (the last step's is written already: --checkpoint-every divides it)
        started = time.monotonic()
        host = self.place.to_host
        try:
            os.makedirs(os.path.dirname(self.ckpt) or ".", exist_ok=True)
            checkpoint.save(
                self.ckpt,
                self.step,
                {cid: host(value) for cid, value in self.params.items()},
                {k: {s: host(v) for s, v in slots.items()} for k, slots in self.opt.state.items()},
                self.fingerprint,
                self.specs,
                finished,
                left,
                lost,
                fixed=self.fixed,
            )
        except OSError as exc:
            self.stats.checkpoint_failures += 1
            last = "none" if self._saved_step is None else f"step {self._saved_step}"
            what = (
                f"checkpoint at step {self.step} could not be written to {self.ckpt}: "
                f"{exc.strerror or exc} (the last one written: {last})"
            )
            if final:
                raise PSError(f"the final {what}") from None
            self._failing += 1
            now = time.monotonic()
            if now - self._failure_said >= CHECKPOINT_ERROR_EVERY:  # not one a checkpoint
                self._failure_said = now
                again = f", {self._failing} in a row" if self._failing > 1 else ""
                log.error("%s; training goes on%s", what, again)
            return
        if self._failing:
            log.warning(
                "checkpoint at step %d written again, after %d that failed",
                self.step,
                self._failing,
            )
            self._failing, self._failure_said = 0, -math.inf
        self._saved_step, self._saved_workers = self.step, (finished, left, lost)
        self.stats.checkpoints += 1
        self.stats.checkpoint_seconds += time.monotonic() - started
        log.info("checkpoint at step %d written to %s", self.step, self.ckpt)

    def _report(self, step: int, losses: list[float], accuracy: float | None, t0: float) -> None:
        loss = self.last_loss = float(np.mean(losses)) if losses else float("nan")
        if losses and not math.isfinite(loss) and not self._said_diverged:
            # Said once: the job goes on as told (a worker's NaN gradients have made every
            # parameter NaN by now), and without this it ended "done" with the loss at nan.
            self._said_diverged = True
            log.warning(
                "the loss is %s at step %d: training has diverged (the parameters are no longer "
                "finite numbers; a smaller --lr, or the model's own arithmetic?)",
                loss,
                step,
            )
        if accuracy is not None:
            # rank 0 measured it on the parameters it pushed this step's gradients from: those
            # of ``step - 1`` steps
            self.last_accuracy, self.last_accuracy_step = accuracy, step - 1
        seconds = time.monotonic() - t0
        stats = self.stats
        stats.steps += 1
        stats.step_seconds += seconds
        stats.longest_step = max(stats.longest_step, seconds)
        stats.loss, stats.accuracy = loss, self.last_accuracy
        self.on_step(StepReport(step, loss, self.last_accuracy, seconds, self.last_accuracy_step))

    @staticmethod
    def _accuracy(meta: Any) -> float | None:
        return None if math.isnan(meta[4]) else float(meta[4])  # (plan.META_FIELDS)

    # -- the loops -----------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until every worker has done ``steps`` steps (or a stop was requested)."""
        if not self._join():
            # stopped before the job formed (nothing trained, nothing to checkpoint), resumed
            # at its last step, or told that the job ended elsewhere
            if self._ended_elsewhere is not None and not self._needs_init and self.specs:
                # of the job's end: a server restarted from it is done (parameters known: from
                # the checkpoint we resumed from, or rank 0's)
                self._checkpoint(final=True)
            self._ended = (self.resumed_done or self._ended_elsewhere is not None) and not (
                self._stop_requested or self.departed
            )
            return
        self.formed_after = time.monotonic() - self.started_at
        log.info(
            "the job formed %.1f s after this server started: %d of %d workers ready, at step %d",
            self.formed_after,
            sum(w.alive for w in self.workers),
            self.cfg.workers,
            self.step,
        )
        self.started_at = time.monotonic()  # steps/s counts from here, not from start-up
        for w in self.workers:
            if not w.alive:  # (resumed: one that did all its steps before, and exited)
                continue
            # a worker that cannot take them is gone on without, as in any step (this send
            # ended the server with exit 1 before)
            self._serve(w, STATUS_STOP if self.step >= self.cfg.steps else STATUS_RUN)
        try:
            if self.cfg.sync == "bsp":
                self._run_bsp()
            else:
                self._run_async(10**9 if self.cfg.sync == "asp" else self.cfg.staleness)
        except _Departing:
            # Between steps (bsp: the parameters are the last step's until every gradient of
            # the next is in; asp, ssp: between messages): the checkpoint is where the job is.
            self.departed = True
            self._checkpoint(final=True)
            # Without a goodbye, each worker's receiver sees us gone as a loss, and the worker
            # reaches for us again at once. After a clean goodbye it noticed only when its ping
            # failed, 2 s later (PROBE_EVERY): a chaos run's moves took 2.6-2.8 s to train on
            # again, its kills 1.5-1.7 s.
            for w in self.workers:
                if w.address:
                    with contextlib.suppress(tw.TensorWireError):
                        self.tx.remove_peer(w.address, goodbye=False)
            return
        # (bsp returns at the last step or at a stop; asp and ssp once every worker taking
        # part stopped, which only a stop makes them do before their last step, or leaving)
        self._ended = not self._stop_requested
        try:
            if self._final_failure is not None:  # (_checkpoint_last, before the last serve)
                raise self._final_failure
            self._checkpoint(final=True)
        finally:  # (a final checkpoint that fails ends the run: they are told all the same)
            self._tell_those_left_out()

    def _worker_tensors(self, w: _Worker) -> list[str]:
        return [
            *(grad_name(w.rank, c.cid) for c in self._alone),
            *(grad_name(w.rank, cid) for cid in self.packs),
            meta_name(w.rank),
        ]

    def _by_chunk(
        self, make: Callable[[tuple[int, ...]], Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Arrays ``make(shape)`` makes: one per pack (by its name), and one per chunk in the
        plan's order (by its name), a packed chunk's a view of its pack's in the chunk's
        shape."""
        flat = {cid: make((p.size,)) for cid, p in self.packs.items()}
        each = {c.cid: make(c.shape) for c in self._alone}
        for cid, p in self.packs.items():
            each.update((c.cid, view) for c, view in p.views(flat[cid]))
        return flat, {c.cid: each[c.cid] for c in self.chunks}

    def _link_packs(self) -> None:
        """The optimizer's state of each pack's members as slices of one flat state
        (``Optimizer.link_pack``): a step of the whole pack updates one array each."""
        for cid, p in self.packs.items():
            self.opt.link_pack(
                cid,
                [c.cid for c in p.members],
                self._pack_params[cid],
                p.split,
            )

    def _lose(self, w: _Worker, reason: str, *, tell: bool = True, timed_out: bool = False) -> None:
        """Go on without ``w``: forget what it left half sent, stop writing to it. ``tell``: it
        may still run (frozen for a while, its machine slow, or waiting for another server to
        come back), so it is told that it was dropped, and joins again; else it would wait for
        parameters that never come. Once we stop, it is told that we stop instead: joining
        again would wait for us until its --reconnect-timeout (120 s by default), then fail."""
        if not w.stopped and self._leave_pending(w):
            # It said it leaves before we saw it gone (a worker writes its leave, then closes
            # its receiver: a write of ours to it failed in between): it left, as it says
            # (why, and whether a resumed server waits for it, :meth:`_leave`).
            self._leave(w)
            return
        self._part_with(w, "lost", f"lost at step {self.step} ({reason})")
        # Lost past --step-timeout again and again within a step of joining: the worker is
        # not frozen but slower than the timeout allows (its link, its machine, a large
        # model), and takes part one step a join: say so once, rather than only each loss.
        w.quick_losses = w.quick_losses + 1 if timed_out and w.pushed <= 1 else 0
        if w.quick_losses == QUICK_LOSSES:
            log.warning(
                "worker %d was lost %d times in a row past --step-timeout (%g s), each within "
                "a step of joining: its steps take longer than that (its link or machine too "
                "slow for it?); a larger --step-timeout lets it take part",
                w.rank,
                QUICK_LOSSES,
                self.cfg.step_timeout,
            )
        notice = (
            (STATUS_STOP, STOP_NOTICE_TIMEOUT)
            if self._ending
            else (STATUS_DROPPED, DROP_NOTICE_TIMEOUT)
        )
        if tell and self._notify(w, *notice).later:
            # It may be frozen (over grpc a write needs it to answer): its session stays, for
            # the notice it gets when it runs again and asks (_answer_probes).
            w.untold = True
            return
        if tell and self._ending:
            w.stopped = True
        with contextlib.suppress(tw.TensorWireError):
            # One not heard from in time may be frozen: its goodbye would wait GOODBYE_TIMEOUT
            # (5 s, measured) for its answer. While we serve, it is said on a thread of its own
            # (every other worker's step would wait for it), and ends the session cleanly when
            # the worker runs again, before it joins again; stopping, it is not said at all.
            self.tx.remove_peer(w.address, goodbye=not self._stop_requested, wait=False)

    def _leave(self, w: _Worker) -> None:
        """``w`` said it stops: go on without it at once (its gradients will not come)."""
        why = self._take_leave(w)
        self._part_for(w, why)
        if why == LEAVE_JOB_STOPS:
            # Another server said stop. Under bsp it stopped the job, and every worker hears
            # the same: before, they all left, and this server waited for one to join again,
            # then exited 1 (--join-timeout, or --step-timeout: 120 s by default).
            self._heard_end(w)

    def _part_for(self, w: _Worker, why: int) -> None:
        """Go on without ``w``, which left (``why``: plan.LEAVE_*). One that will be started
        again (LEAVE_TO_RETURN) is not done with the job: waited for as one lost (and recorded
        so by checkpoints); the others are stopped, nothing more to tell them as we stop."""
        # (asp, ssp, where a loss found its leave first, _lose: its own step, as _run_async says)
        at = f"at step {self.step}" if self.cfg.sync == "bsp" else f"at its step {w.step}"
        self._part_with(w, "left", f"left {at} ({_WHY_LEFT[why]})")
        w.left = why == LEAVE_ALONE
        w.stopped = why != LEAVE_TO_RETURN
        with contextlib.suppress(tw.TensorWireError):
            self.tx.remove_peer(w.address)

    def _take_leave(self, w: _Worker) -> int:
        """Take ``w``'s leave of this session (:meth:`_leave_pending` found it), and the step
        another server told it to stop at where it sent one (:meth:`_take_told_end`); why it
        left (:meth:`_leave_reason`)."""
        self._leave_pending(w)
        why = LEAVE_JOB_STOPS if w.leaving is None else w.leaving
        w.leaving = None
        self.rx.drain(leave_name(w.rank))
        if why == LEAVE_JOB_STOPS:
            self._take_told_end(w)  # written before the leave, and landed first
        return why

    def _take_told_end(self, w: _Worker) -> None:
        """Take the step ``w`` wrote us as another server told it to stop (plan.ended_name)."""
        name = ended_name(w.rank)
        while self.rx.pending(name):  # bounded: its ring holds two
            try:
                view = wait_past_losses(self.rx, name, 0.0)
            except tw.TensorWireError:
                break  # (lost since: its leave says the rest)
            self._note_told_end(w, view)
            self.rx.release(name)

    @staticmethod
    def _note_told_end(w: _Worker, view: Any) -> None:
        """What ``w``'s ``ended`` message (``view``, not yet released) says."""
        at, how = int(view[0]), int(view[1])
        w.told_end = at if w.told_end is None else max(w.told_end, at)
        w.told_done = w.told_done or how == ENDED_JOB_DONE

    def _take_leaves_of_absent(self) -> None:
        """Take the leave messages of workers not taking part here: one that another server
        told to stop while we were lost, frozen or behind it (restarted from a checkpoint),
        or while we went on without it, tells us so when it stops (:meth:`_heard_end`); one
        that left alone meanwhile is forgotten (its ready, once it joins again, starts it
        anew). One of the session a worker joined with, not ready yet, is kept for its ready
        (``w.leaving``, :meth:`_settle_leaves`): the two may land together, and be taken in
        either order."""
        for w in self.workers:
            if w.alive:
                continue
            while self._leave_pending(w):  # bounded: its ring holds two
                if w.joined and w.session is not None and w.leaving != LEAVE_JOB_STOPS:
                    break  # (its ready may have landed too: kept for it)
                if self._take_leave(w) == LEAVE_JOB_STOPS:
                    self._heard_end(w)

    def _heard_end(self, w: _Worker) -> None:
        """``w`` stopped because another server told it to, at the step it wrote us
        (``w.told_end``; None from an older worker), or because it found the job ended there
        (``w.told_done``). Under bsp, where the job ended, or before the worker's steps were
        done (a stop), that server ended the job: so does this one (:attr:`_ending`), at the
        job's step where it is behind (:meth:`_adopt_end`; under asp and ssp a stop gives the
        worker's own step, not the job's: ours stays). Under asp and ssp, a worker whose steps
        were done there is done here too (each worker ends on its own): not waited for. Before, a
        server lost as the job ended (killed in its last steps, restarted from its checkpoint
        a few steps short) waited for workers that had exited, and at --join-timeout exited 1
        (`bench chaos`, shm ssp, seed 5304)."""
        at, done = w.told_end, w.told_done
        w.told_end, w.told_done = None, False
        if self.done:
            return  # (resumed from the checkpoint of the job's end: we know)
        if self.cfg.sync != "bsp" and not done:
            if at is None:
                return  # an older worker: as before, its leave says no more than that
            if at >= self.cfg.steps:
                if not w.alive:  # (one that left as it was taking part says so, _leave)
                    log.warning(
                        "worker %d did all its steps (%d) on another server while it was not "
                        "taking part here: not waited for",
                        w.rank,
                        at,
                    )
                # its steps as it did them, where we counted fewer (what checkpoints record)
                w.step, w.stopped, w.finished = max(w.step, at), True, True
                if all(x.finished for x in self.workers):
                    self._adopt_end(min(x.step for x in self.workers))
                return
        if at is None:  # (an older worker)
            said, at = "telling it to stop", self.step
        elif self.cfg.sync == "bsp" or done:
            said = f"at step {at}"
        else:  # (asp, ssp: the step it gave is the worker's own; the job's here is ours)
            said, at = f"telling it to stop at its step {at}", self.step
        if self._ended_elsewhere is None:
            log.warning(
                "worker %d says another server ended the job (%s): it ends here too",
                w.rank,
                said,
            )
        self._ended_elsewhere = max(at, self._ended_elsewhere or 0)

    def _adopt_end(self, step: int) -> None:
        """Where the job ended at ``step`` elsewhere, ahead of ours: go there with the
        parameters we have (as :meth:`_catch_up`: the updates since our checkpoint are lost
        to this shard), so that our last checkpoint is of the job's last step, and a server
        restarted from it is done."""
        if step <= self.step:
            return
        log.warning(
            "shard %d is at step %d, behind the job's end at step %d: ending there with the "
            "parameters it has (those of step %d)",
            self.cfg.shard,
            self.step,
            step,
            self.step,
        )
        self.stats.caught_up += step - self.step
        self.step = step

    @staticmethod
    def _leave_reason(view: Any) -> int:
        """Why a worker's leave message (plan.leave_name) says it stops: plan.LEAVE_ALONE (on
        its own, while the job trains on), LEAVE_TO_RETURN (to be started again), or
        LEAVE_JOB_STOPS (another server told it; what an older worker sends, whatever its
        reason)."""
        why = int(view[0]) if view.shape[0] else LEAVE_JOB_STOPS
        return why if why in (LEAVE_ALONE, LEAVE_TO_RETURN) else LEAVE_JOB_STOPS

    def _tell_those_left_out(self, *, take_joins: bool = True) -> None:
        """We stop: tell every worker we know of and did not tell yet (best effort, STOP_GRACE
        for all of them). One we went on without earlier (its step timeout, or lost while it
        lived on) may wait for another server to come back, and one whose join or ready we had
        not taken waits for us; without a word each would wait out its --reconnect-timeout
        (120 s by default) and exit 1. Those we served and those we let go of while stopping
        were told already (:meth:`_send`, :meth:`_lose`). A worker that joins again heeds the
        notice before it says it is ready (PSClient._heed_stop); one of a first join has no
        tensor for it yet, and is not told. ``take_joins``: take the join and ready messages
        that landed since the last look first (not before the job formed: they would plan it)."""
        deadline = time.monotonic() + self.cfg.stop_grace
        if take_joins:
            try:
                self._take_join_messages(during_join=False)
            except PSError as exc:
                log.warning("a worker's join as we stopped: %s", exc)
        for w in self.workers:
            left = deadline - time.monotonic()
            if w.stopped or not w.address or left <= 0:
                continue
            if w.alive and not self._needs_init:
                # ready just now: the last parameters, as the others had them (never the zeros
                # held before rank 0's initial values: a worker saves what it is sent last)
                self._serve(w, STATUS_STOP, max(min(left, STOP_NOTICE_TIMEOUT), OFFER_TIMEOUT))
                continue
            try:
                if w.address not in self.tx.peers:  # let go of earlier: a session again
                    self.tx.add_peer(w.address, connect_timeout=min(left, STOP_NOTICE_TIMEOUT))
            except tw.TensorWireError:
                continue  # gone (its process exited), or unreachable
            left = max(deadline - time.monotonic(), OFFER_TIMEOUT)  # (the handshake took some)
            notice = self._notify(w, STATUS_STOP, min(left, STOP_NOTICE_TIMEOUT))
            w.stopped = not notice.later
            log.info(
                "worker %d, not taking part as we stop, %s",
                w.rank,
                "told that we stop"
                if notice.told
                else f"could not be told that we stop ({notice.why})",
            )
            with contextlib.suppress(tw.TensorWireError):
                self.tx.remove_peer(w.address, goodbye=False)

    def _part_with(self, w: _Worker, event: str, what: str) -> None:
        """What losing ``w`` and its leaving share: it no longer takes part, it is counted and
        logged, and what it left half sent (with the receiver's loss notice) is forgotten, so
        that its successor starts clean."""
        w.alive = w.joined = False
        self.stats.worker_events[event] += 1
        log.warning(
            "worker %d %s; going on with %d worker(s)",
            w.rank,
            what,
            sum(x.alive for x in self.workers),
        )
        self._forget_unclipped(w)
        for name in self._worker_tensors(w):
            self.rx.drain(name)

    def _forget_unclipped(self, w: _Worker) -> None:
        """(asp, ssp, --clip-grad-norm) Hand back the slots of ``w``'s gradients held for a
        meta that will not come (it was lost or left mid-push, or joined again): the push is
        not applied, as one half sent never is."""
        for name, _, _ in w.unclipped:
            with contextlib.suppress(tw.TensorWireError):  # (closed as we stop)
                self.rx.release(name)
        w.unclipped.clear()

    def _claim_dropped_notice(self, w: _Worker) -> None:
        """Write a first notice that says nothing (STATUS_RUN) to ``w``'s ``dropped`` tensor
        now, while it answers: a write's first of a tensor claims it through the receiver's
        control thread, which a frozen worker (the one we drop) cannot answer; later writes go
        straight into its memory (shm) or its socket's buffer (tcp). As we stop (a worker ready
        at our last look, _tell_those_left_out), within the stop notice's time, not the step's."""
        self._notify(w, STATUS_RUN, STOP_NOTICE_TIMEOUT if self._ending else self.cfg.step_timeout)

    def _notify(self, w: _Worker, flags: int, timeout: float) -> _Notice:
        """A status word with ``flags`` in ``w``'s ``dropped`` tensor, best effort. A worker
        that is dead, or has no such tensor (an older one, or one of a first join: it registers
        that tensor once it learns the job's plan), cannot be told, and one that died is lost
        at our next write anyway. One whose write timed out may be frozen: told later."""
        try:
            self.tx.write(
                dropped_name(self.cfg.shard),
                self._status_word(w, flags),
                peer=w.address,
                timeout=timeout,
            )
        except tw.WireTimeoutError as exc:
            return _Notice(told=False, later=True, why=str(exc))
        except tw.RemoteProtocolError as exc:
            # busy: an earlier session of ours still holds it (see _refused)
            return _Notice(told=False, later=exc.held_by_another, why=str(exc))
        except tw.TensorWireError as exc:
            return _Notice(told=False, later=False, why=str(exc))
        return _Notice(told=True, later=False)

    def _status_word(self, w: _Worker, flags: int) -> Any:
        """What a worker reads in its status and ``dropped`` tensors: [the step we expect of
        it, ``flags``, our step, how we run (HOW_ bits)]."""
        how = (HOW_ASYNC if self.cfg.sync != "bsp" else 0) | (
            HOW_MAY_CATCH_UP if self._may_catch_up else 0
        )
        status = np.array([w.step, flags, self.step, how], dtype=np.int64)
        assert status.shape == (STATUS_FIELDS,) and STATUS_HOW == 3
        return status

    def _rejoin(self) -> None:
        """Workers (re)started after a loss join at the current step; those we went on
        without, and that still wait for us, are told again."""
        self._take_join_messages(during_join=False)
        self._answer_probes()

    def _answer_probes(self) -> None:
        """Read every worker's probes, and answer them (:meth:`_answer_probe`); let go of the
        sessions kept for untold workers that are gone meanwhile (:meth:`_forget_if_gone`)."""
        for w in self.workers:
            if self.rx.pending(probe_name(w.rank)):
                self._answer_probe(w)
            elif w.untold:
                self._forget_if_gone(w)

    def _forget_if_gone(self, w: _Worker) -> None:
        """``w``, dropped and not told (its notice timed out), keeps its session for the
        notice it gets when it asks; once it is known gone (its process exited, or it left our
        heartbeats unanswered) nobody will ask: the session goes. A worker frozen that long
        learns it when it runs again: our session's end, at its receiver, ends its wait for
        parameters, and it joins again."""
        try:
            why = self.tx.lost(w.address)
        except tw.TensorWireError:  # no longer a peer
            why = "no longer connected"
        if why is None:
            return
        log.warning(
            "worker %d, which we went on without and could not tell, is gone (%s): its "
            "session is closed",
            w.rank,
            why,
        )
        w.untold = False
        with contextlib.suppress(tw.TensorWireError):
            self.tx.remove_peer(w.address)

    def _gone(self, w: _Worker) -> str | None:
        """Why ``w`` is known gone, as our sender to it sees it: its process exited (on this
        host), it left our heartbeats unanswered, or it ended its session; None while it may
        live. Never waits. A worker that died before it pushed claimed no tensor of ours, so
        no loss notice tells us: before, it was lost only at --step-timeout (120 s by
        default), and every other worker waited with us."""
        try:
            return self.tx.lost(w.address)
        except tw.TensorWireError:  # not (or no longer) a peer: nothing to go by
            return None

    def _answer_probe(self, w: _Worker) -> None:
        """Tell ``w``, which asks whether we still count on it (it has waited PROBE_EVERY for
        our parameters), that we dropped it, if we went on without it and our notice timed
        out: over grpc a write needs the worker to answer, so a frozen worker was not told,
        and would otherwise learn it only when it misses our heartbeats for its heartbeat
        timeout (30 s by default), if we stopped them, or never. Its session was kept for
        this: a new one could not write a tensor the old one holds. Probes of workers taking
        part, or told already, are read and forgotten."""
        self.rx.drain(probe_name(w.rank))
        if not w.untold or w.alive or w.joined or self.rx.pending(join_name(w.rank)):
            return
        notice = self._notify(w, STATUS_DROPPED, DROP_NOTICE_TIMEOUT)
        log.warning(
            "worker %d, which we went on without, still waits for us: %s",
            w.rank,
            "told it again"
            if notice.told
            else f"telling it failed again ({notice.why})"
            if notice.later
            else f"it cannot be told ({notice.why})",
        )
        if not notice.later:
            w.untold = False
            with contextlib.suppress(tw.TensorWireError):
                self.tx.remove_peer(w.address)

    def _collect(self, w: _Worker, heard: float) -> tuple[dict[str, Any], list[str]] | None:
        """All of ``w``'s gradient chunks and its meta for this step, held (not yet released);
        None for a worker on probation that has sent none yet. ``w`` is lost once nothing came
        for --step-timeout since ``heard``: the latest of when this step's wait began, when a
        worker's gradients last landed and, once a step after a loss, the moment that leaves
        the others LOSS_GRACE (_run_bsp). Before, each worker had its own --step-timeout from
        when the server began to wait for it: K workers silent at once (waiting for a frozen
        server) were dropped one a step timeout after another, and the job stalled K times as
        long.

        A rejoined worker is on probation until its first gradients land: with several
        shards, each admits it at the end of its own step, and two shards may be a step apart
        (one waits for a worker the other already heard from). Waiting for it before it holds
        every shard's parameters would wait for what it cannot send, while it waits for the
        shard that waits for us. Its first gradients show it holds them all: from then on it
        is waited for like any worker. Gradients of a step already done (sent while it caught
        up) are dropped."""
        names = self._worker_tensors(w)
        if self.rx.pending(join_name(w.rank)):
            # it joined again (it reconnected after losing a server): seen before waiting for
            # gradients that will not come, not after REJOIN_CHECK_EVERY each (with several
            # workers rejoining, those waits added up past the other servers' step timeouts)
            raise _WorkerLost("it joined again", tell=False)
        deadline = heard + self.cfg.step_timeout
        while True:
            # Parameters owed to a worker on probation (its slot was full) go as soon as its
            # slot is free, not at the step's end: once gradients of an earlier step end its
            # probation (pushed as it left our slot), this step waits for its gradients, which
            # it sends only once it holds this step's parameters. Before, each waited for the
            # other until --step-timeout dropped it (see _serve_on_probation).
            retry = self._pay_owed()
            if not w.alive:
                return None  # it took none of them within --step-timeout: lost (_pay)
            left = deadline - time.monotonic()
            wait = 0.0 if w.probation else max(min(left, REJOIN_CHECK_EVERY), 0.0)
            if retry is not None:
                wait = min(wait, retry)
            wait = self._within_stop_grace(wait)
            try:
                # Taken together once all have landed: on a loss or a timeout none is held.
                got = self.rx.wait_all(names, timeout=wait)
            except tw.PeerLostError as exc:
                raise _WorkerLost(str(exc)) from None
            except tw.WireTimeoutError:
                self._check_on(w, self._check_catch_up)
                if w.probation:
                    return None
                if time.monotonic() >= deadline:
                    raise _WorkerLost(
                        f"nothing for {self.cfg.step_timeout:g} s", timed_out=True
                    ) from None
                grace = self._stop_overdue()
                if grace is not None:  # stopping: told that we stop (_lose)
                    raise _WorkerLost(f"nothing within {grace:g} s of the stop") from None
                continue
            w.probation = False
            if int(got[meta_name(w.rank)][0]) < self.step:
                self.rx.release_many(names)  # an earlier step's: it is catching up
                continue
            return got, names

    def _check_on(self, w: _Worker, then: Callable[[], None] | None = None) -> None:
        """What a wait for worker ``w``'s messages looks at each time it times out: a stop
        asked (raises), ``w``'s leave (:class:`_WorkerLeft`), ``then``, the probes, and ``w``
        joining again or known gone (:class:`_WorkerLost`)."""
        self._check_departure()
        if self._leave_pending(w):
            raise _WorkerLeft
        if then is not None:
            then()
        self._answer_probes()
        if self.rx.pending(join_name(w.rank)):
            # what we wait for will not come: it is joining afresh (also one on probation:
            # its join would otherwise wait until it was lost, and it waits for our
            # parameters meanwhile)
            raise _WorkerLost("it joined again", tell=False)
        gone = self._gone(w)
        if gone is not None:
            raise _WorkerLost(gone)

    def _check_catch_up(self) -> None:
        """:class:`_CatchUp` where the workers asked us to go on at a later step (and we may)."""
        self._read_catch_up()
        if self._may_catch_up and self._asked_step > self.step:
            raise _CatchUp(self._asked_step)

    def _read_catch_up(self) -> None:
        """Take in the workers' requests to go on at a later step (into ``_asked_step``)."""
        for w in self.workers:
            name = catch_up_name(w.rank)
            while self.rx.pending(name):  # bounded: its ring holds two
                asked = int(wait_past_losses(self.rx, name, 0.0)[0])
                self._asked_step = max(self._asked_step, asked)
                self.rx.release(name)

    def _stranded_step(self) -> int | None:
        """The step to go on at when this step can never end: every worker taking part is on
        probation (each joined again and has pushed nothing since), none pushed a gradient of
        it, and a worker asked us for the next step, which it holds from the other servers.

        How it comes about: each server admits a returning worker at the end of its own step,
        so one may be a step behind another, and a worker skips the messages of the servers
        behind until they catch up. They do when some worker taking part pushes their step's
        gradients; when every worker was dropped and came back (frozen past --step-timeout,
        restarted), none will, and the job would wait for ever. Nobody holds this step's
        gradients then: going on at the next step with the parameters we have loses no
        update. None when some worker may still push (it is waited for, as usual)."""
        alive = [w for w in self.workers if w.alive]
        if not alive or not all(w.probation for w in alive):
            return None
        self._read_catch_up()
        return self.step + 1 if self._asked_step > self.step else None

    def _catch_up(self, step: int, *, stranded: bool = False) -> None:
        """Go on at the job's ``step``, from the step we came back at. With several shards, one
        restarted alone (killed, its pod or node replaced) comes back at its checkpoint's step,
        or at step 0 started afresh, while the others went on; its workers see that in the
        status words and ask it, before they push a gradient, to go on at the others' step.
        It keeps the parameters it came back with (its checkpoint's, or rank 0's copy when it
        started afresh): this shard loses the updates since then (at most --checkpoint-every
        steps), the others lose none, and the job goes on instead of stopping. Replaying the
        lost steps would need every worker's gradients of each, which nobody keeps.
        ``stranded``: a step behind the others with no worker to push it
        (:meth:`_stranded_step`); nothing is lost."""
        if stranded:
            log.warning(
                "shard %d is at step %d, a step behind the job's other servers, and every "
                "worker joined again since it began: going on at step %d with its parameters",
                self.cfg.shard,
                self.step,
                step,
            )
        else:
            source = "rank 0's copy" if self._has_init_tensors else "its checkpoint's"
            log.warning(
                "shard %d came back at step %d, behind the job's other servers at step %d: "
                "going on at their step with the parameters it came back with (%s)",
                self.cfg.shard,
                self.step,
                step,
                source,
            )
        self.stats.caught_up += step - self.step
        self.step = step
        self._may_catch_up = False

    def _run_bsp(self) -> None:
        while self.step < self.cfg.steps:
            self._check_departure()
            t0 = time.monotonic()
            losses: list[float] = []
            accuracy: float | None = None
            contributors = 0
            used: set[str] = set()  # chunks some worker pushed a gradient of (plan.flag_slots)
            heard = time.monotonic()  # the last time a worker's gradients landed (see _collect)
            graced = False  # LOSS_GRACE given this step
            for w in self.workers:
                if not w.alive:
                    continue
                waited = time.monotonic()
                try:
                    collected = self._collect(w, heard)
                except _WorkerLost as exc:
                    self._lose(w, str(exc), tell=exc.tell, timed_out=exc.timed_out)
                    if not graced:
                        graced = True
                        grace = min(LOSS_GRACE, self.cfg.step_timeout)
                        heard = max(heard, time.monotonic() - self.cfg.step_timeout + grace)
                    continue
                except _WorkerLeft:
                    self._leave(w)
                    continue
                except _CatchUp as exc:
                    # no worker pushed a gradient of our step: they ask before they push
                    self._catch_up(exc.step)
                    contributors = 0
                    losses.clear()
                    break
                finally:
                    self.stats.gradient_wait[w.rank] += time.monotonic() - waited
                if collected is None:
                    continue  # rejoined, on probation: nothing of it yet
                heard = time.monotonic()
                got, held = collected
                meta = got[meta_name(w.rank)]
                if int(meta[0]) != self.step:
                    raise PSError(f"worker {w.rank} sent step {int(meta[0])}, expected {self.step}")
                flags = meta.tolist()  # (a list's items are read faster than an array's)
                self._accumulate(w.rank, got, flags, contributors == 0, used)
                contributors += 1
                w.pushed += 1
                losses.append(float(meta[1]))
                accuracy = self._accuracy(meta) if accuracy is None else accuracy
                self.rx.release_many(held)
            if contributors:
                # The average over the workers that finished the step: a lost worker's share
                # is rescaled away, not counted as zero. One that had no gradient of a chunk
                # counts as zeros, as in PyTorch's DistributedDataParallel; a chunk none had
                # one of is not stepped (before 2026-12-04 it was, on zeros: momentum and
                # weight decay moved a parameter its model never used).
                scale = (1.0 / contributors) * self._clipping(used, contributors)
                for c in self._alone:
                    if c.cid in used:
                        self._update(c.cid, scale=scale)
                for cid, p in self.packs.items():
                    self._update_pack(cid, p, used, scale)
                self.step += 1
                self._may_catch_up = False  # the workers pushed for our step: we are the job's
                if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
                    self._checkpoint()
            elif (stranded := self._stranded_step()) is not None:
                self._catch_up(stranded, stranded=True)
            elif any(w.alive for w in self.workers):
                # every worker taking part is on probation and sent nothing yet: not a spin
                time.sleep(PROBATION_POLL)
            self._rejoin()
            if not any(w.alive for w in self.workers) and not self._ending:
                self._await_any_worker()
            if self._ended_elsewhere is not None:
                self._adopt_end(self._ended_elsewhere)
            for w in self.workers:
                w.step = self.step
            done = self._ending
            if done:
                self._checkpoint_last()
            until = time.monotonic() + min(self.cfg.step_timeout, self.cfg.stop_grace)
            ready: list[_Worker] = []  # served the step's parameters together (_serve_all)
            for w in self.workers:
                # (not again what it was sent: a round that ended no step, see _Worker.served)
                if not w.alive or not (done or w.served != self.step):
                    continue
                if done:
                    # The last parameters wait for the slot a STOP_GRACE from the end of the
                    # last step at most: a worker that holds our last ones while it waits for
                    # another server (joined again, not yet taken back there) frees it only
                    # when that server serves it. Past it, it is told by a notice that we stop
                    # (_lose). Before, the write waited out --step-timeout (120 s by default,
                    # past an orchestrator's grace period).
                    self._serve(w, STATUS_STOP, max(until - time.monotonic(), OFFER_TIMEOUT))
                elif w.probation:
                    self._serve_on_probation(w)
                else:
                    ready.append(w)
            self._serve_all(ready)
            if contributors:
                self._report(self.step, losses, accuracy, t0)
            if done:
                break

    def _serve(self, w: _Worker, flags: int, timeout: float | None = None) -> None:
        """:meth:`_send`, going on without a worker that cannot take the parameters."""
        try:
            self._send(w, flags, timeout)
        except tw.TensorWireError as exc:
            self._served(w, exc)
        else:
            self._served(w, None)

    def _served(self, w: _Worker, failure: BaseException | None) -> None:
        """What follows a write of parameters to ``w`` that ended with ``failure`` (None:
        sent): one it cannot take is gone on without."""
        if failure is None:
            w.heard = time.monotonic()  # (asp, ssp) its silence counts from here
        elif isinstance(failure, tw.PeerLostError):
            self._lose(w, str(failure), tell=False)  # its receiver is gone
        elif isinstance(failure, tw.WireTimeoutError):
            # frozen, or too slow to take them (grpc, or a tcp socket's buffer full)
            self._lose(w, f"it took no parameters in time: {failure}", timed_out=True)
        elif isinstance(failure, tw.RemoteProtocolError):
            self._lose(w, _refused(failure))
        else:
            raise failure

    def _serve_all(self, ready: list[_Worker]) -> None:
        """(bsp) :meth:`_serve` each of ``ready`` the step's parameters (STATUS_RUN): one after
        another (--serve-threads 1, the default), or at once from the serving threads. One
        after another, each worker's wait begins when the previous one's copy ended, and one
        slow to take them (a full socket buffer, a frozen worker) holds up the others' for as
        long; at once, a pool's hand-off costs small writes more than it saves. With 2 workers
        and 25 MB of parameters on 2 cores, the writes took 12.7-72.9 ms a step one after the
        other and 14-38 % less at once, in each of 10 jobs (docs/serve-threads-2026-12-03/).
        What follows each write (a loss) is done here, in the workers' order. Writes from
        several threads go to different receivers, each under its own lock in the sender."""
        if not ready:
            return
        began = time.monotonic()
        pool = self._serving_pool(len(ready))
        if pool is None:
            for w in ready:
                self._serve(w, STATUS_RUN)
        else:
            batches = [self._batch(w, STATUS_RUN) for w in ready]
            writes = [
                pool.submit(self._send, w, STATUS_RUN, None, batch)
                for w, batch in zip(ready, batches, strict=True)
            ]
            futures.wait(writes)  # (each ends within the sender's timeout, --step-timeout)
            for w, write in zip(ready, writes, strict=True):
                self._served(w, write.exception())
        self.stats.serves += 1
        self.stats.serve_seconds += time.monotonic() - began

    def _serving_pool(self, workers: int) -> ThreadPoolExecutor | None:
        """The threads that serve ``workers`` at once (as many as the job's workers, up to
        the cores and MAX_SERVE_THREADS), made at the first need; None where one thread serves
        them (one worker, --serve-threads 1, or a shard on a GPU, whose copies from several
        threads have not run on one yet)."""
        cfg = self.cfg
        threads = cfg.serve_threads or min(cfg.workers, os.cpu_count() or 1, MAX_SERVE_THREADS)
        if workers < 2 or threads < 2 or self.place.name != "cpu":
            return None
        if self._serve_pool is None:
            self._serve_pool = ThreadPoolExecutor(threads, thread_name_prefix="tensorwire-serve")
        return self._serve_pool

    def _serve_on_probation(self, w: _Worker) -> None:
        """(bsp) :meth:`_serve` a worker that joined again and pushed nothing since, without
        waiting for its slot past OFFER_TIMEOUT: it may still hold our parameters of an earlier
        step while it waits for another server, which takes it back at the end of its own step,
        and that step waits for the other workers, who wait for our parameters. Waiting for
        the slot (--step-timeout) held them all up until we dropped it; it joined again, and
        the job went a step per --step-timeout for 10-45 s (chaos runs: 2 x 4, bsp, a worker
        frozen twice, 2.7 s apart; seed 144). A slot still full is tried again every
        OWED_RETRY while we wait for gradients (:meth:`_collect`), and at our next step (the
        worker skips to the later step); one that stays full for --step-timeout loses the
        worker, as a write that waited that long did."""
        if self.tx.transport_of(w.address) in CALL_TRANSPORTS:
            self._serve(w, STATUS_RUN)  # a call the worker answers: whole, waiting, as before
            return
        if w.owed is None:
            w.owed, w.owed_since = STATUS_RUN, time.monotonic()
            self._owing = True
        # sent, or still owed (tried again while we wait for gradients, _collect, and at our
        # next step), or lost past the timeout
        self._pay(w)

    def _offer(self, w: _Worker, flags: int) -> None:
        """(asp, ssp) :meth:`_serve`, without holding up every other worker for ``w``: where its
        slot still holds our last parameters, the new ones are owed, and :meth:`_pay_owed`
        sends them once it is free. Before, the server waited for that slot (--step-timeout)
        and read nothing else meanwhile: after a lone restart, a worker holding one server's
        parameters while it waited for another's held up the first, and the servers waited on
        each other until the step timeout dropped a worker (chaos runs: 2-7 s stalls with a
        2 s step timeout; 120 s by default)."""
        if w.owed is not None:  # one message owed at a time: the freshest parameters go
            w.owed = STATUS_STOP if STATUS_STOP in (w.owed, flags) else flags
            return
        if self.tx.transport_of(w.address) in CALL_TRANSPORTS:
            # A write there is a call the worker answers: one it is slow to answer would time
            # out after a part of the parameters went, so they go whole, waiting, as before.
            self._serve(w, flags)
            return
        w.owed, w.owed_since = flags, time.monotonic()
        self._owing = True
        self._pay(w)

    def _pay(self, w: _Worker) -> None:
        """Send ``w`` the parameters owed to it, if its slot is free; lose it if it has not
        freed it within --step-timeout (frozen, or gone without a word)."""
        flags = w.owed
        assert flags is not None
        try:
            self._send(w, flags, timeout=OFFER_TIMEOUT)
        except tw.WireTimeoutError as exc:
            grace = self._stop_overdue()  # stopping: not waited for past the stop's grace
            if grace is not None:
                w.owed = None
                self._lose(w, f"it took no parameters within {grace:g} s of the stop")
            elif time.monotonic() - w.owed_since > self.cfg.step_timeout:
                w.owed = None
                self._lose(w, f"it took no parameters in time: {exc}", timed_out=True)
            else:
                w.owed_next = time.monotonic() + OWED_RETRY
            return
        except tw.PeerLostError as exc:
            w.owed = None
            self._lose(w, str(exc), tell=False)  # its receiver is gone
            return
        except tw.RemoteProtocolError as exc:
            w.owed = None
            self._lose(w, _refused(exc))
            return
        w.owed = None
        w.heard = time.monotonic()  # its silence counts from here

    def _pay_owed(self) -> float | None:
        """Each worker owed parameters whose time to try again has come gets them where its
        slot is free now. Returns the seconds until the next try (None: none owed). At every
        turn of the asp/ssp loop, and of a bsp wait for gradients (_collect): with none owed,
        one look at a flag."""
        if not self._owing:
            return None
        now = time.monotonic()
        for w in self.workers:
            if w.owed is None:
                continue
            if not w.alive:
                w.owed = None  # lost meanwhile: a join sends it fresh ones
            elif w.owed_next <= now:
                self._pay(w)
        tries = [w.owed_next for w in self.workers if w.owed is not None]
        if not tries:
            self._owing = False
            return None
        return max(0.0, min(tries) - time.monotonic())

    @property
    def _training(self) -> bool:
        """A worker takes part and has not stopped (one that left, or was told to stop, may
        still be alive here until its loss is seen)."""
        return any(w.alive and not w.stopped for w in self.workers)

    def _await_any_worker(self) -> None:
        """Every worker taking part was lost: wait for one to join again, as long as for the
        job's first join (--join-timeout), or a step (--step-timeout) where longer. Dropped
        workers join again by themselves, once they read the notice (a wait for parameters
        reads it after PROBE_EVERY) or once restarted; a short --step-timeout (chaos runs: 2 s)
        ended the job (exit 1) before they could, when every worker was dropped at once (one
        frozen over grpc held another server's writes, which left the others silent here)."""
        patience = max(self.cfg.join_timeout, self.cfg.step_timeout)
        deadline = time.monotonic() + patience
        log.warning("every worker was lost: waiting up to %g s for one to join again", patience)
        while not self._training:
            self._check_departure()
            if self._ending:
                return  # asked to stop while waiting, or told the job ended: it ends here
            if self.cfg.sync != "bsp" and all(w.stopped for w in self.workers):
                return  # (asp, ssp) every worker is done: told so by those away
            if time.monotonic() > deadline:
                raise PSError(
                    f"every worker was lost and none joined again within {patience:g} s "
                    "(--join-timeout, or --step-timeout where longer)"
                )
            time.sleep(0.1)
            self._rejoin()

    def _run_async(self, staleness: int) -> None:
        """ASP (``staleness`` unbounded) and SSP: each gradient chunk is applied as it lands,
        and a worker that finished a step gets fresh parameters at once, unless it is more
        than ``staleness`` steps ahead of the slowest worker taking part (it waits for it).

        A worker is gone on without, as in bsp, when its sender is lost, or when nothing came
        from it for --step-timeout while we did not hold it back (it is told, as it may still
        run); the slowest of the others then sets the pace. One that joins again is served at
        once, at the step of the slowest worker. The job ends when every worker has stopped
        (its steps done, or it left), or at a stop request; with none training and some lost,
        they are waited for (:meth:`_await_any_worker`)."""
        # a gradient's tail is its chunk's name, or its pack's
        expected = {c.cid for c in self._alone} | set(self.packs) | {"meta"}
        held: list[_Worker] = []  # done a step, kept waiting by the staleness bound
        t0 = time.monotonic()
        for w in self.workers:
            w.heard = t0
        while True:
            self._check_departure()
            for w in self.workers:
                if w.alive and w.leaving is not None:  # its leave came with its ready
                    why, w.leaving = w.leaving, None
                    self._async_leave(w, why)
                    self._release_held(held, staleness)
            if not self._training:
                # Every worker stopped (its steps done, or it left), or the job's are: it
                # ended. Else some were lost and may join again (restarted, or dropped and
                # told): waited for. Before, one that had left, still alive here, made the
                # job end as the others were lost (all frozen behind a server restarting:
                # `bench chaos --steps`, nixl asp, seed 4904), short of its steps, and the
                # workers that came back heard that it had ended.
                # A worker joining again meanwhile (its join or ready here, not taken yet:
                # messages are taken in turn) takes part: the job has not ended. Before, one
                # started again after it left, its ready not yet taken as the last other
                # worker left, found the job ended (`bench chaos` seed 1 of `-k
                # never_stops_the_last_worker`, under load).
                joining = any(self.rx.pending(join_name(w.rank)) for w in self.workers)
                if self._ending or (all(w.stopped for w in self.workers) and not joining):
                    return
                if joining:
                    self._take_join_messages(during_join=False)
                    continue
                self._await_any_worker()  # raises if none comes back in time
            retry = self._pay_owed()
            wait = REJOIN_CHECK_EVERY if retry is None else min(retry, REJOIN_CHECK_EVERY)
            # (not cut to nothing past a stop's grace: _lose_silent let go of whom it could by
            # then, and those it kept would make this loop spin)
            wait = self._within_stop_grace(wait) or wait
            try:
                name, view = self.rx.wait_any(timeout=wait)
            except tw.WireTimeoutError:
                self._lose_silent(held)
                self._release_held(held, staleness)
                continue
            except tw.PeerLostError as exc:
                found = self._writer_of(exc.tensor)
                if found is None or not found[0].alive:
                    continue  # a message of no worker taking part: nothing waits for it
                self._lose(found[0], str(exc), tell=False)
                self._release_held(held, staleness)
                continue
            found = self._writer_of(name)
            if found is None:
                self.rx.release(name)
                continue
            w, kind, tail = found
            if kind == "join":
                if w.alive:  # restarted before its loss was seen: this one goes on anew
                    self._lose(w, "it joined again", tell=False)
                    self._release_held(held, staleness)
                self._on_join(w, view, during_join=False)
                continue
            if kind == "probe":
                self.rx.release(name)
                self._answer_probe(w)
                continue
            if kind == "leave":
                # it stops (another server said stop, or it was stopped): nothing more will
                # come from it
                why, earlier = self._leave_reason(view), w.earlier(leave_session(view))
                self.rx.release(name)
                if earlier:
                    continue  # an earlier process's, of its rank
                self._async_leave(w, why)
                self._release_held(held, staleness)
                continue
            if kind == "ended":  # (its leave follows)
                self._note_told_end(w, view)
                self.rx.release(name)
                continue
            if not w.alive or kind not in ("grad", "meta"):
                self.rx.release(name)  # (catch-up: bsp only) or what a lost worker left
                continue
            w.heard = time.monotonic()
            if kind == "grad":
                w.got.add(tail)
                if self._clip_each and "meta" not in w.got:
                    # clipped by the norm its meta brings: it waits in its slot until then
                    w.unclipped.append((name, tail, view))
                    continue
                self._apply_push(w, tail, view)
            else:
                if w.meta is None or w.meta.shape != view.shape:
                    w.meta = view.copy()  # (once per worker: later pushes' copy into it)
                else:
                    np.copyto(w.meta, view)
                w.got.add("meta")
                if self._clip_each:  # (its whole gradient's norm, as one process clips it)
                    w.scale = self._clip_factor(float(w.meta[META_SQUARES]))
                for cid in w.deferred:
                    if w.meta[self._flag_at[cid]] != 0.0:  # a gradient of zeros
                        self.acc[cid][...] = 0
                        self._update(cid)
                w.deferred.clear()
                for held_name, held_tail, held_view in w.unclipped:
                    self._apply_push(w, held_tail, held_view)
                    self.rx.release(held_name)
                w.unclipped.clear()
            self.rx.release(name)
            if w.got != expected:
                continue
            w.got = set()
            # Its step as it counts it (the furthest any server told it, in its meta), where we
            # counted fewer: restarted alone from a checkpoint, or having taken it back at our
            # own slowest step, we counted differently from the other servers. Each server
            # held back a different worker then, and each waited on one another (seen in
            # chaos runs: 2 s stalls after a lone restart, ended by dropping workers).
            w.step = max(w.step, int(w.meta[0])) + 1
            w.pushed += 1
            self._report(w.step, [float(w.meta[1])], self._accuracy(w.meta), t0)
            t0 = time.monotonic()
            held.append(w)
            self._release_held(held, staleness)  # advances the global step first
            self._lose_silent(held)

    def _apply_push(self, w: _Worker, tail: str, view: Any) -> None:
        """(asp, ssp) Apply what landed of ``w``'s push in ``grad/<rank>/<tail>`` (``view``: a
        chunk's gradient, or a pack of them) as it lands: the gradient of one worker, one
        chunk, one step, at :attr:`push_lr` times ``w.scale`` (clipped: its meta came first).
        Zeros that come before the step's meta may be no gradient at all (plan.flag_slots):
        they carry nothing to keep, so the meta decides, when it comes."""
        pack = self.packs.get(tail)
        landed = [(tail, view)] if pack is None else [(c.cid, part) for c, part in pack.views(view)]
        pushed: list[bool] = []
        for cid, grad in landed:
            if "meta" in w.got:
                pushed.append(w.meta[self._flag_at[cid]] != 0.0)
            else:
                pushed.append(bool(grad.any()))
                if not pushed[-1]:
                    w.deferred.add(cid)
        if pack is not None and all(pushed):  # the pack whole, as under bsp
            self._take(self._pack_acc[tail], view)
            self._update_pack(tail, pack, {c.cid for c in pack.members}, w.scale)
        else:
            for (cid, grad), has in zip(landed, pushed, strict=True):
                if has:
                    self._take(self.acc[cid], grad)
                    self._update(cid, scale=w.scale)

    def _async_leave(self, w: _Worker, why: int) -> None:
        """(asp, ssp) ``w`` said it leaves, ``why``: nothing more will come from it."""
        if why == LEAVE_JOB_STOPS:
            self._take_told_end(w)
        if w.alive and not w.stopped and why == LEAVE_TO_RETURN:
            # not done: out of the slowest's count, waited for as one lost
            self._part_for(w, why)
        elif w.alive and not w.stopped:
            w.stopped, w.left = True, why == LEAVE_ALONE
            self.stats.worker_events["left"] += 1
            log.warning("worker %d left at its step %d (%s)", w.rank, w.step, _WHY_LEFT[why])
        if why == LEAVE_JOB_STOPS:  # (also one not taking part: told while we were away)
            self._heard_end(w)

    def _writer_of(self, name: str | None) -> tuple[_Worker, str, str] | None:
        """The worker that writes tensor ``name`` of ours (``kind/<rank>[/tail]``), the kind,
        and the tail (a gradient's chunk); None for a tensor no worker owns (rank 0's initial
        values) or no name. Once per message of asp and ssp: string splits, not a pattern."""
        kind, _, rest = (name or "").partition("/")
        if kind not in WORKER_KINDS:
            return None
        rank, _, tail = rest.partition("/")
        r = int(rank)
        return (self.workers[r], kind, tail) if 0 <= r < len(self.workers) else None

    def _floor(self, *, stopped: bool) -> int:
        """(asp, ssp) The slowest worker's step, among those taking part; ``stopped``: those
        that stopped too, but for one that left on its own (the job trains on without it)."""
        steps = [
            w.step for w in self.workers if w.alive and not w.left and (stopped or not w.stopped)
        ]
        return min(steps) if steps else self.step

    def _advance_floor(self) -> None:
        """(asp, ssp) The global step is the slowest worker's, a stopped one's too (what the
        job did, as the checkpoint records it, when the job stops and every worker leaves), not
        a lost one's, nor one's that left on its own: the job trains on, and checkpoints with
        it. Before, a worker stopped alone held the job's step, and no checkpoint was written
        after it left."""
        floor = self._floor(stopped=True)
        if floor > self.step:  # the slowest worker finished a step: that is a global step
            self.step = floor
            if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
                self._checkpoint()

    def _release_held(self, held: list[_Worker], staleness: int) -> None:
        """(asp, ssp) Let go on every held worker within ``staleness`` steps of the slowest
        one taking part, or tell it to stop; forget those no longer taking part."""
        self._advance_floor()
        floor = self._floor(stopped=False)  # one that left would hold the others back for good
        for h in list(held):
            if not h.alive or h.stopped:  # lost, or it left
                held.remove(h)
            elif h.step >= self.cfg.steps or self._ending:
                held.remove(h)
                if all(w.stopped for w in self.workers if w.alive and w is not h):
                    self._checkpoint_last()  # the last one to hear it: the job ends here
                elif not self._stop_requested:
                    # It did all its steps, and exits once told: checkpointed first, so that
                    # this server, restarted, does not wait for it to join (_resume).
                    self._checkpoint()
                self._offer(h, STATUS_STOP)
            elif h.step - floor <= staleness:
                held.remove(h)
                self._offer(h, STATUS_RUN)

    def _lose_silent(self, held: list[_Worker]) -> None:
        """(asp, ssp) Go on without each worker taking part that sent nothing for
        --step-timeout while we did not hold it back (frozen, or its machine gone). What it
        sent and we have not read yet (we were held up, writing to a frozen one) counts."""
        now = time.monotonic()
        grace = self._stop_overdue()  # stopping: those not stopped by now are not waited for
        for w in self.workers:
            silent = grace is not None or now - w.heard > self.cfg.step_timeout
            if silent and w.alive and not w.stopped and w not in held and w.owed is None:
                if any(self.rx.pending(name) for name in self._worker_tensors(w)):
                    w.heard = now
                elif grace is not None:
                    self._lose(w, f"not stopped within {grace:g} s of the stop")
                else:
                    self._lose(w, f"nothing for {self.cfg.step_timeout:g} s", timed_out=True)
