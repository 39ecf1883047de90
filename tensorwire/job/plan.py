"""The parameter-server protocol: how parameters are sharded and what every tensor is called.

Both ends derive everything from here; the servers know no model. A worker *joins* each server by
writing its receiver's address and its parameters' specs (name, shape, dtype) into its ``join``
tensor; once every worker has joined with the same specs, each server computes the plan from them,
registers, for each worker, one gradient tensor per parameter chunk it owns (and, unless it
resumes from a checkpoint, an ``init`` tensor per chunk that rank 0 fills with the initial
values), and each worker registers each parameter with :meth:`Receiver.register_parts`, one part
per chunk, so the servers' writes land side by side in the model's own parameter storage. A worker
learns the plan from the servers' address books (the gradient tensors they publish), so a worker
can never disagree with the servers about it; it then says it is ready on the same ``join`` tensor.
Small whole parameters travel in packs (:class:`Pack`, :func:`packs`): one gradient tensor and
one parameter tensor per pack instead of one per parameter; the worker computes the packs from
the plan and the published ``--pack-bytes``, and checks them against the names the server
published.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack
import numpy as np

ITEM = 4  # float32 parameters

# status word flags, written by a server to a worker with every parameter update
STATUS_RUN = 0
STATUS_STOP = 1
#: the server went on without this worker (nothing came from it within the server's step
#: timeout, or its sender was dropped as silent) while the worker may still run: join again
#: (written to the worker's ``dropped_name`` tensor, not with the parameters)
STATUS_DROPPED = 2
#: the server gives up on the job before it formed (workers it waited for did not join within
#: its --join-timeout) and exits: stop, in failure (written to the ``dropped_name`` tensor of
#: each worker that joined; before, each waited out its --reconnect-timeout for it)
STATUS_FAILED = 3
STATUS_FIELDS = 4  # [step, flags, applied updates, how the server runs]
#: the status word's last field: bits that say how the server runs
STATUS_HOW = 3
#: it has done no step since it started (it may have been restarted alone, behind the job's
#: other servers), and takes a catch-up request (bsp only)
HOW_MAY_CATCH_UP = 1
#: it runs asp or ssp: the step it writes counts this worker's steps, each server on its own,
#: and the servers' steps need not agree (a worker does not line them up)
HOW_ASYNC = 2
#: [step, loss, correct, batch size, rank 0's evaluation or NaN where it made none, squared
#: norm of the worker's whole gradient or NaN]: the evaluation is whatever score the model's
#: evaluate gives (an R², a negative error), so none is NaN (until 2026-12-03, -1, which
#: dropped every negative score); the norm is taken only where the servers clip each push
#: (asp and ssp with --clip-grad-norm; until 2026-12-05 the meta ended at the evaluation)
META_FIELDS = 6
#: where the meta says the squared norm of the worker's whole gradient (all shards' chunks)
META_SQUARES = 5


def flag_slots(cids: Iterable[str]) -> dict[str, int]:
    """Where each chunk of one server (``cids``) has its flag in a worker's meta for that
    server, after the META_FIELDS: 1.0 where the worker pushed a gradient of it this step,
    0.0 where it had none (a parameter its step did not use: PyTorch's ``grad`` None), which
    then travels as zeros and is not stepped on its account. In the order of the chunks' names,
    which both ends know without telling each other (a worker learns them from the server's
    published gradient tensors, in no set order)."""
    return {cid: META_FIELDS + i for i, cid in enumerate(sorted(cids))}


@dataclass(frozen=True)
class Chunk:
    param: str
    part: int
    start: int
    stop: int
    shape: tuple[int, ...]
    server: int

    @functools.cached_property
    def cid(self) -> str:
        # cached: a server's step names each chunk's tensors a few dozen times (made anew
        # each time, 44 strings a step of the digits model)
        return f"{self.param}@{self.part}"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEM


def plan(shapes: dict[str, tuple[int, ...]], servers: int, split_bytes: int) -> list[Chunk]:
    """Split tensors above ``split_bytes`` along their first axis and balance chunks by bytes."""
    if servers < 1:
        raise ValueError("at least one server is needed")
    pieces: list[tuple[str, int, int, int, tuple[int, ...]]] = []
    for name, shape in shapes.items():
        rows = shape[0] if shape else 1
        nbytes = math.prod(shape) * ITEM
        k = max(1, min(rows, math.ceil(nbytes / split_bytes))) if shape else 1
        bounds = [round(i * rows / k) for i in range(k + 1)]
        for part in range(k):
            lo, hi = bounds[part], bounds[part + 1]
            pieces.append((name, part, lo, hi, (hi - lo, *shape[1:]) if shape else ()))
    load = [0] * servers
    owner: dict[tuple[str, int], int] = {}
    for name, part, _, _, shape in sorted(pieces, key=lambda p: (-math.prod(p[4]), p[0], p[1])):
        s = min(range(servers), key=lambda i: (load[i], i))
        owner[(name, part)] = s
        load[s] += math.prod(shape) * ITEM
    return [Chunk(n, p, lo, hi, shp, owner[(n, p)]) for n, p, lo, hi, shp in pieces]


#: The start of a pack's name (:class:`Pack`): no chunk's name is one (a chunk's ends in
#: ``@<part>``, a pack's never holds an ``@``).
PACK_PREFIX = "pack"


@dataclass(frozen=True)
class Pack:
    """Small whole parameters of one server that travel as one tensor (``--pack-bytes``).

    A model of many small tensors (biases, norms) paid a message per tensor each way each step
    (57 us a tensor over ``shm`` on the ``many`` model). A pack is one message: a worker
    gathers its members' gradients into one flat gradient tensor, the server writes their
    fresh parameters as one flat tensor, which the worker registers and whose slices are its
    members' parameters. Only the wire is packed: the server keeps each member's parameters,
    accumulator and optimizer state by the member's chunk (its checkpoints, exports and flags
    are those of an unpacked job), its parameters as views into one flat array.

    ``cid``: the pack's name where a chunk's would be (``grad/<rank>/<cid>``, the worker's
    tensor); ``members``: the chunks, each a whole parameter, in the pack's order."""

    cid: str
    members: tuple[Chunk, ...]

    @functools.cached_property
    def bounds(self) -> tuple[tuple[int, int], ...]:
        """Each member's elements in the flat tensor: ``(start, stop)``."""
        out, at = [], 0
        for c in self.members:
            n = math.prod(c.shape)
            out.append((at, at + n))
            at += n
        return tuple(out)

    @property
    def landing(self) -> str:
        """The worker's tensor the server writes the pack's parameters into: the one part of
        a tensor the worker registers in parts (``Receiver.register_parts``), so that
        ``Receiver.array`` hands out the whole, of which its members' parameters are views."""
        return f"{self.cid}@0"

    @property
    def size(self) -> int:
        """Elements of the flat tensor."""
        return self.bounds[-1][1] if self.members else 0

    def split(self, flat: Any) -> list[Any]:
        """:meth:`views` without the members: the slices alone, in the members' order."""
        return [view for _, view in self.views(flat)]

    def views(self, flat: Any) -> list[tuple[Chunk, Any]]:
        """Each member with its slice of ``flat`` (a 1-D array of :attr:`size`, numpy or cupy)
        in the member's shape: views, no copy."""
        return [
            (c, flat[lo:hi].reshape(c.shape))
            for c, (lo, hi) in zip(self.members, self.bounds, strict=True)
        ]


