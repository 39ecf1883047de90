"""``PSClient``: a training loop's connection to the parameter servers.

The client registers every model parameter in its own receiver, in parts that match the
servers' chunks (:meth:`tensorwire.Receiver.register_parts`), and each pack of small parameters
(the servers' ``--pack-bytes``) as one tensor whose slices are its members, so
:attr:`PSClient.params` *are* the buffers the servers write: no copy between the network and the
next forward pass. A loop does::

    with PSClient(["tcp://ps0:5700"], rank=0, shapes=shapes, init=initial_values) as ps:
        while (step := ps.wait_params()) is not None:   # None: the servers said stop
            grads = my_backward(ps.params, batch(step))  # any framework that yields numpy
            ps.push(grads, loss=loss)

The servers run no model code: every client tells them its parameters' shapes when it joins, and
rank 0 gives their initial values (``init``). The plan (which server owns which rows of which
parameter) is then read from the gradient tensors the servers publish, so client and servers
cannot disagree about it (a pack's members are computed as the servers did, and checked against
the digest in the pack's name). Uses only tensorwire's public API.
"""

from __future__ import annotations

import contextlib
import logging
import math
import operator
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import numpy as np

import tensorwire as tw
from tensorwire.checks import check_amount, check_count, check_distinct
from tensorwire.cuda import array_device, as_device_array, cupy, current_stream, parse_device
from tensorwire.curve import CurveKeys
from tensorwire.dtypes import as_host_array, canonical_dtype
from tensorwire.endpoint import is_wildcard_host, local_address_towards, tcp_endpoint
from tensorwire.job.norms import squared_norm
from tensorwire.job.plan import (
    ENDED_JOB_DONE,
    ENDED_TOLD_STOP,
    FIXED_PREFIX,
    HOW_ASYNC,
    HOW_MAY_CATCH_UP,
    LEAVE_ALONE,
    LEAVE_JOB_STOPS,
    LEAVE_TO_RETURN,
    META_FIELDS,
    NORM_FIELDS,
    STATUS_DROPPED,
    STATUS_FAILED,
    STATUS_FIELDS,
    STATUS_HOW,
    STATUS_STOP,
    Chunk,
    Pack,
    catch_up_name,
    dropped_name,
    encode_join,
    encode_leave,
    encode_ready,
    ended_name,
    fixed_name,
    flag_slots,
    grad_name,
    init_name,
    is_pack_name,
    job_checkpoint,
    job_done,
    job_settings,
    job_shard,
    job_workers,
    join_name,
    leave_name,
    meta_name,
    new_session,
    norm_name,
    norm_total_name,
    packs,
    parse_grad_name,
    plan,
    probe_name,
    specs_of,
    status_name,
)
from tensorwire.job.wire16 import narrow_into, widen_into
from tensorwire.job.words import wait_past_losses

Array = np.ndarray[Any, Any]
log = logging.getLogger("tensorwire.worker")

#: Seconds a wait for the servers' parameters goes on before every server is pinged. A server
#: that dies after it wrote to us is seen at once (its claims end with it); one that dies before
#: its first write to us (while the job forms, or before the first step) is seen only this way.
PROBE_EVERY = 2.0
#: Seconds a wait for the parameters goes on before it looks at the servers' notices (and at a
#: stop asked): a server that went on without us is heard within this, not at the next ping.
#: Read every PROBE_EVERY before, the notice of a server that dropped us while we waited for
#: another (frozen) was read 2 s late, and each worker's late join again made the other
#: servers drop the next one: a chaos run (shm, bsp, 3 x 3) took 6.4 s to train on after a
#: server frozen 2 s, its workers joining again one after another, 2 s apart.
NOTICE_LOOK = 0.1
#: Seconds a server has to answer that ping before it counts as lost
PROBE_TIMEOUT = 5.0
#: Seconds a probe (are we still counted on?) may wait for a free slot: the server reads them at
#: least every step, and one that has not read our earlier ones is held up, and answers later
PROBE_WRITE_TIMEOUT = 0.5
#: Seconds the word that we stop may take to reach a server, when we close: best effort
LEAVE_TIMEOUT = 2.0
#: Seconds one try at writing our join, or a message of it, may take (PSClient._write_in_tries)
JOIN_WRITE_TRY = 2.0
#: Seconds between tries at reaching a server that did not hear the job end (PSClient._tell_end)
TELL_END_EVERY = 0.5

#: Why a worker cannot rejoin servers restarted with another plan
PLAN_CHANGED = (
    "the restarted servers cut or pack the parameters otherwise than before (another "
    "--split-bytes or --pack-bytes?): this worker's buffers were registered for the job's "
    "first plan; start it again to join the servers as they are now"
)


class PSClientError(tw.TensorWireError):
    """The client and the servers do not fit together (model, ranks, plan)."""


class PSClientStopped(PSClientError):
    """A stop was asked (the ``stopping`` callable said so: a SIGTERM to the worker) while the
    client waited for the servers: to come up, to form the job, to come back, or for their
    parameters. Such a wait may last minutes (``connect_timeout``, ``reconnect_timeout``,
    ``timeout``) where a server is gone; an orchestrator taking the job down should not wait
    for it, nor kill the worker at the end of its grace period."""


class PSClientJobDone(PSClientStopped):
    """A server we joined had ended the job already (it lingers to say so, ``tensorwire-ps
    --linger``): this client was started, or reached it again, after the job's last step.
    Nothing is left to train, and no parameters come. ``done_at``: the step it ended at."""

    def __init__(self, message: str, done_at: int, checkpoints: dict[str, str | None]) -> None:
        super().__init__(message)
        self.done_at = done_at
        #: each done server's checkpoint of the last step (a path on its host), by address;
        #: None for one that kept none
        self.checkpoints = checkpoints


class _NoSum(Exception):
    """A server went on without our sum of the servers' norms (PSClient._add_norms)."""


class _Dropped(Exception):
    """A server went on without this worker (a notice in its ``dropped`` tensor): join again."""


#: The longest parameter name, in UTF-8 bytes: the tensors named after a parameter
#: (``grad/<rank>/<name>@<part>``) must fit a tensor name's 255 bytes.
MAX_PARAM_NAME_BYTES = 200