def packs(
    chunks: Iterable[Chunk], shapes: Mapping[str, tuple[int, ...]], pack_bytes: int, limit: int
) -> list[Pack]:
    """The packs of one server's ``chunks`` (of the parameters ``shapes``): every chunk that is
    a whole parameter (not split, not empty) of fewer than ``pack_bytes`` bytes, in the order of
    their names, filled into packs of at most ``limit`` bytes each (the job's --split-bytes: a
    pack is no larger than a chunk); a pack of one would save nothing, and its chunk travels
    alone. ``pack_bytes`` 0: none. A member costs a copy where the worker gathers its gradient,
    which the message saved outweighed up to 256 KiB on every transport measured (the default;
    16 and 64 KiB gained less: docs/bench-packs-2026-12-04/).

    Both ends compute the same from the job's plan (the worker checks the names the server
    published); each pack's name carries a digest of its members, so two ends that packed
    otherwise (another version) never write each other's bytes into the wrong parameters."""
    if pack_bytes <= 0:
        return []
    small = sorted(
        (
            c
            for c in chunks
            # (an empty parameter gains nothing, and a pack of them would be an empty tensor)
            if c.part == 0
            and tuple(c.shape) == tuple(shapes[c.param])
            and 0 < c.nbytes < pack_bytes
        ),
        key=lambda c: c.cid,
    )
    groups: list[list[Chunk]] = []
    filled = 0
    for c in small:
        if not groups or filled + c.nbytes > limit:
            groups.append([])
            filled = 0
        groups[-1].append(c)
        filled += c.nbytes
    out: list[Pack] = []
    for group in (g for g in groups if len(g) > 1):
        text = ";".join(f"{c.cid}:{list(c.shape)}" for c in group)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        out.append(Pack(f"{PACK_PREFIX}{len(out)}.{digest}", tuple(group)))
    return out


def is_pack_name(cid: str) -> bool:
    """Whether ``cid`` (a gradient tensor's tail) names a :class:`Pack` rather than a chunk."""
    return cid.startswith(PACK_PREFIX) and "@" not in cid


#: the largest join message (an address and every parameter's spec)
JOIN_MAX_BYTES = 1 << 20

#: a parameter's spec as it travels: shape and dtype name, by parameter name
Specs = dict[str, tuple[tuple[int, ...], str]]


def specs_of(params: Mapping[str, Any]) -> Specs:
    """The specs of arrays (or of ``(shape, dtype)`` pairs), in the model's order."""
    out: Specs = {}
    for name, value in params.items():
        if isinstance(value, tuple):
            shape, dtype = value
            out[name] = (tuple(int(d) for d in shape), str(dtype))
        else:
            out[name] = (tuple(int(d) for d in value.shape), str(value.dtype))
    return out


def encode_join(
    address: str, specs: Specs, fixed: str | None = None, session: int | None = None
) -> bytes:
    """A worker's join: where it receives, its parameters' specs, ``fixed``, a digest of what
    its model holds fixed and every worker must hold the same (a PyTorch module's frozen
    parameters, which no server keeps), where it has any, and ``session``, a number the worker
    drew (:func:`new_session`), which its leave carries too (:func:`encode_leave`): a server
    tells this worker's leave from one an earlier process of its rank left."""
    message: dict[str, Any] = {
        "address": address,
        "specs": [[n, list(shape), dt] for n, (shape, dt) in specs.items()],
    }
    if fixed is not None:
        message["fixed"] = fixed
    if session is not None:
        message["session"] = session
    return msgpack.packb(message)


class Join(NamedTuple):
    """A worker's join message, decoded (:func:`decode_join`)."""

    address: str
    specs: Specs
    fixed: str | None
    session: int | None  # None: a worker older than sessions


def new_session() -> int:
    """A worker process's session number: random, positive in an int64."""
    return secrets.randbits(62) + 1


def encode_ready() -> bytes:
    return msgpack.packb({"ready": True})


def decode_join(payload: bytes) -> Join | None:
    """A join message (:func:`encode_join`), or None for a ready message; ValueError if it is
    neither."""
    try:
        msg = msgpack.unpackb(payload)
        if msg.get("ready") is True:
            return None
        specs = {str(n): (tuple(int(d) for d in shape), str(dt)) for n, shape, dt in msg["specs"]}
        fixed, session = msg.get("fixed"), msg.get("session")
        return Join(
            str(msg["address"]),
            specs,
            None if fixed is None else str(fixed),
            None if session is None else int(session),
        )
    except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as exc:
        raise ValueError(f"malformed join message: {exc}") from None


def first_mismatch(ours: Specs, theirs: Specs) -> str | None:
    """The first difference between two workers' parameters, in words; None if they agree."""
    for name, (shape, dtype) in ours.items():
        if name not in theirs:
            return f"it has no parameter {name!r}"
        if theirs[name] != (shape, dtype):
            got_shape, got_dtype = theirs[name]
            return f"{name!r} is {got_dtype}{list(got_shape)}, not {dtype}{list(shape)}"
    extra = [n for n in theirs if n not in ours]
    if extra:
        return f"it has a parameter {extra[0]!r} the others lack"
    if list(ours) != list(theirs):
        return "it lists the parameters in another order"
    return None


def specs_digest(specs: Specs) -> str:
    """A short digest of the parameters' specs: a checkpoint records what it was written for."""
    text = ";".join(f"{n}:{dt}{list(shape)}" for n, (shape, dt) in specs.items())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def init_name(cid: str) -> str:
    return f"init/{cid}"


def grad_name(rank: int, cid: str) -> str:
    return f"grad/{rank}/{cid}"


_GRAD = re.compile(r"^grad/(\d+)/(.+)@(\d+)$")


def parse_grad_name(name: str) -> tuple[int, str, int] | None:
    m = _GRAD.match(name)
    return (int(m.group(1)), m.group(2), int(m.group(3))) if m else None


def meta_name(rank: int) -> str:
    return f"meta/{rank}"


def join_name(rank: int) -> str:
    return f"join/{rank}"


#: the start of :func:`fixed_name`'s names
FIXED_PREFIX = "fixed/"