def _checked_shapes(shapes: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape as a tuple of ints, or PSClientError naming the first bad one
    (before anything is opened: an empty name or a negative dimension went on to the servers,
    and a worker failed to join with a message about the servers' plan)."""
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        if not isinstance(name, str) or not name:
            raise PSClientError(f"parameter names must be non-empty strings, got {name!r}")
        if len(name.encode()) > MAX_PARAM_NAME_BYTES:
            raise PSClientError(
                f"parameter name {name[:40]!r}... is {len(name.encode())} bytes long: at most "
                f"{MAX_PARAM_NAME_BYTES} (the tensors named after it must fit 255)"
            )
        try:
            dims = tuple(operator.index(d) for d in shape)
        except TypeError:
            dims = None
        if dims is None or any(d < 0 for d in dims):
            raise PSClientError(
                f"parameter {name!r}: shape {shape!r} is not a tuple of whole numbers of 0 or more"
            )
        out[name] = dims
    return out


def _checked_init(init: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """Rank 0's initial values as float32 host arrays, or PSClientError naming the first that
    is missing or of another shape. Anything numpy takes is accepted (lists, torch CPU
    tensors), and GPU arrays (cupy's ``get()``, torch's ``cpu()``): they are written once."""
    out: dict[str, Any] = {}
    for name, shape in shapes.items():
        if name not in init:
            raise PSClientError(
                f"init has no value for parameter {name!r}: give an array of shape {shape} "
                "for every parameter"
            )
        value = init[name]
        if hasattr(value, "get") and hasattr(value, "__cuda_array_interface__"):
            value = value.get()  # cupy
        elif hasattr(value, "detach") and hasattr(value, "cpu"):
            value = value.detach().float().cpu()  # torch, on any device, of any float type
        try:
            host = np.asarray(value, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise PSClientError(
                f"init[{name!r}] is not an array of numbers ({type(value).__name__}: {exc})"
            ) from None
        if host.shape != shape:
            raise PSClientError(
                f"init does not match shapes for {name!r}: give an array of shape {shape} "
                f"for every parameter (got {host.shape})"
            )
        out[name] = host
    return out


def _zeros(shape: tuple[int, ...], dtype: Any, device: str) -> Any:
    """Zeros in host memory (``device`` cpu) or on that GPU (cupy)."""
    index = parse_device(device)
    if index is None:
        return np.zeros(shape, dtype)
    cp = cupy()
    with cp.cuda.Device(index):
        return cp.zeros(shape, dtype)


def _host_flat(g: Any, name: str) -> Any:
    """Gradient ``g`` of parameter ``name`` as a flat host array (a view where it is one
    already): numpy, a CPU torch tensor, anything tensorwire writes from host memory, or GPU
    memory (cupy, a CUDA tensor) for a worker whose parameters are on the host, copied."""
    if array_device(g) is not None:
        g = cupy().asnumpy(as_device_array(g, name))
    else:
        g = as_host_array(g, name)
    return g.reshape(-1)


def _dtype_name(array: Any) -> str:
    """The name of ``array``'s dtype, numpy's, cupy's or torch's alike ("float32")."""
    dtype = getattr(array, "dtype", None)
    try:
        return canonical_dtype(dtype).name
    except tw.TensorWireError:
        return str(dtype)


def _advertised(address: str, advertise: str | None, towards: str) -> str:
    """The receiver address servers should use: ``advertise`` replaces a wildcard bind host."""
    parts = urlsplit(address)
    host = parts.hostname or ""
    if advertise:
        host = advertise
    elif is_wildcard_host(host):
        host = local_address_towards(urlsplit(towards).hostname or "127.0.0.1")
    return tcp_endpoint(host.strip("[]"), parts.port or 0)


class PSClient:
    def __init__(
        self,
        servers: list[str],
        rank: int,
        shapes: Mapping[str, tuple[int, ...]],
        *,
        transport: str = "auto",
        secret: str | None = None,
        bind: str = "tcp://127.0.0.1:0",
        advertise: str | None = None,
        connect_timeout: float = 60.0,
        timeout: float | None = 300.0,
        reconnect_timeout: float = 120.0,
        heartbeat: float = 5.0,
        heartbeat_timeout: float = 30.0,
        curve_keys: CurveKeys | None = None,
        nixl: tw.NixlOptions | None = None,
        shm: bool | None = None,
        init: Mapping[str, Array] | None = None,
        device: str = "cpu",
        stopping: Callable[[], bool] | None = None,
        workers: int | None = None,
        fixed: str | None = None,
        seed: int | None = None,
    ) -> None:
        """``shapes``: every parameter's shape (float32), in the model's order. ``init``: their
        initial values, required of rank 0 (the servers start from them unless they resume from
        a checkpoint); other ranks' are not used. ``device``: where the parameters' buffers
        live (``cpu``, ``cuda``, ``cuda:N``); on a GPU :attr:`params` are cupy arrays over GPU
        memory the servers write into, and :meth:`push` takes GPU gradients (cupy, torch CUDA)
        as they are. ``shm``: as :class:`tensorwire.Receiver`'s, for the receiver the servers write
        parameters into (False: private memory, for servers on other hosts). ``stopping``:
        looked at in every wait for the servers (at least every PROBE_EVERY s); once true, the
        wait ends with :class:`PSClientStopped`. ``workers``: the job's size as this worker
        splits its data by it; a server of a job of another size is refused when we join.
        ``fixed``: a digest of what the model holds fixed besides the parameters, which every
        worker must hold the same (``torch_task.frozen_digest``: frozen parameters); a server
        refuses a worker whose digest differs from the job's. ``seed``: the seed this worker
        orders and cuts its data by (``tensorwire-worker --seed``); a job whose servers were
        started with another (their ``--seed``) is refused when we join."""
        self._closed = False
        #: named by our join and our leave: a server tells our leave from one an earlier
        #: process of our rank left
        self._session = new_session()
        if not servers:
            raise PSClientError("no parameter servers given")
        # Checked before anything is opened: a NaN wait never ends, a rank that is not a
        # whole number names tensors no server has, one server twice would serve two shards
        try:
            check_count("rank", rank, 0)
            for name, seconds in (
                ("connect_timeout", connect_timeout),
                ("reconnect_timeout", reconnect_timeout),
            ):
                check_amount(name, seconds, positive=True)
            if timeout is not None:  # (None: no bound)
                check_amount("timeout", timeout)
            check_distinct("servers", list(servers))
        except ValueError as exc:
            raise PSClientError(str(exc)) from None
        try:  # before, found once joined: the servers had taken us in, and waited for us
            parse_device(device)
        except (ValueError, tw.TensorWireError) as exc:
            raise PSClientError(f"device {device!r}: {exc}") from None
        if not shapes:
            raise PSClientError("no parameters given (shapes is empty)")
        shapes = _checked_shapes(shapes)
        self._init = None if init is None else _checked_init(init, shapes)
        self._workers = workers
        self._fixed = fixed
        self._seed = seed
        self.device = device
        self._stopping = stopping
        self._specs = specs_of({n: (tuple(s), "float32") for n, s in shapes.items()})
        self.rank = rank
        self.servers = list(servers)
        self.timeout = timeout
        self._told_stop: set[int] = set()  # the servers that said stop (the others hear we leave)
        #: the step the servers that said stop gave us (their status word's first field: the
        #: job's step under bsp, ours under asp and ssp), or at which a server we reached had
        #: ended the job; the others hear it as we leave (plan.ended_name)
        self._stopped_at: int | None = None
        self._found_done = False  # ... where a server we reached had ended the job
        self._job_steps: int | None = None  # the job's --steps, as the servers publish it
        #: set before close() where this worker stops to be started again (an orchestrator
        #: moving it: ``tensorwire-worker --on-sigterm restart``): the servers then go on
        #: without it and wait for it as for one lost, rather than count it done with the job
        #: (under asp and ssp a job whose workers all left alone ends)
        self.returning = False
        self._joined_anew = True  # the next parameters come with the servers' first notices
        #: joining again (_recover): a server's word that it stops ends every wait (_check_stop)
        self._recovering = False
        self.chunks: list[Chunk] = []  # known once joined
        #: the job's settings as its servers published them (plan.job_info), once joined
        self._job_settings: dict[str, str] = {}
        #: the servers' packs (plan.packs): several small parameters in one tensor each way,
        #: by the pack's name, with the server's index
        self._packs: dict[str, tuple[Pack, int]] = {}
        #: what the servers write us, with the server's index: each chunk that travels alone
        #: (a part of a parameter's registered storage), and each pack
        self._incoming: list[tuple[str, int]] = []
        self._alone: list[Chunk] = []  # the chunks that travel alone, not in a pack
        #: (packs) where a pack's gradients are gathered, allocated once, in the wire dtype
        self._pack_out: dict[str, Any] = {}
        #: (packs of torch gradients) each pack's buffer as a torch tensor, and the zeros that
        #: stand for a member without a gradient: made once
        self._torch_out: dict[str, Any] = {}
        self._torch_zeros: dict[str, Any] = {}
        self.tx = tw.Sender(
            transport=transport,
            secret=secret,
            timeout=timeout,
            name=f"worker{rank}",
            heartbeat=heartbeat,
            curve_server_key=curve_keys.public if curve_keys else None,
            nixl=nixl,
        )
        self.rx: tw.Receiver | None = None
        self._held: list[str] = []  # messages taken by wait_params and not yet released
        #: this step's gradients went out: a second push would count them twice (asp and ssp
        #: apply each as it lands)
        self._pushed = False
        #: a step's parameters were handed out and its gradients not yet pushed: a second
        #: wait_params() would wait in vain (the servers wait for those gradients)
        self._owed = False
        #: (bsp, --clip-grad-norm over several shards) each wait_params() after a push first
        #: adds up the servers' squared norms of the step for them (_add_norms), and writes
        #: [step, sum] from here (allocated once)
        self._norm_round = False
        self._norm_sum = np.zeros(NORM_FIELDS, np.float64)
        #: (asp, ssp, --clip-grad-norm) the servers clip each push by the norm of its whole
        #: gradient, which push() takes and sends in the meta (_push_squares); as the job's
        #: servers now say (a restarted server may turn it on or off)
        self._clip_each = False
        self._shapes = dict(shapes)
        self.reconnect_timeout = reconnect_timeout
        self._probe_word = np.ones(1, np.int64)
        self.step: int | None = None
        #: seconds spent waiting for the servers' parameters, converting 16-bit ones into the
        #: model's float32 ("pull"), and pushing gradients: the step's communication
        self.phase_seconds = {"wait": 0.0, "pull": 0.0, "push": 0.0}
        self.reconnects = 0
        try:
            # Bind first: a port in use fails now, not after waiting for the servers.
            self.rx = tw.Receiver(
                bind,
                secret=secret,
                ring=1,
                name=f"worker{rank}",
                heartbeat_timeout=heartbeat_timeout,
                curve_keys=curve_keys,
                nixl=nixl,
                shm=shm,
            )
            self._connect(connect_timeout)
            me = _advertised(self.rx.address, advertise, self.servers[0])
            self._me = me
            self._first_join(connect_timeout)
            self.chunks = self._learn_plan(shapes)
            # Each server's meta: the step's figures, then a flag per chunk it holds (1.0: a
            # gradient pushed, 0.0: none, sent as zeros), allocated once.
            self._metas = [
                np.zeros(META_FIELDS + sum(c.server == s for c in self.chunks), np.float64)
                for s in range(len(self.servers))
            ]
            slots = [
                flag_slots(c.cid for c in self.chunks if c.server == s)
                for s in range(len(self.servers))
            ]
            self._flag_at = {c.cid: slots[c.server][c.cid] for c in self.chunks}
            #: the zeros that go out for a chunk of a parameter with no gradient, made once
            self._no_grad: dict[str, Array] = {}
            if device != "cpu" and self.wire_dtype != np.float32:
                raise PSClientError(
                    f"parameters on {device} travel as float32: start the servers without "
                    f"--wire-dtype {self.wire_dtype} (16-bit wires are converted on the host)"
                )
            packed = {c.param for p, _ in self._packs.values() for c in p.members}
            for param, shape in shapes.items():
                if param in packed:
                    continue  # a view of its pack's tensor (below)
                rows = [c.stop - c.start for c in self._parts[param]]
                self.rx.register_parts(param, shape, self.wire_dtype, rows, device=device)
            for cid, (p, _) in self._packs.items():
                self.rx.register_parts(cid, (p.size,), self.wire_dtype, [p.size], device=device)
            self._norm_round = self._norm_round_in(self._job_settings) is True
            for s in range(len(self.servers)):
                self.rx.register(status_name(s), (STATUS_FIELDS,), "int64", ring=1)
                # a slot of its own: the status word's may be held while we compute
                self.rx.register(dropped_name(s), (STATUS_FIELDS,), "int64", ring=2)
                if self._norm_round:
                    self.rx.register(norm_name(s), (NORM_FIELDS,), "float64", ring=2)
            landed: dict[str, Array] = {p: self.rx.array(p) for p in shapes if p not in packed}
            for cid, (p, _) in self._packs.items():
                landed.update((c.param, view) for c, view in p.views(self.rx.array(cid)))
            landed = {p: landed[p] for p in shapes}  # (the model's order)
            self._pack_out = {
                cid: _zeros((p.size,), self.wire_dtype, device)
                for cid, (p, _) in self._packs.items()
            }
            #: the model's parameters: read-only views of the registered memory servers write,
            #: or, when they travel in 16 bits, float32 copies refreshed by each wait_params()
            self.params: dict[str, Array] = landed
            #: (16-bit wire) what each wait_params() copies into float32: (the model's float32
            #: array, the registered one), per parameter alone and per pack, whose members'
            #: float32 parameters are views of one array
            self._landed: list[tuple[Array, Array]] | None = None
            self._grads_out: dict[str, Array] = {}
            if self.wire_dtype != np.float32:
                params: dict[str, Array] = {}
                self._landed = []
                for name in shapes:
                    if name not in packed:
                        params[name] = np.zeros(landed[name].shape, np.float32)
                        self._landed.append((params[name], landed[name]))
                for cid, (pack, _) in self._packs.items():
                    flat = np.zeros((pack.size,), np.float32)
                    params.update((c.param, view) for c, view in pack.views(flat))
                    self._landed.append((flat, self.rx.array(cid)))
                self.params = {name: params[name] for name in shapes}
                self._grads_out = {c.cid: np.empty(c.shape, self.wire_dtype) for c in self._alone}
            try:
                no_later = math.inf if self.timeout is None else time.monotonic() + self.timeout
                self._say_ready(no_later)
            except tw.PeerLostError as exc:  # a server lost since: join them all again
                self._recover(str(exc))
        except BaseException:
            self.close()
            raise

    def _check_open(self, call: str) -> None:
        if self._closed:
            # before, push() after close() said it came before wait_params()
            raise tw.ClosedError(f"{call}(): the PSClient of worker {self.rank} is closed")

    def _check_stop(self, waiting: str) -> None:
        """PSClientStopped if a stop was asked meanwhile (``waiting``: for what, in its words),
        or, while we join again, a server said that it stops."""
        if self._stopping is not None and self._stopping():
            raise PSClientStopped(f"stopped while waiting {waiting}")
        if self._recovering:
            self._heed_stop(f"while we waited {waiting}")

    def _heed_stop(self, when: str) -> None:
        """PSClientStopped if a server said that it stops: in a notice (it let us go as it
        stopped) or in the status word of parameters it wrote us. Only while we join again,
        before we say we are ready: anything a server wrote us then is of our last session,
        and is forgotten here (a loss notice before a join is moot, and parameters written
        before the server takes us back are stale; their chunks go with their status). A
        server that stops will serve no other step, so waiting for another one to come back
        (--reconnect-timeout) could only end in failure."""
        rx = self.rx
        if rx is None or not self.chunks:
            return  # not joined yet: no server has written to us
        first: str | None = None  # the first server found to have said stop
        for s, addr in enumerate(self.servers):
            for name in (dropped_name(s), status_name(s)):
                while rx.pending(name):  # bounded: each ring holds two
                    word = wait_past_losses(rx, name, 0.0)
                    flags, at = int(word[1]), int(word[0])
                    rx.release(name)
                    if name == status_name(s):
                        for incoming in self._incoming_of(s):
                            rx.drain(incoming)
                    if flags == STATUS_STOP:
                        # Every server's is noted, not the first's alone: one whose stop went
                        # unnoted is told as we leave that the job ended, and one that ended
                        # and exited too was waited for until --reconnect-timeout (120 s)
                        self._note_stop(s, at)
                        first = first or addr
        if first is not None:
            raise PSClientStopped(f"parameter server {first} said stop {when}")

    def _note_stop(self, s: int, at: int, *, done: bool = False) -> None:
        """Server ``s`` said stop, at step ``at`` (its status word's first field), or had ended
        the job at step ``at`` (``done``: it published so)."""
        self._told_stop.add(s)
        self._stopped_at = at if self._stopped_at is None else max(self._stopped_at, at)
        self._found_done = self._found_done or done

    def _connect(self, timeout: float, *, again: bool = False) -> None:
        """Reach every server, retrying while they start up. ``again``: servers reached before
        (joining again), whose data connection refused is retried too."""
        deadline = time.monotonic() + timeout
        for addr in self.servers:
            while True:
                self._check_stop(f"for parameter server {addr} to answer")
                try:
                    left = max(deadline - time.monotonic(), 0.01)
                    self.tx.add_peer(addr, connect_timeout=min(2.0, left))
                    break
                except (tw.WireTimeoutError, tw.TransportError) as exc:
                    # A server reached before whose control plane answered and whose data
                    # connection was refused is going away (its job ended: its notice that it
                    # stops is read at the next look) or coming back: as if it had not
                    # answered. Before, that ended the worker (exit 1) as its server ended the
                    # job while it joined again. A first reach gives up at once: a transport
                    # that cannot be set up there is a setting, not a moment.
                    if not again and not isinstance(exc, (tw.WireTimeoutError, tw.PeerLostError)):
                        raise
                    if time.monotonic() >= deadline:
                        # the last try's error says why (nothing listening, a handshake refused)
                        raise PSClientError(
                            f"parameter server {addr} did not answer within {timeout:.3g} s; "
                            f"the last try: {exc}"
                        ) from None
                    time.sleep(0.2)

    def _first_join(self, timeout: float) -> None:
        """Join every server and wait for our tensors; a server lost meanwhile (restarted while
        we started) is reached and joined again, all within ``timeout``."""
        deadline = time.monotonic() + timeout

        def join() -> None:
            self._join(max(deadline - time.monotonic(), 1.0))
            self._await_registration(max(deadline - time.monotonic(), 1.0))

        self._until_joined(join, lambda: self._reconnect(deadline), deadline, timeout, "joining")

    def _until_joined(
        self,
        join: Callable[[], None],
        reach_again: Callable[[], None],
        deadline: float,
        within: float,
        doing: str,
    ) -> None:
        """``join()`` again, after ``reach_again()``, each time it meets a server's loss (one
        killed after we reached it), until ``deadline`` (``within`` seconds from the start);
        then PSClientError, saying what the last loss was."""
        while True:
            try:
                join()
                return
            except tw.PeerLostError as exc:
                if time.monotonic() >= deadline:
                    raise PSClientError(
                        f"lost a parameter server while {doing}, and the job did not form "
                        f"again within {within:.3g} s: {exc}"
                    ) from None
                log.warning("lost a parameter server while %s (%s); once more", doing, exc)
            reach_again()

    def _reconnect(self, deadline: float) -> None:
        """Drop every server's session and reach them all afresh (by ``deadline``, at least
        1 s): a restarted server knows none of the old ones."""
        for addr in self.servers:
            with contextlib.suppress(tw.TensorWireError):
                # the goodbyes at once, each on a thread of its own: a frozen server's takes
                # GOODBYE_TIMEOUT, and each one's new session waits for its goodbye anyway
                self.tx.remove_peer(addr, wait=False)
        self._connect(max(deadline - time.monotonic(), 1.0), again=True)

    def _join(self, timeout: float) -> None:
        """Tell every server where we receive and what our parameters are, once every one
        of them is known to serve this job (its size, the settings they share): a join a later
        check refused would leave a server waiting for a worker that is gone."""
        message = np.frombuffer(
            encode_join(self._me, self._specs, self._fixed, self._session), np.uint8
        )
        deadline = time.monotonic() + timeout
        first: tuple[str, dict[str, str]] | None = None  # a server's settings, to compare
        shards: dict[int, list[str]] = {}  # the servers by the shard each says it is
        published = {addr: self.tx.receiver_info(peer=addr) for addr in self.servers}
        done = {addr: info for addr, info in published.items() if job_done(info) is not None}
        if done:
            addr, info = next(iter(done.items()))
            done_at = job_done(info)
            assert done_at is not None
            # the servers that have not ended it hear it as we close (_leave): one restarted
            # behind the job's end would otherwise wait for workers that have exited
            for s, a in enumerate(self.servers):
                if a in done:
                    self._note_stop(s, done_at, done=True)
            raise PSClientJobDone(
                f"parameter server {addr} had ended the job at step {done_at} when this "
                "worker reached it: nothing is left to train",
                done_at,
                {a: job_checkpoint(i) for a, i in done.items()},
            )
        for addr in self.servers:
            self._await_tensor(
                addr,
                join_name(self.rank),
                deadline,
                f"server {addr} has no slot for rank {self.rank}: it expects fewer workers",
            )
            published = self.tx.receiver_info(peer=addr)
            settings = job_settings(published)
            if settings is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._job_steps = int(settings["steps"])
                theirs = settings.get("seed")
                if self._seed is not None and theirs is not None and theirs != str(self._seed):
                    raise PSClientError(
                        f"parameter server {addr} serves a job of seed {theirs} (its --seed), "
                        f"and this worker was started with --seed {self._seed}: the seed orders "
                        "and cuts each worker's data (some rows would be trained twice, others "
                        "never), so give every worker and server the same --seed"
                    )
                if first is None:
                    first = (addr, settings)
                else:
                    _check_same_settings(first, (addr, settings))
            shard = job_shard(published)
            if shard is not None:
                shards.setdefault(shard, []).append(addr)
            size = job_workers(published)
            if self._workers is not None and size is not None and size != self._workers:
                raise PSClientError(
                    f"parameter server {addr} serves a job of {size} workers, and this one "
                    f"was started for {self._workers} (--workers): each worker's share of "
                    "the data is cut by it, so give every worker and server the same "
                    "--workers"
                )
        if first is not None:
            self._check_shards(shards, first[1])
        self._in_shard_order(shards)
        if first is not None:
            if self.chunks:
                # before our join: a worker that joined and then quit left a restarting server
                # waiting for it, and it exited ("worker 1 joined ..., which does not answer")
                # while the other workers waited their --reconnect-timeout for it
                self._check_same_wire(first[1])
            self._job_settings = first[1]
            self._clip_each = _clips_each_push(first[1])
        for addr in self.servers:
            self._write_in_tries(addr, join_name(self.rank), message, deadline, "our join")

    def _check_shards(self, shards: dict[int, list[str]], settings: dict[str, str]) -> None:
        """PSClientError unless our servers are the job's shards, each once (``shards``: the
        servers by the shard each said it is; ``settings``: the job's, as one published them):
        a shard missing or doubled left some parameters with no server, and the worker
        blamed its model ("the servers do not hold parameter ... (wrong model?)")."""
        with contextlib.suppress(KeyError, ValueError):
            count = int(settings["shards"])
            if count != len(self.servers):
                raise PSClientError(
                    f"the job has {count} shards (its servers' --shards) and this worker was "
                    f"given {len(self.servers)} server(s) (--servers): list every server of "
                    "the job, once each"
                )
        for shard, addrs in sorted(shards.items()):
            if len(addrs) > 1:
                raise PSClientError(
                    f"{' and '.join(addrs)} are each shard {shard} of the job (their --shard): "
                    f"start one server per shard, 0 to {len(self.servers) - 1}"
                )

    def _in_shard_order(self, shards: dict[int, list[str]]) -> None:
        """Take our servers in the order of their shards (``shards``: the servers by the shard
        each said it is, each once), where --servers listed them otherwise: a server's index
        here is its shard in every tensor it and we name (status/<shard>, the plan's chunks).
        Before, a worker given them in another order joined, found the packs elsewhere and
        exited 1 blaming its model ("holds other small parameters ... (wrong model?)"), and the
        servers waited for it. Not while joining again (our buffers are registered by the
        order we have), nor where a server said no shard (another version)."""
        if self.chunks or sorted(shards) != list(range(len(self.servers))):
            return
        ordered = [shards[k][0] for k in range(len(self.servers))]
        if ordered != self.servers:
            log.info(
                "--servers listed the job's servers in another order than their shards: "
                "taken in shard order (%s)",
                ", ".join(ordered),
            )
            self.servers = ordered

    def _write_in_tries(
        self, addr: str, name: str, value: Array, deadline: float, what: str, **kw: Any
    ) -> None:
        """``what`` (our join, or a message of the join's: rank 0's initial values, that we
        are ready) into server ``addr``'s tensor ``name``; ``kw`` for the write. Another
        session may still hold that tensor: our previous process, dead on a host the server
        hears from only by heartbeats (a worker restarted elsewhere), until the server drops
        it; or a second worker given our rank by mistake. Tried again until ``deadline``, then
        said which: the other session's hold, where the server said so, also when the last try
        ran out of time instead (it began with the little time left, and a loaded server's
        answer came later: "did not answer a claim request within 0.00998 s", where the
        refusals before it had said the rank was taken)."""
        refused: tw.RemoteProtocolError | None = None  # the last "held by another"

        def taken(exc: tw.RemoteProtocolError) -> PSClientError:
            return PSClientError(
                f"parameter server {addr} still takes rank {self.rank} from another "
                f"worker ({exc}): is a second worker started with --rank {self.rank}?"
            )

        while True:
            try:
                # In tries of JOIN_WRITE_TRY: a server frozen or held up takes no join (its
                # first write here claims the tensor through the server), and a stop asked
                # meanwhile is looked at after each (before, after --step-timeout, or once the
                # server missed 3 heartbeats: 15.6 s measured)
                left = max(deadline - time.monotonic(), 0.0)
                try_for = max(min(JOIN_WRITE_TRY, left), 0.01)
                self.tx.write(name, value, peer=addr, timeout=try_for, **kw)
                return
            except tw.WireTimeoutError as exc:
                if time.monotonic() >= deadline:
                    if refused is not None:
                        raise taken(refused) from None
                    raise PSClientError(
                        f"parameter server {addr} did not take {what} in time: {exc}"
                    ) from None
                self._check_stop(f"for parameter server {addr} to take {what}")
                continue
            except tw.RemoteProtocolError as exc:
                if not exc.held_by_another:
                    raise
                if time.monotonic() >= deadline:
                    raise taken(exc) from None
                if refused is None:
                    log.warning(
                        "parameter server %s takes rank %d from another session (%s): waiting "
                        "for it to end (our previous process, not yet seen gone?)",
                        addr,
                        self.rank,
                        exc,
                    )
                refused = exc
            self._check_stop(f"for parameter server {addr} to take {what}")
            time.sleep(min(0.5, max(deadline - time.monotonic(), 0.0)))

    def _await_tensor(self, addr: str, name: str, deadline: float, missing: str) -> None:
        """Wait until server ``addr`` publishes tensor ``name``; PSClientError(``missing``) at
        ``deadline``. A server that stops answering meanwhile (it died while the job formed, or
        is frozen) is asked again until ``deadline``, in requests of JOIN_WRITE_TRY at most with
        a stop looked at between them: one request with all the time left (up to
        --reconnect-timeout while we join again) held a stop asked meanwhile until it ended."""
        while name not in self.tx.tensors(peer=addr):
            self._check_stop(f"for parameter server {addr} to form the job")
            left = deadline - time.monotonic()
            if left <= 0:
                raise PSClientError(missing)
            time.sleep(min(0.1, left))
            left = deadline - time.monotonic()
            try:
                self.tx.refresh(peer=addr, timeout=max(min(JOIN_WRITE_TRY, left), 0.01))
            except tw.WireTimeoutError:
                if time.monotonic() >= deadline:
                    raise PSClientError(
                        f"parameter server {addr} stopped answering while the job was forming "
                        "(it exited, or is unreachable)"
                    ) from None

    def _say_ready(self, deadline: float) -> None:
        """Our parameters are registered: rank 0 writes the initial values where a server asks
        for them, then every server hears that we are ready (by ``deadline``, each write in
        tries with a stop looked at after each, as our join: a server frozen since it took the
        join held a stop asked meanwhile until it was seen lost; the initial values waited for
        the sender's whole timeout)."""
        for s, addr in enumerate(self.servers):
            published = self.tx.tensors(peer=addr)
            for c in self.chunks:
                if c.server != s or init_name(c.cid) not in published or self.rank != 0:
                    continue
                if self._init is None:
                    raise PSClientError(
                        "the servers start from rank 0's initial parameters: give them to "
                        "PSClient(init=...)"
                    )
                value = self._init[c.param]
                rows = value[c.start : c.stop] if value.ndim else value
                self._write_in_tries(
                    addr,
                    init_name(c.cid),
                    rows,
                    max(deadline, time.monotonic() + 1.0),
                    f"our initial values of {c.cid}",
                    allow_copy=True,
                )
            ready = np.frombuffer(encode_ready(), np.uint8)
            self._write_in_tries(
                addr,
                join_name(self.rank),
                ready,
                max(deadline, time.monotonic() + 1.0),
                "that we are ready",
            )

    def _await_registration(self, timeout: float) -> None:
        """Once every worker has joined, each server registers the tensors it plans: wait until
        ours are all there (our ``meta`` tensor is registered last)."""
        deadline = time.monotonic() + timeout
        for addr in self.servers:
            self._await_tensor(
                addr,
                meta_name(self.rank),
                deadline,
                f"server {addr} registered no tensors for rank {self.rank} within {timeout:g} s "
                "(has every worker of the job joined it?)",
            )

    def _learn_plan(self, shapes: Mapping[str, tuple[int, ...]]) -> list[Chunk]:
        chunks: list[Chunk] = []
        dtypes = set()
        mine = grad_name(self.rank, "")
        found_packs: list[dict[str, tuple[int, ...]]] = []  # each server's, by name
        for s, addr in enumerate(self.servers):
            published = self.tx.tensors(peer=addr)
            self._check_fixed(addr, published)
            found_packs.append({})
            for name, spec in published.items():
                if name.startswith(mine) and is_pack_name(name[len(mine) :]):
                    found_packs[s][name[len(mine) :]] = spec.static_shape
                    dtypes.add(spec.dtype)
                    continue
                parsed = parse_grad_name(name)
                if parsed is None or parsed[0] != self.rank:
                    continue
                _, param, part = parsed
                chunks.append(Chunk(param, part, 0, 0, spec.static_shape, s))
                dtypes.add(spec.dtype)
        # (packs that differ from ours are said once the chunks are compared: a worker of
        # another model hears which parameter differs, where the chunks say so)
        self._packs, packs_differ = self._learn_packs(found_packs)
        for p, s in self._packs.values():
            chunks.extend(Chunk(c.param, c.part, 0, 0, c.shape, s) for c in p.members)
        if len(dtypes) > 1:
            raise PSClientError(
                f"the servers disagree on the wire dtype ({', '.join(sorted(map(str, dtypes)))}): "
                "start them with the same --wire-dtype"
            )
        #: what gradients and parameters travel as, as the servers registered them
        self.wire_dtype: np.dtype[Any] = dtypes.pop() if dtypes else np.dtype(np.float32)
        self._parts: dict[str, list[Chunk]] = {}
        for param, shape in shapes.items():
            parts = sorted((c for c in chunks if c.param == param), key=lambda c: c.part)
            if [c.part for c in parts] != list(range(len(parts))) or not parts:
                raise PSClientError(
                    packs_differ or f"the servers do not hold parameter {param!r} (wrong model?)"
                )
            start = 0
            placed = []
            for c in parts:
                if tuple(c.shape[1:]) != tuple(shape[1:]):
                    raise PSClientError(
                        f"parameter {param!r}: servers hold {c.shape}, model "
                        f"has {shape} (wrong model?)"
                    )
                rows = c.shape[0] if c.shape else 1
                placed.append(Chunk(param, c.part, start, start + rows, c.shape, c.server))
                start += rows
            if start != (shape[0] if shape else 1):
                raise PSClientError(
                    f"parameter {param!r}: servers hold {start} rows, model has "
                    f"{shape} (wrong model?)"
                )
            self._parts[param] = placed
        extra = {c.param for c in chunks} - set(shapes)
        if extra:
            raise PSClientError(f"servers hold parameters the model lacks: {sorted(extra)}")
        if packs_differ:
            raise PSClientError(packs_differ)
        placed = [c for param in shapes for c in self._parts[param]]
        in_packs = {c.cid for p, _ in self._packs.values() for c in p.members}
        self._incoming = [(c.cid, c.server) for c in placed if c.cid not in in_packs]
        self._incoming += [(p.landing, s) for p, s in self._packs.values()]
        self._alone = [c for c in placed if c.cid not in in_packs]
        return placed

    def _norm_round_in(self, settings: Mapping[str, str]) -> bool | None:
        """Whether servers of ``settings`` (as one published them) clip over several shards,
        so that each step the workers add up their norms (_add_norms); None where they do not
        say (a server of another version)."""
        clip = settings.get("clip-grad-norm")
        if clip is None:
            return None
        return clip != "None" and len(self.servers) > 1 and settings.get("sync", "bsp") == "bsp"

    def _planned(self, settings: Mapping[str, str]) -> tuple[list[Chunk], list[list[Pack]]] | None:
        """How the job's settings (``settings``, as a server published them: its --split-bytes
        and --pack-bytes) cut our parameters over our servers, and each server's packs, as the
        servers compute them (plan.plan, plan.packs); None where they do not say (a server of
        another version)."""
        try:
            split_bytes = int(settings["split-bytes"])
            pack_bytes = int(settings["pack-bytes"])
        except (KeyError, ValueError):
            return None
        planned = plan(self._shapes, len(self.servers), split_bytes)
        return planned, [
            packs((c for c in planned if c.server == s), self._shapes, pack_bytes, split_bytes)
            for s in range(len(self.servers))
        ]

    def _check_same_wire(self, settings: Mapping[str, str]) -> None:
        """PSClientError where servers restarted with ``settings`` (as one published them)
        would write us otherwise than our buffers were registered for: parameters cut or
        packed otherwise, another wire dtype, or clipping over several shards turned on or off
        (its round of norms needs tensors registered for it, and without it our wait for the
        norms would wait out a look each step) (what a side leaves unsaid is not compared: a
        server of another version). Before, a server resumed with another --wire-dtype took
        the workers back and exited 1 at its first write ("dtype mismatch"), and they waited
        out their --reconnect-timeout for it."""
        before, now = (
            None if planned is None else _plan_key(*planned)
            for planned in (self._planned(self._job_settings), self._planned(settings))
        )
        if before is not None and now is not None and before != now:
            raise PSClientError(PLAN_CHANGED)
        now_round = self._norm_round_in(settings)
        if now_round is not None and now_round != self._norm_round:
            # (our tensors of the servers' norms are registered, or not, for the job's first)
            raise PSClientError(
                f"the restarted servers {'now' if now_round else 'no longer'} clip the gradient "
                f"over their {len(self.servers)} shards (--clip-grad-norm "
                f"{settings['clip-grad-norm']}; the job's first: "
                f"{self._job_settings.get('clip-grad-norm')}), for "
                "which this worker adds up their norms each step: start it again to join the "
                "servers as they are now"
            )
        wire = settings.get("wire-dtype")
        if wire is not None and wire != str(self.wire_dtype):
            raise PSClientError(
                f"the restarted servers send parameters as {wire} (their --wire-dtype) and this "
                f"worker's buffers were registered for {self.wire_dtype}, the job's first: start "
                "it again to join the servers as they are now, or restart them with "
                f"--wire-dtype {self.wire_dtype}"
            )

    def _learn_packs(
        self, found: list[dict[str, tuple[int, ...]]]
    ) -> tuple[dict[str, tuple[Pack, int]], str | None]:
        """The packs the servers published (``found``: each server's pack tensors, by name,
        with their shapes), their members computed as the servers did (plan.packs, from the
        job's --split-bytes and --pack-bytes), and what differs where a server's packs are not
        those (each pack's name carries its members' digest): a model other than the job's,
        or a server of another version. The packs of such a server are left out."""
        if not any(found):
            return {}, None
        planned = self._planned(self._job_settings)
        if planned is None:
            raise PSClientError(
                "the servers packed parameters and did not say how (their --pack-bytes): a "
                "server of another version of tensorwire?"
            )
        learned: dict[str, tuple[Pack, int]] = {}
        differ = None
        for s, (theirs, ours) in enumerate(zip(found, planned[1], strict=True)):
            if {p.cid: (p.size,) for p in ours} != theirs:
                differ = differ or (
                    f"parameter server {self.servers[s]} holds other small parameters (its "
                    f"packs, --pack-bytes {self._job_settings['pack-bytes']}) than this "
                    "worker's model has (wrong model?), or runs another version of "
                    "tensorwire; where it refused our join, its log names the parameter that "
                    "differs"
                )
                continue
            learned.update((p.cid, (p, s)) for p in ours)
        return learned, differ

    def _incoming_of(self, server: int) -> list[str]:
        """What server ``server`` writes us with each step's status word."""
        return [name for name, s in self._incoming if s == server]

    def _check_fixed(self, addr: str, published: Mapping[str, Any]) -> None:
        """PSClientError where server ``addr`` (its tensors ``published``) names another
        digest of what the job's workers hold fixed than ours (an older server names none):
        it refused our join, and would never take us."""
        said = [n for n in published if n.startswith(FIXED_PREFIX)]
        if said and fixed_name(self._fixed) not in said:
            job = said[0][len(FIXED_PREFIX) :]
            raise PSClientError(
                f"parameter server {addr} refused this worker: its model's frozen parameters "
                f"(digest {self._fixed or 'none'}) differ from the job's ({job}): build them "
                "the same on every worker (seed the factory, or load the same weights)"
            )

    # -- the loop ---------------------------------------------------------------------------

    def wait_params(self, timeout: float | None = None) -> int | None:
        """Wait until every server has written this step's parameters; return the step, or None
        when the servers said stop (the parameters are then the final ones).

        If a server is lost (killed, restarted with ``--resume``), the client reconnects to it,
        joins again, and waits for the step the restarted server resumes at. A server that went
        on without this worker (it heard nothing from it within its step timeout: the worker
        was frozen, or its machine too slow) says so, and the client joins again at the
        server's current step.

        Where the servers clip the gradient over several shards (``--clip-grad-norm``), this
        call first adds up their squared norms of the step just pushed and writes the sum back
        (they wait for it before they step): call it soon after :meth:`push`. A step whose sum
        none of the workers gives within the servers' ``--step-timeout`` is clipped by each
        shard's own norm (less), and the servers say so."""
        self._check_open("wait_params")
        assert self.rx is not None
        if timeout is not None:
            try:
                check_amount("timeout", timeout)
            except ValueError as exc:
                # before, a NaN timeout handed out the parameters unchecked when they had
                # landed, and waited for ever when they had not
                raise PSClientError(f"wait_params(): {exc}") from None
        if self._owed:
            raise PSClientError(
                f"wait_params() again before push() for step {self.step}: the servers wait for "
                "this step's gradients before they write the next parameters (push() them "
                "first; without them, this wait would last until the servers' --step-timeout "
                "dropped this worker)"
            )
        t0 = time.perf_counter()
        # (the step whose norms the servers ask us to add up, once: after a loss we join
        # again, and the servers take our join for no answer)
        norms_of = self.step if self._pushed and self._norm_round else None
        self._pushed = False
        wait = self.timeout if timeout is None else timeout
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            self._release()
            try:
                if norms_of is not None:
                    step, norms_of = norms_of, None
                    self._add_norms(step, deadline)
                # Every server's status and every parameter chunk, taken together once all
                # have landed (one wake-up for the step, not one per tensor); on a loss none
                # is taken.
                status_names = [status_name(s) for s in range(len(self.servers))]
                names = status_names + [name for name, _ in self._incoming]
                got = self._wait_all(names, deadline)
                self._held = names
                self._align(got, deadline)
                if self._joined_anew:  # the servers' first notices are in by now
                    self._joined_anew = False
                    self._read_notices()
                statuses = [got[n] for n in status_names]
                steps = {int(status[0]) for status in statuses}
                said_stop = {s for s, st in enumerate(statuses) if int(st[1]) == STATUS_STOP}
                stop = bool(said_stop)
                break
            except tw.PeerLostError as exc:
                self._recover(str(exc))
            except _Dropped as exc:
                self._recover(str(exc), dropped=True)
        t1 = time.perf_counter()
        self.phase_seconds["wait"] += t1 - t0
        if self._landed is not None:
            for into, landed in self._landed:
                widen_into(into, landed)  # 16-bit wire -> the model's float32 (wire16)
            self.phase_seconds["pull"] += time.perf_counter() - t1
        self.step = None if stop else max(steps)
        self._owed = self.step is not None
        for s in said_stop:
            self._note_stop(s, int(statuses[s][0]))
        return self.step

    def _read_notices(self) -> None:
        """Take the servers' notices: _Dropped for one that went on without us. Each server
        writes a first one, which says nothing, when it takes us in (it claims the slot then,
        while we answer); read with the first parameters after a join, and whenever a wait for
        parameters lasts PROBE_EVERY."""
        rx = self.rx
        assert rx is not None
        for s, addr in enumerate(self.servers):
            while rx.pending(dropped_name(s)):  # bounded: its ring holds two
                notice = wait_past_losses(rx, dropped_name(s), 0.0)
                flags, at, ours = int(notice[1]), int(notice[2]), int(notice[0])
                rx.release(dropped_name(s))
                if flags == STATUS_STOP:  # it let us go as it stopped (we kept it waiting)
                    self._note_stop(s, ours)
                    raise PSClientStopped(
                        f"parameter server {addr} said stop at its step {at} while we waited "
                        "for the parameters"
                    )
                if flags == STATUS_FAILED:
                    raise PSClientError(
                        f"parameter server {addr} gave up on the job before it formed: workers "
                        "it waited for did not join within its --join-timeout (its log says "
                        "which); it has exited"
                    )
                if flags == STATUS_DROPPED:
                    raise _Dropped(
                        f"parameter server {addr} said at its step {at} that it went on without "
                        "this worker: it heard nothing from us, or we took no parameters, in "
                        "time (its --step-timeout or --heartbeat-timeout; its log says which): "
                        "was this process stopped, its machine overloaded, or its link too slow "
                        "for a step in that time?"
                    )

    def _align(self, got: dict[str, Any], deadline: float | None) -> None:
        """Make every server's parameters in ``got`` those of one step. After a rejoin each
        server admits this worker at the end of its own step, and one may be a step ahead of
        another: the messages of the servers behind are skipped until they catch up (a rejoined
        worker is not waited for until its first gradients, so they do). A server restarted
        alone comes back further behind (at its checkpoint's step, or 0), and says that it has
        done no step since it started: it is asked to go on at the others' step, and does
        (see ParameterServer._catch_up). In steady state every server writes the same step, and
        this costs one comparison per server."""
        assert self.rx is not None
        shards = range(len(self.servers))
        skipped: set[int] = set()  # servers whose messages we let go of here: the next are fresh
        for _ in range(len(self.servers) * 1000):  # bounded; two steps at most in practice
            if any(int(got[status_name(s)][1]) == STATUS_STOP for s in shards):
                return  # a server that said stop writes no more: we stop
            how = [int(got[status_name(s)][STATUS_HOW]) for s in shards]
            if any(h & HOW_ASYNC for h in how):
                return  # asp, ssp: each server counts our steps on its own
            steps = [int(got[status_name(s)][0]) for s in shards]
            ahead = max(steps)
            behind = [s for s in shards if steps[s] < ahead]
            if not behind:
                return
            restarted = [s for s in behind if how[s] & HOW_MAY_CATCH_UP]
            # Far behind, though it has done steps since it started, in a message it sent
            # after we let go of its last (the one we held may be older than its step, as one
            # that nobody pushed a step of goes on at the next, see _ask_to_catch_up): a
            # server of another job, or of an older release, which does not say; waiting
            # would hang.
            stuck = [
                s for s in behind if ahead - steps[s] > 1 and s not in restarted and s in skipped
            ]
            if stuck:
                s = stuck[0]
                raise PSClientError(
                    f"parameter server {self.servers[s]} is at step {steps[s]} while the others "
                    f"are at step {ahead}, and it does not take a request to catch up: restart "
                    "every server with --resume (they checkpoint at the same steps), then the "
                    "workers"
                )
            for s in behind:  # once per message of it: one that nobody pushes goes a step
                self._ask_to_catch_up(s, steps[s], ahead, restarted=s in restarted)
            log.info(
                "servers %s wrote an earlier step than %d (they took us back a step apart, "
                "or restarted): skipping to it",
                ", ".join(self.servers[s] for s in behind),
                ahead,
            )
            for s in behind:
                names = [status_name(s), *self._incoming_of(s)]
                self.rx.release_many(names)
                self._held = [n for n in self._held if n not in names]  # if the wait fails
                got.update(self._wait_all(names, deadline))
                self._held += names
                skipped.add(s)
        raise PSClientError("the parameter servers' steps never came together")

    def _ask_to_catch_up(self, s: int, at: int, ahead: int, *, restarted: bool) -> None:
        """Ask server ``s``, at step ``at``, to go on at ``ahead``. One ``restarted`` alone
        does at once. One that has done steps does only if no worker taking part will push
        its step (each of them joined again, as we did, and skips it too), and then at the
        next step (see ParameterServer._stranded_step); otherwise its workers' gradients
        bring it to our step, and it reads the request and lets it be."""
        addr = self.servers[s]
        if restarted:
            log.warning(
                "parameter server %s came back at step %d, behind the others at step %d (it "
                "was restarted alone): asking it to go on at their step",
                addr,
                at,
                ahead,
            )
        try:
            self.tx.write(
                catch_up_name(self.rank),
                np.array([ahead], np.int64),
                peer=addr,
                # as a probe's, where the request is a fallback: slots still full hold earlier
                # requests, which the server reads once it is not held up elsewhere
                timeout=PROBE_TIMEOUT if restarted else PROBE_WRITE_TIMEOUT,
            )
        except tw.TensorWireError as exc:
            if not restarted:  # the request is a fallback: its workers may still bring it
                log.debug("no request to catch up to %s: %s", addr, exc)
                return
            # lost again, or frozen: reconnect as for any loss
            raise tw.PeerLostError(
                f"parameter server {addr} did not take our request to catch up: {exc}"
            ) from None

    def _wait_all(
        self,
        names: list[str],
        deadline: float | None,
        what: str = "the servers' parameters",
        look: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """``rx.wait_all(names)`` by ``deadline``, looking at the servers' notices (and at a
        stop asked) every :data:`NOTICE_LOOK` s of waiting, and pinging every server after
        each :data:`PROBE_EVERY` s: PeerLostError for one that does not answer. ``what``
        names the messages in a timeout's error; ``look``: called too at each look."""
        rx = self.rx
        assert rx is not None
        began = time.monotonic()
        while True:
            ping_at = time.monotonic() + PROBE_EVERY
            while True:
                now = time.monotonic()
                if deadline is not None and deadline <= now:
                    try:
                        return rx.wait_all(names, timeout=0)  # the last look
                    except tw.WireTimeoutError:
                        missing = [n for n in names if not rx.pending(n)]
                        raise tw.WireTimeoutError(
                            f"{what} did not all land within "
                            f"{now - began:.3g} s of waiting: nothing yet in {len(missing)} "
                            f"of {len(names)} tensors (first {missing[:1]})"
                        ) from None
                wait = min(NOTICE_LOOK, max(ping_at - now, 0.0))
                if deadline is not None:
                    wait = min(wait, deadline - now)
                try:
                    return rx.wait_all(names, timeout=wait)
                except tw.WireTimeoutError:
                    pass
                self._look_while_waiting()
                if look is not None:
                    look()
                if time.monotonic() >= ping_at:
                    break
            for addr in self.servers:
                try:
                    # the same looks while a frozen server holds the ping up (up to
                    # PROBE_TIMEOUT), not after it (test_ps -k hears_at_once: a ping begun
                    # just before ps0's notice heard it 5 s late)
                    self.tx.ping(addr, timeout=PROBE_TIMEOUT, check=self._look_while_waiting)
                except PSClientError:  # a stop asked, a server's notice that it stops or
                    raise  # that it gave up on the job (PSClientStopped is one)
                except tw.TensorWireError as exc:  # no answer, found dead, or its session gone
                    self._read_notices()  # what it said before it went (it gave up on the job)
                    raise tw.PeerLostError(
                        f"parameter server {addr} failed a ping while we waited for its "
                        f"parameters: {exc}"
                    ) from None
                self._probe(addr)

    def _add_norms(self, step: int, deadline: float | None) -> None:
        """(bsp, --clip-grad-norm over several shards) Add up the squared norms of ``step``'s
        mean gradient that every server sends us once it has summed the step's gradients (no
        server sees the others' chunks), in shard order, and write the sum back to every
        server, which clips its step by it (ParameterServer._global_squares): every worker
        adds the same numbers in the same order, and a server takes the first sum that lands.

        Where a server goes on without our answer (its parameters of the next step are in: it
        took another worker's sum, or clipped by its own norm) before its norm came, we have
        no sum, and say so with a NaN. PeerLostError and _Dropped as the wait for parameters
        (we then join again, which the servers take for no answer)."""
        rx = self.rx
        assert rx is not None
        shards = range(len(self.servers))
        shard_of = {norm_name(s): s for s in shards}
        norms: dict[int, float] = {}
        missing = list(shards)

        def moved_on() -> None:
            # A server's status is written after its round (and we let go of its last one
            # before this wait): it no longer waits for a sum
            if any(rx.pending(status_name(s)) for s in missing):
                raise _NoSum

        try:
            # bounded: each turn takes a message of each server missing, and a server's
            # words of earlier rounds (we joined again meanwhile) are two at most
            for _ in range(4):
                got = self._wait_all(
                    [norm_name(s) for s in missing], deadline, "the servers' norms", moved_on
                )
                for name, view in got.items():
                    at, squares = int(view[0]), float(view[1])
                    rx.release(name)
                    if at == step:
                        norms[shard_of[name]] = squares
                    elif at > step:
                        raise _NoSum  # (a server a step ahead: _align sorts it out)
                missing = [s for s in shards if s not in norms]
                if not missing:
                    break
                moved_on()
            else:
                raise _NoSum
            total = sum(norms[s] for s in shards)
        except _NoSum:
            # NaN: we have no sum, so that a server waiting for ours takes another worker's,
            # or clips by its own norm, at once rather than after its --step-timeout
            total = math.nan
        word = self._norm_sum
        word[0], word[1] = step, total
        for s, addr in enumerate(self.servers):
            if rx.pending(status_name(s)):
                continue  # it went on (another worker's sum, or its own norm): none needed
            try:
                self.tx.write(
                    norm_total_name(self.rank), word, peer=addr, timeout=PROBE_WRITE_TIMEOUT
                )
            except tw.PeerLostError:
                if rx.pending(status_name(s)):
                    # It went on meanwhile and then went: at the job's end, having said stop
                    # (the wait for parameters then ends as the servers did). Before, this
                    # loss made us join again.
                    continue
                raise
            except tw.TensorWireError as exc:
                # its slots hold our earlier sums (it took another worker's and has not
                # started its next round): it does not wait for ours
                log.debug("no sum of the norms to %s: %s", addr, exc)

    def _look_while_waiting(self) -> None:
        """What a wait for parameters looks at every NOTICE_LOOK: a stop asked, then each
        server's notices (nothing when none)."""
        self._check_stop("for the parameter servers' parameters")
        self._read_notices()

    def _probe(self, addr: str) -> None:
        """Ask server ``addr`` whether it still counts on us: one that went on without us
        answers with a notice in our ``dropped`` tensor, read at the next look (its first may
        not have reached us: over grpc, not while we were frozen)."""
        try:
            self.tx.write(
                probe_name(self.rank), self._probe_word, peer=addr, timeout=PROBE_WRITE_TIMEOUT
            )
        except tw.PeerLostError as exc:
            self._read_notices()  # what it said before it went (it gave up on the job)
            raise tw.PeerLostError(
                f"parameter server {addr} was lost while we waited for its parameters: {exc}"
            ) from None
        except tw.TensorWireError as exc:
            # Its slots still hold our earlier probes (it is held up elsewhere, and reads them
            # when it is not), or an older server has no such tensor: nothing to ask now.
            log.debug("no probe to %s: %s", addr, exc)

    def pull(self) -> dict[str, Array]:
        """The parameters of the current step (views; valid until the next push)."""
        return self.params

    def host_params(self) -> dict[str, Array]:
        """Copies of the current parameters in host memory (numpy), wherever they live."""
        if self.device == "cpu":
            return {p: np.array(v) for p, v in self.params.items()}
        cp = cupy()  # the GPU buffers are cupy arrays, so cupy is there
        return {p: cp.asnumpy(v) for p, v in self.params.items()}

    def _release(self) -> None:
        if self.rx is not None and self._held:
            self.rx.release_many(self._held)
        self._held = []

    def _recover(self, reason: str, *, dropped: bool = False) -> None:
        """A server went away, or went on without us (``dropped``): reconnect (waiting for a
        lost one to come back) and join again."""
        if dropped:
            log.warning("%s; joining the parameter servers again", reason)
        else:
            log.warning(
                "lost a parameter server (%s); reconnecting, waiting up to %.0f s for it to "
                "come back (--reconnect-timeout)",
                reason,
                self.reconnect_timeout,
            )
        self._release()
        rx = self.rx
        assert rx is not None
        deadline = time.monotonic() + self.reconnect_timeout

        def reach_again() -> None:
            # A server that said stop meanwhile (its last status, or a notice) ends the job
            self._heed_stop("as we joined again")
            for name in [
                *(status_name(s) for s in range(len(self.servers))),
                *(dropped_name(s) for s in range(len(self.servers))),
                *(norm_name(s) for s in range(len(self.servers)) if self._norm_round),
                *(name for name, _ in self._incoming),
            ]:
                rx.drain(name)  # what a lost server left half written, and its loss notice
            self._reconnect(deadline)

        self._recovering = True
        try:
            reach_again()
            # Another server lost while we join again (killed after we reached it) is waited
            # for too, within the same --reconnect-timeout. Before, its loss ended the worker
            # (exit 1) in a chaos run (shm, bsp, 3 x 3, seed 123).
            self._until_joined(
                lambda: self._rejoin(deadline),
                reach_again,
                deadline,
                self.reconnect_timeout,
                "joining again",
            )
        finally:
            self._recovering = False
        self.reconnects += 1
        self._joined_anew = True
        log.warning("rejoined the parameter servers")

    def _rejoin(self, deadline: float) -> None:
        """Join every server reached again (by ``deadline``, at least 1 s each wait), check
        that they hold the plan they held, and say we are ready."""
        self._join(max(deadline - time.monotonic(), 1.0))
        self._await_registration(max(deadline - time.monotonic(), 1.0))
        before = [(c.cid, c.shape, c.server) for c in self.chunks], list(self._packs)
        self.chunks = self._learn_plan(self._shapes)
        if ([(c.cid, c.shape, c.server) for c in self.chunks], list(self._packs)) != before:
            raise PSClientError(PLAN_CHANGED)  # (their settings said the same: _check_same_wire)
        if self.rank == 0 and self.step is not None:
            # a server that restarted afresh starts from ours (once the servers wrote them:
            # while we first join, the initial values we were given)
            self._init = self.host_params()
        self._say_ready(deadline)

    def push(
        self,
        grads: Mapping[str, Array | None],
        *,
        loss: float = float("nan"),
        correct: int = 0,
        samples: int = 0,
        accuracy: float | None = None,
    ) -> None:
        """Send this step's gradients (each server gets its rows, one-sided) and the step's
        metrics; the parameters may change from here on. If a server is lost meanwhile, the
        client reconnects; the step is then redone from the restarted server's checkpoint.

        ``grads[name]`` None: this step has no gradient of that parameter (its forward pass did
        not use it: PyTorch's ``param.grad`` None). Under bsp it counts as zeros in the average
        of the workers that have one, and a parameter none of them has is left as it is, its
        optimizer state too (momentum, weight decay and Adam do not move it), as PyTorch's
        optimizers skip a parameter whose ``grad`` is None; under asp and ssp this push leaves
        it alone.

        Where the servers clip each push (asp and ssp with ``--clip-grad-norm``), the squared
        norm of the whole gradient is taken here and goes with it (one synchronisation of a
        GPU's gradients): every server scales the push by the same number."""
        self._check_open("push")
        if self.step is None:
            raise PSClientError("push() before wait_params() returned a step")
        if self._pushed:
            raise PSClientError(
                f"push() again for step {self.step}: call wait_params() for the next step first "
                "(the servers would count these gradients twice)"
            )
        missing = [p for p in self._shapes if p not in grads]
        if missing:
            raise PSClientError(f"push(): no gradient for {', '.join(missing)}")
        # Before anything is released or written: over a 16-bit wire each gradient is rounded
        # into a buffer by assignment, which would broadcast a wrong shape (a scalar, an extra
        # axis of 1) into the servers' rows without a word.
        dense: dict[str, Any] | None = None  # (the gradients, sparse ones made dense)
        for param, shape in self._shapes.items():
            g = grads[param]
            if g is None:
                continue  # no gradient this step (see above)
            got = getattr(g, "shape", None)
            if got is None or tuple(got) != tuple(shape):
                raise PSClientError(
                    f"push(): the gradient of {param!r} is "
                    f"{'not an array' if got is None else f'of shape {tuple(got)}'}; the "
                    f"parameter's shape is {tuple(shape)}"
                )
            # (numpy's and cupy's float32 compare equal at once: the check costs a step of a
            # large model nothing; a torch dtype is named through canonical_dtype)
            dtype = "float32" if g.dtype == np.float32 else _dtype_name(g)
            if dtype != "float32":
                # before, refused by the transport under the name of an internal tensor
                # (grad/0/w@0) over a float32 wire, and rounded silently over a 16-bit one
                raise PSClientError(
                    f"push(): the gradient of {param!r} is {dtype}; the parameters are "
                    "float32: push float32 gradients (numpy: g.astype(np.float32))"
                )
            made_dense = _dense(g)
            if made_dense is not None:
                if dense is None:
                    dense = dict(grads)
                dense[param] = made_dense
        if dense is not None:
            grads = dense
        try:
            loss = float(loss)
        except (TypeError, ValueError):
            raise PSClientError(f"push(): loss must be a number, got {loss!r}") from None
        t0 = time.perf_counter()
        squares = self._push_squares(grads) if self._clip_each else math.nan
        self._release()
        try:
            batch: list[tuple[str, Array, str]] = []
            flag_at, metas = self._flag_at, self._metas
            for cid, (p, s) in self._packs.items():
                out = self._gather(p, grads)
                for c in p.members:  # (a member without a gradient is zeros, as one alone)
                    metas[s][flag_at[c.cid]] = 0.0 if grads[c.param] is None else 1.0
                batch.append((grad_name(self.rank, cid), out, self.servers[s]))
            for c in self._alone:
                g = grads[c.param]
                if g is None:
                    # zeros, flagged as no gradient: the server waits for every chunk it holds
                    rows = self._no_grad.get(c.cid)
                    if rows is None:
                        rows = self._no_grad[c.cid] = np.zeros(c.shape, self.wire_dtype)
                    metas[c.server][flag_at[c.cid]] = 0.0
                else:
                    rows = g[c.start : c.stop] if g.ndim else g
                    out = self._grads_out.get(c.cid)
                    if out is not None:  # a 16-bit wire: rounded into a buffer allocated once
                        narrow_into(out, as_host_array(rows, c.cid))
                        rows = out
                    metas[c.server][flag_at[c.cid]] = 1.0
                batch.append((grad_name(self.rank, c.cid), rows, self.servers[c.server]))
            score = math.nan if accuracy is None else accuracy
            for meta, addr in zip(metas, self.servers, strict=True):
                meta[:META_FIELDS] = (self.step, loss, correct, samples, score, squares)
                batch.append((meta_name(self.rank), meta, addr))
            # One operation: every array checked first, one doorbell or sendmsg per server.
            self.tx.write_many(batch, allow_copy=True)
            self._pushed = True
            self._owed = False
        except tw.PeerLostError as exc:
            self._recover(str(exc))
            self._owed = False  # joined again: the next wait_params() gives the step to redo
        self.phase_seconds["push"] += time.perf_counter() - t0

    def _push_squares(self, grads: Mapping[str, Array | None]) -> float:
        """(asp, ssp, --clip-grad-norm) The squared norm of this push's whole gradient (of
        every parameter that has one), which the meta carries to every server: each scales
        the push by the same number, where none sees the other shards' chunks. Torch tensors
        by torch's multi-tensor norm, as ``clip_grad_norm_`` takes it (1000 tensors of 256
        values on this VM's CPU: 1.1 ms, where a ``torch.dot`` each took 4.8 ms and a DLPack
        import each would cost more), the rest as numpy or cupy arrays (numpy: 0.5 ms); one
        synchronisation per GPU."""
        by_torch: dict[Any, list[Any]] = {}
        others: list[Any] = []
        device: int | None = None  # (the GPU of the first of ``others`` on one)
        for param in self._shapes:
            g: Any = grads[param]
            if g is None:
                continue
            if type(g).__module__.startswith("torch"):
                by_torch.setdefault(g.device, []).append(g.detach())
                continue
            on = array_device(g)
            if on is None:
                others.append(as_host_array(g, param))
            else:
                others.append(as_device_array(g, param))
                device = on if device is None else device
        total = 0.0
        if by_torch:
            import torch  # the gradients are torch tensors

            # (private, but what clip_grad_norm_ itself calls since torch 2.0; its public
            # wrapper, get_total_norm, came with 2.6 and we take 2.3)
            foreach_norm = getattr(torch, "_foreach_norm", None)
            for tensors in by_torch.values():
                norms = (
                    foreach_norm(tensors)
                    if foreach_norm is not None
                    else [torch.linalg.vector_norm(t) for t in tensors]
                )
                total += float(torch.stack(norms).to(torch.float64).square().sum())
        if others:
            if device is None:
                total += squared_norm(others)
            else:
                with cupy().cuda.Device(device), current_stream(device):
                    total += squared_norm(others)
        return total

    def _gather(self, pack: Pack, grads: Mapping[str, Array | None]) -> Any:
        """The gradients of ``pack``'s members, side by side in its buffer (rounded to the
        wire's dtype where it is 16-bit; zeros for a member without one): what goes out as the
        pack's one tensor. On a GPU the copies queue on the stream the transport then copies
        on (``tensorwire.cuda.current_stream``: torch's where it has one current), behind the
        work that made the gradients (a torch tensor is read through DLPack, which orders it
        so), so the write reads them complete."""
        out = self._pack_out[pack.cid]
        if self._gathered_by_torch(pack, out, [grads[c.param] for c in pack.members]):
            return out
        if isinstance(out, np.ndarray):
            for c, (lo, hi) in zip(pack.members, pack.bounds, strict=True):
                g = grads[c.param]
                if g is None:
                    out[lo:hi] = 0
                else:  # (rounded to a 16-bit wire's dtype by wire16: numpy's cast is slow)
                    narrow_into(out[lo:hi], _host_flat(g, c.param))
            return out
        cp = cupy()
        device = parse_device(self.device)
        assert device is not None
        with cp.cuda.Device(device), current_stream(device):
            for c, (lo, hi) in zip(pack.members, pack.bounds, strict=True):
                g = grads[c.param]
                if g is None:
                    out[lo:hi].fill(0)
                else:
                    out[lo:hi] = as_device_array(g, c.param).reshape(-1)
        return out

    def _gathered_by_torch(self, pack: Pack, out: Any, grads: list[Any]) -> bool:
        """Where every gradient of ``pack`` is a torch tensor (those of a ``torch.nn.Module``
        on a GPU: ``module_grads``) on ``out``'s device, in ``out``'s dtype: gathered by one
        ``torch.cat`` into ``out`` (on torch's current stream, the one the transport copies on
        where torch has one current: ``tensorwire.cuda.current_stream``), where a copy each
        would cost a DLPack import and a launch per member; True if so."""
        present = [g for g in grads if g is not None]
        if not present or not all(type(g).__module__.startswith("torch") for g in present):
            return False
        import torch  # the gradients are torch tensors

        view = self._torch_out.get(pack.cid)
        if view is None:
            try:
                view = (
                    torch.from_numpy(out) if isinstance(out, np.ndarray) else torch.from_dlpack(out)
                )
            except (TypeError, RuntimeError):  # a 16-bit wire's ml_dtypes buffer: copied each
                return False
            self._torch_out[pack.cid] = view
        if any(g.device != view.device or g.dtype != view.dtype for g in present):
            return False
        parts = []
        for c, (lo, hi), g in zip(pack.members, pack.bounds, grads, strict=True):
            if g is None:
                zeros = self._torch_zeros.get(c.cid)
                if zeros is None:
                    zeros = torch.zeros(hi - lo, dtype=view.dtype, device=view.device)
                    self._torch_zeros[c.cid] = zeros
                parts.append(zeros)
            else:
                parts.append(g.detach().reshape(-1))
        torch.cat(parts, out=view)
        return True

    @property
    def comm_seconds(self) -> float:
        """Every second spent communicating (waiting, pulling, pushing)."""
        return sum(self.phase_seconds.values())

    def close(self) -> None:
        """Tell the servers we stop and release every socket and buffer. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._leave()
        finally:  # (a stop asked while we wait to tell a server that the job ended, Ctrl-C)
            self.tx.close()
            if self.rx is not None:
                self.rx.close()

    def _leave(self) -> None:
        """Tell every server that did not say stop that we stop, so that it does not wait for
        our gradients until its step timeout: with several servers, a SIGTERM to all of them
        stops each at the end of its own step, and one may be a step behind the others.

        Where a server said stop, the others hear the step it gave (plan.ended_name) before
        the leave. Where the job is done, those we cannot tell now (lost, frozen: killed in
        the job's last steps and not yet back) are waited for, within --reconnect-timeout, and
        told once they answer (:meth:`_tell_end`): a server back from a checkpoint behind the
        job's end would otherwise wait for workers that have exited, and at --join-timeout
        exit 1 (`bench chaos`, shm ssp, seed 5304). Where the job was stopped, or we stop
        alone, a server we cannot tell is not waited for: it sees us gone by our exit or our
        silence."""
        if self.rx is None or (not self.chunks and self._stopped_at is None):
            return  # never joined, nor reached a server that had ended the job
        if self.tx.closed:
            return  # a forked child's copy: the sender, and the goodbye, are its parent's
        untold = [
            s
            for s, addr in enumerate(self.servers)
            if s not in self._told_stop and not self._say_we_leave(addr)
        ]
        if untold and self._done:
            self._tell_end(untold)

    @property
    def _done(self) -> bool:
        """We stop because the job is done (under asp and ssp, our steps are): a server said
        stop at its last step, or had ended the job when we reached it. Not a stop asked of a
        server (an operator taking the job down: the workers do not wait for the servers that
        did not hear it, and exit at once)."""
        if self._stopped_at is None:
            return False
        return self._found_done or (
            self._job_steps is not None and self._stopped_at >= self._job_steps
        )

    def _say_we_leave(self, addr: str) -> bool:
        """Write our leave to server ``addr`` (after the step the job stopped at, where a
        server said stop); False where it could not be told now: not reached (lost), frozen,
        or gone. True also for an older server that has no such tensor (nothing to tell)."""
        if addr not in self.tx.peers:
            return False  # lost, and not reached again
        # Why: the job stops (a server said stop), or we do while it trains on: for good, or
        # to be started again.
        if self._stopped_at is not None:
            reason = LEAVE_JOB_STOPS
        else:
            reason = LEAVE_TO_RETURN if self.returning else LEAVE_ALONE
        try:
            published = self.tx.tensors(peer=addr)
            spec = published.get(leave_name(self.rank))
            if spec is None:
                return True  # an older server, or one of another job: none to tell
            # (our session where it has room for it: an older server takes the reason alone)
            why = encode_leave(reason, self._session if spec.dynamic else None)
            if self._stopped_at is not None and ended_name(self.rank) in published:
                how = ENDED_JOB_DONE if self._found_done else ENDED_TOLD_STOP
                at = np.array([self._stopped_at, how], np.int64)
                self.tx.write(ended_name(self.rank), at, peer=addr, timeout=LEAVE_TIMEOUT)
            self.tx.write(leave_name(self.rank), why, peer=addr, timeout=LEAVE_TIMEOUT)
        except tw.WireTimeoutError:
            # Frozen or held up: our goodbye, as we close, would wait for its answer too
            # (GOODBYE_TIMEOUT, 5 s).
            with contextlib.suppress(tw.TensorWireError):
                self.tx.remove_peer(addr, goodbye=False)
            return False
        except tw.TensorWireError:
            return False  # gone
        return True

    def _reached_anew(self, addr: str, deadline: float) -> str | None:
        """(:meth:`_tell_end`) Reach server ``addr`` in a session anew (a restarted server
        knows none of the old ones), and tell it that we leave: "told"; "found" where it says
        that the job is done (another worker told it first, and it answers so a while:
        server.linger.ENDED_ELSEWHERE_LINGER; or it came back from a checkpoint of the job's
        end). None where it does not answer yet, or has not registered the tensors yet (it
        registers them as it starts)."""
        with contextlib.suppress(tw.TensorWireError):
            self.tx.remove_peer(addr, goodbye=False)
        try:
            left = deadline - time.monotonic()
            self.tx.add_peer(addr, connect_timeout=max(min(JOIN_WRITE_TRY, left), 0.1))
            if job_done(self.tx.receiver_info(peer=addr)) is not None:
                return "found"
            if leave_name(self.rank) not in self.tx.tensors(peer=addr):
                return None
        except tw.TensorWireError:
            return None
        return "told" if self._say_we_leave(addr) else None

    def _tell_end(self, untold: list[int]) -> None:
        """Reach each server in ``untold`` again, and tell it that the job stopped (and at
        what step), as it answers; until --reconnect-timeout, or a stop asked of us."""
        names = ", ".join(self.servers[s] for s in untold)
        log.warning(
            "the job ended (a parameter server said stop, at step %d); %s did not hear it (lost "
            "or not answering): telling it once it answers, for up to %g s (--reconnect-timeout)",
            self._stopped_at,
            names,
            self.reconnect_timeout,
        )
        deadline = time.monotonic() + self.reconnect_timeout
        while True:
            for s in list(untold):
                how = self._reached_anew(self.servers[s], deadline)
                if how is not None:
                    untold.remove(s)
                    log.warning(
                        "told parameter server %s that the job ended at step %d"
                        if how == "told"
                        else "parameter server %s knew that the job had ended (at step %d)",
                        self.servers[s],
                        self._stopped_at,
                    )
            if not untold:
                return
            if self._stopping is not None and self._stopping():
                log.warning("stopped before telling %s that the job ended", names)
                return
            if time.monotonic() >= deadline:
                log.warning(
                    "%s did not answer within %g s (--reconnect-timeout): not told that the "
                    "job ended (it waits for the workers until its --join-timeout)",
                    ", ".join(self.servers[s] for s in untold),
                    self.reconnect_timeout,
                )
                return
            time.sleep(TELL_END_EVERY)

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plan_key(chunks: list[Chunk], packed: list[list[Pack]]) -> tuple[list[Any], list[str]]:
    """What of a plan (:meth:`PSClient._planned`) our buffers were registered for: each
    chunk's name, shape and server, and each pack's name (its members' digest)."""
    return [(c.cid, c.shape, c.server) for c in chunks], [p.cid for ps in packed for p in ps]


def _dense(g: Any) -> Any:
    """A sparse gradient made dense, a copy, as module_grads makes it (the servers step every
    row of a chunk); None where ``g`` is dense. Sparse: a torch tensor of another layout than
    strided (``nn.Embedding(sparse=True)``'s: the rows a batch looked up), or a scipy or cupyx
    sparse matrix (no array interface, a ``toarray``). Before, a torch one's rows' slice or
    its pack's gather raised torch's own error ("reshape is not implemented for sparse
    tensors"), and a scipy one travelling alone was refused under an internal tensor's name."""
    layout = getattr(g, "layout", None)  # (a torch tensor's)
    if layout is not None:
        return g.to_dense() if str(layout) != "torch.strided" else None
    if isinstance(g, np.ndarray) or any(
        hasattr(g, a) for a in ("__array_interface__", "__cuda_array_interface__", "__dlpack__")
    ):
        return None
    toarray = getattr(g, "toarray", None)
    return toarray() if callable(toarray) else None


def _clips_each_push(settings: Mapping[str, str]) -> bool:
    """Whether servers of ``settings`` (as one published them) clip each push by the norm of
    the worker's whole gradient (asp and ssp with --clip-grad-norm), which the worker then
    takes and sends with it."""
    clip = settings.get("clip-grad-norm")
    return clip not in (None, "None") and settings.get("sync", "bsp") != "bsp"


def _check_same_settings(
    one: tuple[str, dict[str, str]], other: tuple[str, dict[str, str]]
) -> None:
    """PSClientError naming each setting two servers of the job disagree on."""
    (a, mine), (b, theirs) = one, other
    differ = [k for k in sorted({*mine, *theirs}) if mine.get(k) != theirs.get(k)]
    if differ:
        said = "; ".join(
            f"--{k} {mine.get(k, '?')} on {a}, {theirs.get(k, '?')} on {b}" for k in differ
        )
        raise PSClientError(
            f"the job's servers were started with different settings ({said}): restart them "
            "with the same flags (each would end the job at its own step, or train its shard "
            "otherwise)"
        )