def fixed_name(fixed: str | None) -> str:
    """A tensor a server registers (never written) once it knows the job's model, whose name
    says what every worker holds fixed (the digest of :func:`encode_join`, or ``none``): a
    worker whose digest differs is refused, and finds why here, in the names it reads."""
    return f"{FIXED_PREFIX}{fixed or 'none'}"


def status_name(server: int) -> str:
    return f"status/{server}"


def leave_name(rank: int) -> str:
    """Where worker ``rank`` tells a server that it stops (another server said stop, or it was
    stopped itself): the server then stops waiting for its gradients at once, rather than after
    its step timeout. A tensor of its own, so that a server waiting for a step can look at it.
    Its int64s (:func:`encode_leave`) say why (:data:`LEAVE_JOB_STOPS`, :data:`LEAVE_ALONE`,
    :data:`LEAVE_TO_RETURN`) and, where its server registered it of dynamic length
    (:data:`LEAVE_MAX_BYTES`), the session of the join it ends (older servers take the reason
    alone, older workers send it alone)."""
    return f"leave/{rank}"


#: A leave message at most: its reason and its session
LEAVE_MAX_BYTES = 16


def encode_leave(reason: int, session: int | None) -> Any:
    """A leave message (:func:`leave_name`): ``[reason, session]``, or ``[reason]`` for a
    server that takes one number (``session`` None)."""
    return np.array([reason] if session is None else [reason, session], np.int64)


def leave_session(view: Any) -> int | None:
    """The session a leave message ends (:func:`encode_leave`); None from an older worker."""
    return int(view[1]) if view.shape[0] > 1 else None


#: A worker leaves as the job stops: another server told it stop (every worker hears the
#: same). What a worker older than :data:`LEAVE_ALONE` sends, whatever the reason.
LEAVE_JOB_STOPS = 1
#: A worker leaves on its own (stopped by itself: its node drained, or it failed), while its
#: servers train on: the job goes on without it, and a server restarted from a checkpoint does
#: not wait for it to join (it joins again once started again).
LEAVE_ALONE = 2
#: A worker leaves to be started again (``tensorwire-worker --on-sigterm restart``: an
#: orchestrator moving it): the job goes on without it, and waits for it as for one lost (under
#: asp and ssp, a job whose workers all left alone ends; one whose workers are all coming back
#: does not). A server older than this reason takes it as :data:`LEAVE_JOB_STOPS`.
LEAVE_TO_RETURN = 3


def ended_name(rank: int) -> str:
    """Where worker ``rank``, told by a server to stop, tells each server that did not tell it
    at what step, just before its leave (:data:`LEAVE_JOB_STOPS`): a server lost or frozen as
    the job ended elsewhere, and back from a checkpoint behind that end, would otherwise wait
    for workers that have exited. :data:`ENDED_FIELDS` int64: the step, and how the worker
    learned it (:data:`ENDED_TOLD_STOP` or :data:`ENDED_JOB_DONE`)."""
    return f"ended/{rank}"


ENDED_FIELDS = 2
#: A server told the worker to stop, at that step: its status word's first field (the job's
#: step under bsp; under asp and ssp the worker's own, which is past ``--steps`` where its
#: steps are done there, and short of it where the server stopped the job).
ENDED_TOLD_STOP = 0
#: A server the worker reached had ended the job at that step (it published :data:`JOB_DONE`):
#: every worker is done.
ENDED_JOB_DONE = 1


def catch_up_name(rank: int) -> str:
    """Where worker ``rank`` asks a server that restarted alone, and came back behind the
    job's other servers, to go on at their step (an int64 step number)."""
    return f"catch-up/{rank}"


def probe_name(rank: int) -> str:
    """Where worker ``rank``, once a wait for a server's parameters has lasted its probe
    interval, asks that server whether it still counts on it: a server that went on without
    it answers with a STATUS_DROPPED notice again (the first may not have reached it)."""
    return f"probe/{rank}"


#: What every server publishes about its job (``Receiver(info=...)``, :func:`job_info`), read
#: by a joining worker before it writes its join: the job's size, under this name. A worker
#: started with another ``--workers`` splits the data set otherwise than the job (its shard
#: overlapping another's, or some rows in none), and trained on silently.
JOB_WORKERS = "job.workers"
#: Published the same way: which shard of the job this server is (its ``--shard``). A worker
#: given two servers of one shard, or fewer servers than the job has shards, found no server
#: holding some parameter, and blamed its model ("the servers do not hold parameter ... (wrong
#: model?)").
JOB_SHARD = "job.shard"

#: The prefix of the published names of the settings every server of a job must share. A
#: worker compares its servers' before it joins: servers started with another ``--steps`` ended
#: the job at different steps (the first to finish stopped the workers, the other waited for
#: them), and another ``--lr`` or ``--optimizer`` trained each shard otherwise, silently.
SETTING_PREFIX = "job.setting."

#: Published by a server whose job is done (``tensorwire-ps --linger``): the step it ended at.
#: A worker that reaches it then (one started again after the job ended) stops there, rather
#: than wait for a join that nobody takes until its --connect-timeout and exit 1.
JOB_DONE = "job.done"


#: Published with :data:`JOB_DONE` by a server that wrote a checkpoint of the job's last step:
#: its path, on the server's host. A worker that comes after the end, and was asked to save
#: the parameters (``--save-params``), says where they are (``tensorwire export`` reads them).
JOB_CHECKPOINT = "job.checkpoint"


def job_info(
    workers: int,
    settings: dict[str, object],
    done_at: int | None = None,
    checkpoint: str | None = None,
    *,
    shard: int | None = None,
) -> dict[str, object]:
    """What a server publishes about its job: its size and ``settings`` (their values as
    str, compared as written: ``repr`` of a float keeps it exact); ``done_at``, the step at
    which it ended, once it has, and ``checkpoint``, the path of its checkpoint of that step;
    ``shard``, which of the job's shards it is."""
    info: dict[str, object] = {JOB_WORKERS: workers}
    if shard is not None:
        info[JOB_SHARD] = shard
    info.update({SETTING_PREFIX + key: str(value) for key, value in settings.items()})
    if done_at is not None:
        info[JOB_DONE] = done_at
        if checkpoint is not None:
            info[JOB_CHECKPOINT] = checkpoint
    return info


def job_done(info: dict[str, Any]) -> int | None:
    """The step at which a server's job ended, where it published one (:data:`JOB_DONE`)."""
    step = info.get(JOB_DONE)
    return step if type(step) is int else None


def job_checkpoint(info: dict[str, Any]) -> str | None:
    """The path of a done server's checkpoint of the job's last step, where it published one
    (:data:`JOB_CHECKPOINT`)."""
    path = info.get(JOB_CHECKPOINT)
    return path if type(path) is str else None


def job_workers(info: dict[str, Any]) -> int | None:
    """The job's size a server published (:func:`job_info`); None where it published none."""
    workers = info.get(JOB_WORKERS)
    return workers if type(workers) is int else None


def job_shard(info: dict[str, Any]) -> int | None:
    """Which shard of its job a server is (:data:`JOB_SHARD`); None where it published none."""
    shard = info.get(JOB_SHARD)
    return shard if type(shard) is int else None


def job_settings(info: dict[str, Any]) -> dict[str, str] | None:
    """The shared settings a server published (:func:`job_info`), by their flags' names; None
    where it published none."""
    settings = {
        key[len(SETTING_PREFIX) :]: str(value)
        for key, value in info.items()
        if key.startswith(SETTING_PREFIX)
    }
    return settings or None


def norm_name(server: int) -> str:
    """(bsp, ``--clip-grad-norm`` over several shards) Where server ``server`` tells each
    worker, once it has summed a step's gradients, the squared norm of its shard's mean
    gradient (:data:`NORM_FIELDS` float64: the step, the squared norm): no server sees the
    others' chunks, so the workers, which hear from every server, add them up in shard order
    and write the global sum back (:func:`norm_total_name`)."""
    return f"norm/{server}"


def norm_total_name(rank: int) -> str:
    """(see :func:`norm_name`) Where worker ``rank`` writes back to every server the sum of the
    servers' squared norms of a step (:data:`NORM_FIELDS` float64: the step, the sum): every
    worker writes the same sum, and a server takes the first that lands."""
    return f"norm-total/{rank}"


NORM_FIELDS = 2


#: The kinds of tensor a worker writes to a server, each named ``kind/<rank>[/...]`` by the
#: functions above (a server tells whose a message is from its name's first part).
WORKER_KINDS = frozenset(
    name.partition("/")[0]
    for name in (
        grad_name(0, ""),
        meta_name(0),
        join_name(0),
        leave_name(0),
        ended_name(0),
        catch_up_name(0),
        probe_name(0),
        norm_total_name(0),
    )
)


def dropped_name(server: int) -> str:
    """Where server ``server`` tells a worker it went on without it (a status word whose flags
    are STATUS_DROPPED): a tensor of its own, as the worker may hold the slot of its status
    word (it holds it while it computes) when it is dropped."""
    return f"dropped/{server}"
