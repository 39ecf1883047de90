"""The ``nixl`` transport: one-sided RDMA writes through NVIDIA NIXL, with UCX underneath.

Setup goes through tensorwire's own authenticated control plane (NIXL's listener thread and etcd
are not used): the receiver registers each of its regions with a NIXL agent; a sender creates two
agents (one writes, one notifies: see NixlChannel) and sends its notifier's metadata in an
``Attach`` request; the receiver loads it and answers with its own metadata and every region's base
address. From then on:

* **Sender**: a write is one NIXL WRITE from the caller's array straight into the receiver's slot;
  once NIXL reports it done (the bytes are in the receiver's memory, and the array may be reused)
  the data header follows as a notification behind a message counter. RDMA can only read
  registered memory: a source array is registered the first time it is written and kept registered
  (with its transfer requests prepared) while the caller still holds it, so a training loop that
  reuses its buffers pays registration once; small payloads are copied into a staging buffer
  registered once per tensor, as is what ``Sender.buffer`` fills. GPU arrays are registered as
  NIXL ``VRAM`` (and never staged); a GPU tensor's slots are ``VRAM`` at the receiver, so UCX
  moves GPU memory to GPU memory (``cuda_ipc`` on one host, GPUDirect RDMA across a fabric).
* **Receiver**: a thread polls the agent for notifications (NIXL offers no descriptor to block on),
  puts them back in counter order (UCX does not promise order across lanes), validates each header
  exactly as the ``tcp`` transport does and completes the slot: sequence number, doorbell. Credits
  go back as notifications carrying the cumulative released count.

The payload lands before its header is checked: that is what a one-sided write is. A sender that
breaks the rules (wrong slot, sequence or size) is cut off and its loss reported, as with ``shm``,
but its bytes cannot be stopped from landing: its keys cover every region of the receiver.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .. import wire
from ..cuda import data_pointer, device_bytes, hold_context, synchronize_current
from ..doorbell import deadline_of
from ..dtypes import exports_buffer
from ..endpoint import is_loopback_host
from ..errors import (
    LocalProtocolError,
    PeerLostError,
    TensorWireError,
    TransportError,
    WireTimeoutError,
)
from ..layout import OFF_SCRATCH, SCRATCH_SIZE
from ..memory import CUDA, HOST, Memory, RegionInfo
from ..process import host_identity
from ..quietlog import QuietLog
from ..rdma import (
    NixlOptions,
    create_agent,
    is_remote_disconnect,
    shared_memory_notifications,
)
from ..ring import SlotChooser
from .base import (
    CONSUMER_DRIVES,
    ENDED_BY_RECEIVER,
    PROBE_EVERY,
    Channel,
    CreditedWriter,
    CreditLink,
    DataServer,
    DataSink,
    PeerInfo,
    Poller,
    ServerSettings,
    TensorEntry,
    TensorWriter,
    live_sink,
)

log = logging.getLogger(__name__)
#: warnings about what a peer can send: rate-limited per reason, each counted in the metrics
quiet = QuietLog(log)

#: Credit-frame tensor ids with a meaning of their own.
BYE_ACK = 0xFFFFFFFE  # every notification up to the sender's goodbye has been completed
SESSION_ENDED = 0xFFFFFFFD  # the receiver closed, or cut this sender off
PING = 0xFFFFFFFC  # sender -> receiver at connect, and probe_peer's (a credit frame); echoed back
#: the count a receiver's own ping carries (_ping_senders): not the echo a sender's connect
#: waits for (which carries 0), and answered by nobody
UNASKED = 1
#: Notifications a receiver holds back while it waits for an earlier one.
MAX_OUT_OF_ORDER = 4096
#: Prepared transfer requests kept per registered source array (one per slot it went to).
MAX_REQUESTS_PER_SOURCE = 64
#: How often every open channel's notifier is given progress while its writer does not call
#: (:class:`_IdleProgress`): a notification that could not leave at once waits in UCX for
#: progress on our side, and only that progress sends it.
IDLE_PROGRESS_INTERVAL = 0.02
#: A posted transfer that has not completed in this long means the receiver is unreachable.
TRANSFER_TIMEOUT = 60.0
#: Seconds between a waiting writer's looks at its receiver's liveness (a pidfd on this host)
RECEIVER_CHECK_EVERY = 0.005
#: How often a receiver's NIXL server pings its senders (:meth:`NixlDataServer._ping_senders`).
PING_SENDERS_EVERY = 1.0
#: what NIXL calls each kind of memory (tensorwire.memory) it registers
_NIXL_MEMORY = {HOST: "DRAM", CUDA: "VRAM"}


class Backoff:
    """Polling without a wake-up descriptor (NIXL offers none to block on).

    For ``spin`` seconds after the last activity the poller only yields the CPU; until ``warm``
    seconds it sleeps ``min_sleep`` at a time (the next message of a busy loop is probably near);
    after that its sleeps double up to ``max_sleep``, so an idle endpoint costs almost nothing.
    The receiver's poller completes every slot and returns every credit, so its responsiveness
    is each message's latency. Measured on a 2-core VM, 4 KiB writes 5 ms apart
    (``python -m tensorwire.bench.polling``): 223 µs one way at 2.8% of a core while idle; NIXL's
    own progress thread 150 µs at 102% of a core (an earlier plain doubling backoff: 1.5 ms).
    """

    def __init__(
        self,
        spin: float = 200e-6,
        warm: float = 20e-3,
        min_sleep: float = 50e-6,
        max_sleep: float = 1e-3,
    ) -> None:
        self.spin = spin
        self.warm = warm
        self.min_sleep = min_sleep
        self.max_sleep = max_sleep
        self._since: float | None = None
        self._sleep = min_sleep

    def reset(self) -> None:
        self._since = None
        self._sleep = self.min_sleep

    def pause(self) -> None:
        now = time.perf_counter()
        if self._since is None:
            self._since = now
        idle = now - self._since
        if idle < self.spin:
            os.sched_yield()
        elif idle < self.warm:
            time.sleep(self.min_sleep)
        else:
            time.sleep(self._sleep)
            self._sleep = min(self._sleep * 2, self.max_sleep)


def _name(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------------------------
# Sender side
# --------------------------------------------------------------------------------------------


class _Source:
    """A source array registered with the sender's agent, with its prepared transfer requests."""

    __slots__ = ("address", "array", "descs", "device", "memory", "requests")

    def __init__(self, array: Any, descs: Any, memory: str, device: int) -> None:
        self.array: Any = array  # keeps the memory alive while registered (numpy or cupy)
        self.address = data_pointer(array)
        self.descs = descs
        self.memory = memory  # NIXL's name for its kind: DRAM or VRAM
        self.device = device
        #: (remote address, bytes) -> prepared transfer request (a staging buffer sends
        #: prefixes of several lengths from one registration)
        self.requests: dict[tuple[int, int], Any] = {}


#: A posted WRITE: its source, its request's key there, the request and its state at posting.
_Transfer = tuple[_Source, tuple[int, int], Any, str]


class _Posted(NamedTuple):
    """A message of a batch whose WRITE is posted and whose header is not sent yet."""

    writer: NixlWriter
    slot: int
    header: wire.DataHeader
    transfer: _Transfer


def _memory_of(array: Any) -> tuple[str, int]:
    """NIXL's memory type and device id for an array's memory."""
    if isinstance(array, np.ndarray):
        return "DRAM", 0
    return "VRAM", int(array.device.id)


class NixlChannel(Channel):
    transport = "nixl"

    def __init__(self, info: PeerInfo) -> None:
        self._where = info.control_address
        if "nixl" not in info.welcome.transports:
            raise TransportError(
                f"receiver at {self._where} does not serve nixl (NIXL is not installed there, or "
                "it was created with nixl=False)"
            )
        if info.request is None:
            raise TransportError("transport 'nixl' needs the control plane to attach")
        self._request = info.request
        self._timeout = info.timeout
        #: the sender's check of the receiver (its process on this host; the heartbeats'
        #: verdict during the set-up): every wait for the receiver's notifications calls it
        self._check_receiver = info.check
        self._next_check = 0.0  # when _absorb_until calls it next (monotonic)
        self._next_probe = 0.0  # when probe_peer may ping the receiver next (monotonic)
        self._generation = info.welcome.generation
        self._same_host = info.same_host
        self._options = info.nixl if isinstance(info.nixl, NixlOptions) else NixlOptions()
        # Two agents: one only writes, one only talks. A NIXL transfer ends with an endpoint
        # flush, and on an endpoint that has also carried notifications that flush waits for the
        # receiving process to make progress; on an endpoint that only writes it completes at
        # once (measured: a 4 KiB write and its header took 190 µs through one agent, 6.5 µs
        # through two).
        self._agent: Any = None  # registers sources and posts the WRITEs
        self._notifier: Any = None  # sends the headers and the goodbye, receives credits
        self._remote = ""
        self._remote_metadata = b""  # the receiver's agent metadata, from the latest attach
        self._bases: list[int] = []  # each receiver region's address in the receiver's memory
        #: our writing agent was created with a CUDA context current (see _need_cuda)
        self._cuda_ready = False
        self._sources: OrderedDict[tuple[int, int], _Source] = OrderedDict()
        #: the writers' staging buffers, registered once each for the channel's lifetime
        self._staging: list[_Source] = []
        self._released: dict[int, int] = {}
        self._counter = 0  # notifications sent so far (the next one's counter)
        self._bye_acked = False
        self._ponged = False
        self._backoff = Backoff()
        # Held while notifications are taken in: by the writer's thread, or by the idle
        # progress, which skips a channel whose writer is at it.
        self._absorbing = threading.Lock()
        try:
            self._name = name = f"tw-tx-{os.getpid()}-{secrets.token_hex(6)}"
            self._loopback = loopback = is_loopback_host(info.control_host)
            self._mm_errh = shared_memory_notifications(self._options, loopback)
            if any(region.kind != HOST for region in info.regions):
                # GPU slots: UCX must see a CUDA context when the writing agent starts
                self._cuda_ready = hold_context()
            self._agent = create_agent(name, self._options, loopback)
            self._notifier = create_agent(f"{name}-n", self._options, loopback)
            self._attach()
            self._warm_up()
        except BaseException:
            self.close()
            raise
        _IDLE_PROGRESS.add(self)

    # -- set-up ----------------------------------------------------------------------------

    def _attach(self) -> None:
        """Send our notifier's metadata (the receiver answers that agent); load the receiver's
        into both of our agents, with every region's base address."""
        md = self._notifier.get_agent_metadata()
        # The host and UCX_MM_ERROR_HANDLING let the receiver refuse an agent it could not
        # reach, before loading its metadata (which would crash NIXL: see _check_peer_agent).
        details = {"metadata": md, "host": host_identity(), "mm_error_handling": self._mm_errh}
        reply = self._request(wire.Attach(self._generation, "nixl", details), self._timeout)
        if not isinstance(reply, wire.Attached):
            raise LocalProtocolError(f"expected attached from {self._where}, got {reply.TYPE}")
        metadata, regions = reply.details.get("metadata"), reply.details.get("regions")
        try:
            if not isinstance(metadata, bytes) or not isinstance(regions, list):
                raise TypeError("missing metadata or regions")
            bases = [int(address) for address, _size in regions]
        except (TypeError, ValueError) as exc:
            raise LocalProtocolError(f"malformed nixl details from {self._where}: {exc}") from None
        try:
            name = _name(self._agent.add_remote_agent(metadata))
            also = _name(self._notifier.add_remote_agent(metadata))
        except Exception as exc:  # NIXL's own exception types
            # The receiver may have closed just after it answered, its agent with it: UCX then
            # finds nobody at the agent's address. Asked again, a receiver that is gone says
            # so (PeerLostError: the receiver now at its endpoint, a parameter server's that
            # lingers once its job is done, knows no session of ours), and the caller reaches
            # it anew; one that answers is there, and its agent cannot be reached from here.
            # Before, such a race ended a worker rejoining its ending servers with exit 1
            # (`bench chaos --steps`, nixl, seed 4535).
            self._request(wire.Attach(self._generation, "nixl", details), self._timeout)
            raise TransportError(f"cannot load the NIXL metadata of {self._where}: {exc}") from exc
        if also != name:
            raise LocalProtocolError(f"receiver at {self._where} sent inconsistent metadata")
        if self._remote and name != self._remote:
            raise LocalProtocolError(f"receiver at {self._where} changed its agent name to {name}")
        self._remote = name
        self._remote_metadata = metadata
        self._bases = bases

    def _warm_up(self) -> None:
        """Connect now and move a few bytes into the region header's scratch line: the first
        transfer pays UCX's endpoint wire-up and protocol selection, which is connect's cost,
        not the first write's."""
        self._agent.make_connection(self._remote)
        self._notifier.make_connection(self._remote)
        # The notifier's endpoint is wired up only once both sides have made progress on it; a
        # header sent before that waits in UCX until our next call into the agent, which may be
        # long after write() returned. One echoed ping settles it.
        self._notifier.send_notif(self._remote, wire.encode_credit(PING, 0))
        deadline = deadline_of(self._timeout if self._timeout is not None else 60.0)
        if not self._absorb_until(lambda: self._ponged, deadline):
            hint = (
                " (its agent has UCX_MM_ERROR_HANDLING=y, as this sender's: a process of this "
                "host killed while it sent there may have left it deaf for good; docs/rdma.md)"
                if self._mm_errh and self._same_host
                else ""
            )
            raise WireTimeoutError(f"receiver at {self._where} did not answer a NIXL ping{hint}")
        self._warm_writes()

    def _warm_writes(self) -> None:
        """Move a few bytes through the writing agent into the first region's scratch line."""
        src = self._register(np.zeros(SCRATCH_SIZE, dtype=np.uint8))  # not cached: used once
        try:
            self.put(src, self._bases[0] + OFF_SCRATCH, b"", ("DRAM", 0))
        finally:
            _drop_source(self._agent, src)

    def update_regions(self, regions: list[RegionInfo]) -> None:
        if len(regions) > len(self._bases):
            self._attach()  # the receiver registered new regions: fresh metadata and addresses

    def _need_cuda(self) -> None:
        """Before GPU memory is written from or into: make sure our writing agent was created
        with a CUDA context current, creating it anew if not.

        UCX decides when an agent starts whether its ``cuda_ipc`` transport can be used; an
        agent created before the process had a context (a sender connected before it touched
        the GPU, to a receiver whose GPU tensors came later) moves GPU memory by "software
        emulation" over TCP, measured at 0.5 GB/s where ``cuda_ipc`` made 239 (16 MiB, H100).
        Only the writing agent is made again: the receiver knows our notifier, not this agent,
        and the writes in flight are all complete (every write waits for its own; a batch sends
        what it posted before a GPU payload)."""
        if self._cuda_ready or not hold_context():
            return  # done before, or no CUDA here (cupy would have said so to the caller)
        self._cuda_ready = True  # tried once: where it fails, the agent we have goes on
        old = self._live_agent()
        agent: Any = None
        registered: list[Any] = []
        try:
            agent = create_agent(f"{self._name}-cuda", self._options, self._loopback)
            if _name(agent.add_remote_agent(self._remote_metadata)) != self._remote:
                raise LocalProtocolError(f"receiver at {self._where} changed its agent name")
            agent.make_connection(self._remote)
            for src in self._staging:  # writers hold these: registered again in place
                registered.append(_register_with(agent, src.array, src.memory, src.device))
        except Exception as exc:  # keep the agent we have: slower for GPU memory, but it works
            for descs in registered:
                with contextlib.suppress(Exception):
                    agent.deregister_memory(descs)
            del agent  # the last reference: NIXL tears it down
            log.warning(
                "nixl to %s: no NIXL agent could be made with a CUDA context (%s); GPU memory "
                "goes through the agent made before it, which UCX may move by TCP",
                self._where,
                exc,
            )
            return
        for src in self._sources.values():
            _drop_source(old, src)
        self._sources.clear()
        for src, descs in zip(self._staging, registered, strict=True):
            _release_requests(src)
            with contextlib.suppress(Exception):
                old.deregister_memory(src.descs)
            src.descs = descs
        self._agent = agent
        with contextlib.suppress(Exception):
            old.remove_remote_agent(self._remote)
        del old  # the last reference: NIXL tears that agent down
        self._warm_writes()

    def writer(
        self, entry: TensorEntry, next_seq: int, released: int, slot_seqs: list[int], epoch: int
    ) -> TensorWriter:
        if entry.layout.region >= len(self._bases):
            self._attach()
        if entry.layout.region >= len(self._bases):
            raise LocalProtocolError(f"tensor {entry.spec.name!r} lies in an unpublished region")
        if entry.device is not None:
            self._need_cuda()
        self._released[entry.tensor_id] = max(released, self._released.get(entry.tensor_id, 0))
        index = entry.layout.payloads_in
        if index >= len(self._bases):
            raise LocalProtocolError(f"tensor {entry.spec.name!r} lies in an unpublished region")
        slots = [self._bases[index] + offset for offset in entry.layout.payloads]
        return NixlWriter(self, entry, next_seq, self._generation, slot_seqs, slots)

    # -- the data path ---------------------------------------------------------------------

    def _lose(self, reason: str) -> PeerLostError:
        self.mark_lost(reason)
        return PeerLostError(self.lost or reason)

    def _live_agent(self, notifier: bool = False) -> Any:
        self.raise_if_lost()
        agent = self._notifier if notifier else self._agent
        if agent is None:
            raise PeerLostError(f"nixl channel to {self._where} is closed")
        return agent

    @property
    def copy_below(self) -> int:
        return self._options.copy_below

    def source(self, array: Any) -> _Source:
        """``array`` (host or GPU memory) registered with our agent (from the cache when it was
        written before)."""
        key = (data_pointer(array), array.nbytes)
        src = self._sources.get(key)
        if src is not None:
            self._sources.move_to_end(key)
            return src
        self._forget_unused()
        src = self._sources[key] = self._register(array)
        while len(self._sources) > self._options.registered_sources:
            _drop_source(self._agent, self._sources.popitem(last=False)[1])
        return src

    def staging(self, array: Any) -> _Source:
        """A writer's staging buffer, registered for as long as the channel lives.

        Not in the cache of callers' arrays: that cache holds ``registered_sources`` arrays, and
        a sender writing more tensors than that in turn (a parameter server's step, a batch)
        had each tensor's staging buffer evicted by the others and registered again for every
        message (~30 us each here; far more where registration pins pages)."""
        src = self._register(array)
        self._staging.append(src)
        return src

    def _register(self, array: Any) -> _Source:
        memory, device = _memory_of(array)
        if memory != "DRAM":
            self._need_cuda()
        descs = _register_with(self._live_agent(), array, memory, device)
        return _Source(array, descs, memory, device)

    def _forget_unused(self) -> None:
        """Deregister sources the caller no longer holds: keeping them would only pin memory."""
        for key, src in list(self._sources.items()):
            if src.array is not None and not _held_elsewhere(src.array):
                del self._sources[key]
                _drop_source(self._agent, src)

    def put(
        self,
        src: _Source,
        remote: int,
        notification: bytes,
        far_memory: tuple[str, int],
        nbytes: int | None = None,
    ) -> None:
        """One WRITE of ``src`` (its first ``nbytes``; all of it when None) into ``remote``, then
        ``notification`` (if any) behind it.

        The transfer is posted without NIXL's own notification and its completion (which
        includes an endpoint flush: the bytes are in the receiver's memory) is awaited here; only
        then is the header sent, as a notification of its own. NIXL's transfer-bound
        notification would do the same, but it is reported done only once the *receiving* agent
        has made progress, which put every write behind the receiver's polling thread (measured:
        ~70-200 µs a write, and a 3 s write against a receiver that stopped polling for 3 s).
        Waiting here also keeps the caller's array untouched until the NIC has read it.
        ``far_memory``: the slot's NIXL memory type and device id."""
        array = src.array
        assert array is not None
        if nbytes is None:
            nbytes = array.nbytes
        self.complete(self.start(src, remote, far_memory, nbytes))
        if notification:
            self.notify(notification)

    def start(
        self, src: _Source, remote: int, far_memory: tuple[str, int], nbytes: int
    ) -> _Transfer:
        """Post a WRITE of the first ``nbytes`` of ``src`` into ``remote``; :meth:`complete`
        waits for it."""
        agent = self._live_agent()
        key = (remote, nbytes)
        request = src.requests.get(key)
        try:
            if request is None:
                if len(src.requests) >= MAX_REQUESTS_PER_SOURCE:
                    _release_requests(src)
                local = agent.get_xfer_descs([(src.address, nbytes, src.device)], src.memory)
                far_type, far_device = far_memory
                far = agent.get_xfer_descs([(remote, nbytes, far_device)], far_type)
                request = src.requests[key] = agent.initialize_xfer(
                    "WRITE", local, far, self._remote
                )
            return src, key, request, agent.transfer(request)
        except PeerLostError:
            raise
        except Exception as exc:
            raise self._lose(f"NIXL write to {self._where} failed: {exc}") from exc

    def complete(self, transfer: _Transfer) -> None:
        """Wait (bounded) until a posted WRITE is complete: its bytes are in the receiver's
        memory."""
        src, key, request, posted_state = transfer
        state: str | None = posted_state
        try:
            if state == "PROC":
                state = self._finish(self._live_agent(), request)
            if state is None:  # stuck, or the receiver was declared lost meanwhile
                del src.requests[key]
                with contextlib.suppress(Exception):
                    request.release()  # NIXL cancels a transfer still in flight
                raise self._lose(f"a NIXL write to {self._where} did not complete")
        except PeerLostError:
            raise
        except Exception as exc:
            raise self._lose(f"NIXL write to {self._where} failed: {exc}") from exc
        if state != "DONE":
            raise self._lose(f"NIXL write to {self._where} failed (state {state})")

    def write_batch(self, writes: list[tuple[TensorWriter, Any]], deadline: float | None) -> None:
        """Small host payloads (those :meth:`NixlWriter.write` stages) are staged and their
        WRITEs posted back to back, waited for together, and their headers sent as one
        notification: one completion wait and one notification for up to
        MAX_NOTIFICATION_HEADERS messages instead of one each. What is posted is sent first
        when a message cannot join it: a large or GPU payload (written on its own, as by
        ``write``: its source may need registering, which may deregister another), a tensor
        already in it (its staging buffer is in use), a tensor without a free slot (the
        receiver may be waiting for what is posted before it releases one)."""
        self.check_peer()  # as a write does: a revoked sender stops before its payloads go out
        posted: list[_Posted] = []
        in_posted: set[int] = set()  # ids of the writers in ``posted``
        for w, array in writes:
            assert isinstance(w, NixlWriter)
            small = w.stages(array)
            if posted and (
                not small
                or id(w) in in_posted
                or len(posted) == wire.MAX_NOTIFICATION_HEADERS
                or not w.has_credit()
            ):
                self._send_posted(posted)
                posted, in_posted = [], set()
            if small:
                posted.append(w.post(array, deadline))
                in_posted.add(id(w))
            else:
                w.write(array, deadline)
        if posted:
            self._send_posted(posted)

    def _send_posted(self, posted: list[_Posted]) -> None:
        """Wait for the posted WRITEs, then send their headers in one notification."""
        for p in posted:
            self.complete(p.transfer)
        self.notify(wire.encode_notification(self._counter, *(p.header for p in posted)))
        for p in posted:
            p.writer.wrote(p.slot, p.header.seq)

    def _finish(self, agent: Any, request: Any) -> str | None:
        """Wait for a posted transfer: the caller may not reuse its array while the NIC reads it.

        Bounded: None when the receiver was declared lost (by the heartbeats) or the transfer is
        stuck for TRANSFER_TIMEOUT (the caller then cancels it)."""
        give_up = time.monotonic() + max(self._timeout or 0.0, TRANSFER_TIMEOUT)
        spins = 0
        while True:
            state = str(agent.check_xfer_state(request))
            if state != "PROC":
                return state
            spins += 1
            if spins % 256 == 0:
                if self.lost is not None or time.monotonic() > give_up:
                    return None
                os.sched_yield()

    def notify(self, notification: bytes) -> None:
        """Send one notification: a header behind its payload, or alone (an empty payload, the
        goodbye)."""
        agent = self._live_agent(notifier=True)
        try:
            agent.send_notif(self._remote, notification)
        except Exception as exc:
            raise self._lose(f"NIXL notification to {self._where} failed: {exc}") from exc
        self._counter += 1
        # NIXL does not track a notification that could not leave at once (the receiver's queue
        # full: it has not taken in the ones before): only progress on our side sends it. One
        # round now (NIXL progresses until nothing moves); the idle progress does the rest if
        # the caller goes quiet.
        self._absorb()

    @property
    def counter(self) -> int:
        return self._counter

    # -- credits ---------------------------------------------------------------------------

    def _absorb(self) -> bool:
        """Take in whatever the receiver sent us (and send what UCX still holds of ours); True
        if anything came."""
        with self._absorbing:
            return self._absorb_locked()

    def progress_idle(self) -> None:
        """From the idle progress: the same as :meth:`_absorb`, unless another thread is at it
        or the channel is done."""
        if self._notifier is None or self.lost is not None:
            return
        if not self._absorbing.acquire(blocking=False):
            return
        try:
            self._absorb_locked()
        except TensorWireError:
            pass  # marked lost: the writer reports it at its next call
        finally:
            self._absorbing.release()

    def _absorb_locked(self) -> bool:
        agent = self._live_agent(notifier=True)
        try:
            notifs = agent.get_new_notifs()
        except Exception as exc:
            raise self._lose(f"NIXL progress towards {self._where} failed: {exc}") from exc
        if not notifs:
            return False
        size = wire.CREDIT.size
        frames = (
            raw[at : at + size]
            for messages in notifs.values()  # only the receiver holds our metadata
            for raw in messages
            for at in range(0, max(len(raw), 1), size)  # a batch release: several credits
        )
        for frame in frames:
            credit = wire.decode_credit(frame)
            if credit.tensor_id == BYE_ACK:
                self._bye_acked = True
            elif credit.tensor_id == PING:
                # (the echo of ours; the receiver's own pings, UNASKED, say nothing of our
                # endpoint's wire-up, which our connect's ping waits for)
                self._ponged = self._ponged or credit.released != UNASKED
            elif credit.tensor_id == SESSION_ENDED:
                self.mark_lost(f"receiver at {self._where}: {ENDED_BY_RECEIVER}")
            elif credit.released > self._released.get(credit.tensor_id, 0):
                self._released[credit.tensor_id] = credit.released
        return True

    def released(self, tensor_id: int) -> int:
        return self._released.get(tensor_id, 0)

    def await_credit(
        self, tensor_id: int, at_least: int, deadline: float | None, what: Callable[[], str]
    ) -> None:
        if not self._absorb_until(lambda: self.released(tensor_id) >= at_least, deadline):
            raise WireTimeoutError(what())

    def _absorb_until(self, done: Callable[[], bool], deadline: float | None) -> bool:
        """Take in the receiver's messages until ``done()``; False at the deadline, and
        PeerLostError as soon as the receiver is known to be gone."""
        self._backoff.reset()
        while not done():
            if self._absorb():
                self._backoff.reset()
                continue
            self.raise_if_lost()
            # a receiver that died, or froze during the set-up: looked at every
            # RECEIVER_CHECK_EVERY, not on each turn (a pidfd's poll is a system call)
            now = time.monotonic()
            if self._check_receiver is not None and now >= self._next_check:
                self._next_check = now + RECEIVER_CHECK_EVERY
                try:
                    self._check_receiver()
                except PeerLostError as exc:
                    self.mark_lost(str(exc))
                    raise
            if deadline is not None and time.monotonic() >= deadline:
                return False
            self._backoff.pause()
        return True

    # -- Channel ---------------------------------------------------------------------------

    def check_peer(self) -> None:
        self._absorb()
        self.raise_if_lost()

    def probe_peer(self) -> None:
        """:meth:`check_peer`, then, for a receiver on another host, a ping (PROBE_EVERY at
        most): NIXL refuses a notification to an agent UCX found disconnected, as when the
        receiver's process was killed and its kernel closed the connection (NIXL logs the
        refusal on stderr, once). Without it an idle sender knew of such a receiver only once
        three heartbeats went unanswered: a parameter server waited that long (about 20 s with
        the daemons' 5 s) for a worker killed on another host before its first push. A
        receiver on this host is seen by its pidfd, which says more; one frozen answers the
        ping when it runs again (a credit frame, answered in kind: ``_ponged``)."""
        self.check_peer()
        now = time.monotonic()
        if self._same_host or now < self._next_probe:
            return
        self._next_probe = now + PROBE_EVERY
        with self._absorbing:
            agent = self._live_agent(notifier=True)
            try:
                agent.send_notif(self._remote, wire.encode_credit(PING, 0))
            except Exception as exc:
                raise self._lose(f"NIXL notification to {self._where} failed: {exc}") from exc

    def goodbye(self, timeout: float) -> bool:
        """Send the goodbye behind every write; True once the receiver has completed them all."""
        if self._notifier is None or self.lost is not None:
            return False
        try:
            bye = wire.DataHeader(0, 0, 0, 0, 0, None, bye=True)
            self.notify(wire.encode_notification(self._counter, bye))
            return self._absorb_until(lambda: self._bye_acked, deadline_of(timeout))
        except TensorWireError:
            return False

    def close(self) -> None:
        _IDLE_PROGRESS.discard(self)
        with self._absorbing:
            agent, self._agent = self._agent, None
            notifier, self._notifier = self._notifier, None
            if self.lost is None:
                self.lost = f"nixl channel to {self._where} is closed"
        if agent is not None:
            for src in (*self._sources.values(), *self._staging):
                _drop_source(agent, src)
        self._sources.clear()
        self._staging.clear()
        for one in (agent, notifier):
            if one is not None and self._remote:
                with contextlib.suppress(Exception):
                    one.remove_remote_agent(self._remote)
        del agent, notifier  # the last references: NIXL tears the agents (and UCX) down


class _IdleProgress:
    """One thread per process that gives every open channel's notifier a round of progress
    each IDLE_PROGRESS_INTERVAL.

    A header or goodbye that UCX could not send at once (the receiver had not taken in the
    ones before: stopped, descheduled, swapped out) waits in UCX for progress on the sending
    side. A writer gives it progress at its next call; without this thread, a sender that then
    stays quiet would leave the message unannounced, its slot never completed (measured: of
    300 empty messages written while the receiver was stopped, 50 were still missing 5 s after
    it resumed). Costs a wake-up per interval while channels are open; the thread ends with the
    last of them."""

    def __init__(self) -> None:
        self._channels: weakref.WeakSet[NixlChannel] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._running = False

    def add(self, channel: NixlChannel) -> None:
        with self._lock:
            self._channels.add(channel)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="tensorwire-nixl-idle", daemon=True).start()

    def discard(self, channel: NixlChannel) -> None:
        with self._lock:
            self._channels.discard(channel)

    def _run(self) -> None:
        while True:
            time.sleep(IDLE_PROGRESS_INTERVAL)
            with self._lock:
                channels = list(self._channels)
                if not channels:
                    self._running = False
                    return
            for channel in channels:
                channel.progress_idle()
            del channels  # held strongly only while progressing: a dropped channel can go


_IDLE_PROGRESS = _IdleProgress()


def _held_elsewhere(array: np.ndarray[Any, Any]) -> bool:
    """Does anyone but the cache still reference ``array``'s memory?"""
    owner = array.base
    # Without others, three references remain: the cache's (or the view's ``base``), this
    # function's variable, and getrefcount's argument.
    if owner is None:
        return sys.getrefcount(array) > 3
    return sys.getrefcount(owner) > 3


def _register_with(agent: Any, array: Any, memory: str, device: int) -> Any:
    """``array``'s memory (NIXL's ``memory`` type on ``device``) registered with ``agent``: its
    descriptor list."""
    try:
        return agent.register_memory([(data_pointer(array), array.nbytes, device, "")], memory)
    except Exception as exc:
        raise TransportError(
            f"NIXL could not register {array.nbytes} bytes of {memory}: {exc}"
        ) from exc


def _release_requests(src: _Source) -> None:
    for request in src.requests.values():
        with contextlib.suppress(Exception):
            request.release()
    src.requests.clear()


def _drop_source(agent: Any, src: _Source) -> None:
    _release_requests(src)
    if agent is not None:
        with contextlib.suppress(Exception):
            agent.deregister_memory(src.descs)
    src.array = None


class NixlWriter(CreditedWriter):
    _channel: NixlChannel

    def __init__(
        self,
        channel: NixlChannel,
        entry: TensorEntry,
        next_seq: int,
        generation: int,
        slot_seqs: list[int],
        slot_addresses: list[int],
    ) -> None:
        self.spec = entry.spec
        self._channel = channel
        self._tid = entry.tensor_id
        self._depth = entry.layout.depth
        self._addresses = slot_addresses
        self.next_seq = next_seq
        self._generation = generation
        self._slots = SlotChooser(slot_seqs)
        self._staging: np.ndarray[Any, Any] | None = None
        self._staged: _Source | None = None  # _staging, registered (on first use)
        self._copy_below = channel.copy_below
        self._device = entry.device
        #: the slots' NIXL memory type and device at the receiver
        self._far: tuple[str, int] = ("DRAM", 0) if entry.device is None else ("VRAM", entry.device)
        self._device_staging: Any = None  # what Sender.buffer fills for a GPU tensor
        self._device_staged: _Source | None = None  # _device_staging, registered
        # Sender.write's fast route: static tensors whose every message is staged
        self.writes_now = not self.spec.dynamic and 0 < self.spec.max_bytes <= self._copy_below
        self._staged_bytes: memoryview | None = None  # the staging buffer, for write_now's copy
        self._buffer_view = exports_buffer(self.spec.dtype)  # else through a uint8 view

    def _next(self, nbytes: int, shape: tuple[int, ...]) -> tuple[int, wire.DataHeader]:
        """The slot of the next message (a free one: the caller waited for credit) and its
        header."""
        slot = self._slots.choose(self._channel.released(self._tid))
        dims = shape if self.spec.dynamic else None
        return slot, wire.DataHeader(self._tid, slot, self._generation, self.next_seq, nbytes, dims)

    def wrote(self, slot: int, seq: int) -> None:
        """Message ``seq`` went into ``slot``, header and all."""
        self._slots.wrote(slot, seq)
        self.next_seq = seq + 1

    def _send(self, src: _Source | None, nbytes: int, shape: tuple[int, ...]) -> None:
        """Write ``nbytes`` from the registered ``src`` (None: nothing to move) into the next
        slot, then its header."""
        channel = self._channel
        # A receiver that dropped this session says so in a notification: read it before the
        # payload goes out, so that a revoked writer stops here rather than after its write.
        channel.check_peer()
        slot, header = self._next(nbytes, shape)
        notification = wire.encode_notification(channel.counter, header)
        if src is None:
            channel.notify(notification)  # nothing to move; NIXL refuses empty descriptors
        else:
            channel.put(src, self._addresses[slot], notification, self._far, nbytes)
        self.wrote(slot, header.seq)

    def _staging_bytes(self) -> np.ndarray[Any, Any]:
        if self._staging is None:  # allocated once per tensor, registered on first use
            self._staging = np.empty(max(self.spec.max_bytes, 1), dtype=np.uint8)
        return self._staging

    def _staged_source(self) -> _Source:
        """The host staging buffer, registered once (messages send a prefix of it); found
        without computing an address, which numpy makes cost ~1 µs, a tenth of a small write's
        Python."""
        src = self._staged
        if src is None:
            src = self._staged = self._channel.staging(self._staging_bytes())
        return src

    takes_device = True  # GPU arrays are registered as VRAM and written from where they are

    def stages(self, array: Any) -> bool:
        """Does :meth:`write` copy ``array`` into the staging buffer (rather than register it)?"""
        return isinstance(array, np.ndarray) and 0 < array.nbytes <= self._copy_below

    def post(self, array: Any, deadline: float | None) -> _Posted:
        """For a batch: wait for a slot, stage ``array`` (one :meth:`stages`) and post its WRITE;
        the channel sends the header once the WRITE is complete."""
        self.wait_credit(deadline)
        staged = self._staged_source()
        source = array.reshape(-1).view(np.uint8)
        nbytes = source.nbytes
        np.copyto(staged.array[:nbytes], source)
        slot, header = self._next(nbytes, array.shape)
        transfer = self._channel.start(staged, self._addresses[slot], self._far, nbytes)
        return _Posted(self, slot, header, transfer)

    def write_now(self, array: np.ndarray[Any, Any], timeout: float | None) -> bool:
        # write()'s staged path without its waits and general checks (Sender.write made them):
        # the whole per-message path of a small static tensor written before
        channel = self._channel
        released = channel._released.get(self._tid, 0)
        if released < self.next_seq - self._depth:
            return False  # no credit: the general path waits for one
        # as _send: a revoked writer learns it here, before its payload goes out
        channel.check_peer()
        into = self._staged_bytes
        if into is None:
            into = self._staged_bytes = memoryview(self._staged_source().array)
        staged = self._staged
        assert staged is not None
        nbytes = array.nbytes
        if self._buffer_view:
            into[:nbytes] = array.data.cast("B")
        else:  # bfloat16, float8: numpy exports no buffer of them
            into[:nbytes] = array.reshape(-1).view(np.uint8).data
        slot = self._slots.choose(released)
        seq = self.next_seq
        notification = wire.encode_static_notification(
            channel.counter, self._tid, slot, self._generation, seq, nbytes
        )
        channel.put(staged, self._addresses[slot], notification, self._far, nbytes)
        self.wrote(slot, seq)
        return True

    def write(self, array: Any, deadline: float | None) -> None:
        self.wait_credit(deadline)
        source = array.reshape(-1).view(np.uint8)
        nbytes = source.nbytes
        if isinstance(source, np.ndarray):
            if 0 < nbytes <= self._copy_below:
                # Registering and preparing a transfer cost more than copying a small payload
                # (see NixlOptions.copy_below): stage it, as UCX does below its zero-copy
                # threshold.
                staged = self._staged_source()
                np.copyto(staged.array[:nbytes], source)
                self._send(staged, nbytes, array.shape)
                return
        else:  # NIXL reads it on its own stream: the work that produced it must be done
            synchronize_current(int(source.device.id))
        self._send(self._channel.source(source) if nbytes else None, nbytes, array.shape)

    def acquire(self, shape: tuple[int, ...], deadline: float | None) -> Any:
        # Produce in place into the staging buffer, registered once for the tensor's lifetime
        # (in GPU memory for a GPU tensor).
        self.wait_credit(deadline)
        nbytes = int(np.prod(shape)) * self.spec.dtype.itemsize
        return self._staging_for()[:nbytes].view(self.spec.dtype).reshape(shape)

    def _staging_for(self) -> Any:
        if self._device is None:
            return self._staging_bytes()
        if self._device_staging is None:
            self._device_staging = device_bytes(self._device, self.spec.max_bytes)
        return self._device_staging

    def commit(self, shape: tuple[int, ...]) -> None:
        nbytes = int(np.prod(shape)) * self.spec.dtype.itemsize
        if self._device is None:
            self._send(self._staged_source() if nbytes else None, nbytes, shape)
            return
        synchronize_current(self._device)  # the kernels that filled it
        if nbytes and self._device_staged is None:
            self._device_staged = self._channel.staging(self._staging_for())
        self._send(self._device_staged if nbytes else None, nbytes, shape)


# --------------------------------------------------------------------------------------------
# Receiver side
# --------------------------------------------------------------------------------------------


class NixlPeer:
    """One attached sender: its agent, where its notifications stand, the credit link back."""

    def __init__(self, server: NixlDataServer, session: object, agent: str) -> None:
        self._server = server
        self.session = session
        self.agent = agent
        self.next = 0  # counter of the next notification to complete
        self.held: dict[int, list[wire.DataHeader]] = {}  # arrived ahead of their turn

    def send_credit(self, tensor_id: int, released: int, defer: bool = False) -> None:
        # Never held back: nothing here would send it later (see the tcp link).
        self._server.notify(self.agent, wire.encode_credit(tensor_id, released))

    def send_credits(self, credits: list[tuple[int, int]], defer: bool = False) -> None:
        # One notification carries them all: the sender reads every frame of a notification.
        if credits:
            self._server.notify(self.agent, b"".join(wire.encode_credit(t, r) for t, r in credits))

    def cut(self) -> None:
        self._server.notify(self.agent, wire.encode_credit(SESSION_ENDED, 0))


class NixlDataServer(DataServer):
    """The receiver's NIXL agent: registers regions, admits senders' agents, completes writes.
    Published in the welcome with no details: a sender learns them when it attaches."""

    def __init__(self, sink: DataSink, options: NixlOptions, loopback: bool, name: str) -> None:
        self._sink_ref = weakref.ref(sink)  # the polling thread must not keep the receiver alive
        self._mm_errh = shared_memory_notifications(options, loopback)
        self._agent: Any = create_agent(f"tw-rx-{name}-{secrets.token_hex(6)}", options, loopback)
        self._lock = threading.Lock()
        self._regions: list[tuple[int, int]] = []
        self._registrations: list[Any] = []
        self._peers: dict[str, NixlPeer] = {}
        self._disconnected: set[str] = set()  # agents NIXL said are gone (notify skips them)
        self._next_ping = 0.0  # when _look_at_senders pings the senders next (monotonic)
        self._closed = False
        self._polling = threading.Lock()  # held by whichever thread is completing notifications
        self._driven_at = 0.0  # when a consumer last polled (monotonic); 0: none polls
        self._resume = threading.Event()  # set when a polling consumer goes to sleep
        self._thread = threading.Thread(
            target=self._poll_loop, name=f"tensorwire-nixl-{name}", daemon=True
        )
        self._thread.start()

    def add_memory(self, memory: Memory) -> None:
        mem_type = _NIXL_MEMORY.get(memory.kind)
        if mem_type is None:
            raise TransportError(f"the nixl transport cannot register {memory.kind} memory")
        with self._lock:
            if self._closed:
                return
            address, size = memory.address, memory.size
            try:
                descs = self._agent.register_memory([(address, size, memory.device, "")], mem_type)
            except Exception as exc:
                raise TransportError(
                    f"NIXL could not register a {size}-byte {memory.kind} region: {exc}"
                ) from exc
            self._registrations.append(descs)
            self._regions.append((address, size))

    def _attached_details(self) -> dict[str, Any]:
        """What a sender gets back from an attach: our metadata and every region's address."""
        with self._lock:
            regions = [[address, size] for address, size in self._regions]
        return {"metadata": self._agent.get_agent_metadata(), "regions": regions}

    def attach(self, session: object, details: dict[str, Any]) -> tuple[CreditLink, dict[str, Any]]:
        """Load a sender's agent metadata and bind that agent to its session."""
        metadata = details.get("metadata")
        if not isinstance(metadata, bytes):
            raise LocalProtocolError("attach without NIXL agent metadata")
        self._check_peer_agent(details)
        return self._attach_agent(session, metadata), self._attached_details()

    def _check_peer_agent(self, details: dict[str, Any]) -> None:
        """Refuse a sender on this host whose agent disagrees with ours on UCX's shared-memory
        error handling: UCX would find no transport between the two, and NIXL 1.5.1 crashes the
        process that loads such a peer's metadata (docs/rdma.md). Older senders do not say."""
        theirs = details.get("mm_error_handling")
        if not isinstance(theirs, bool) or details.get("host") != host_identity():
            return
        if theirs != self._mm_errh:
            on = {True: "y", False: "n"}
            raise TransportError(
                f"the sender's NIXL agent has UCX_MM_ERROR_HANDLING={on[theirs]} and this "
                f"receiver's has {on[self._mm_errh]}: on one host both ends must agree (set it, "
                "or NixlOptions(env=...), alike at both, or leave it to tensorwire's default)"
            )

    def _attach_agent(self, session: object, metadata: bytes) -> NixlPeer:
        if self._closed:
            raise TransportError("the receiver's nixl server is closed")
        try:
            agent = _name(self._agent.add_remote_agent(metadata))
        except Exception as exc:
            raise LocalProtocolError(f"unusable NIXL metadata: {exc}") from None
        with self._lock:
            peer = self._peers.get(agent)
            if peer is not None and peer.session is not session:
                raise LocalProtocolError(f"NIXL agent {agent!r} belongs to another sender")
            if peer is None:
                peer = self._peers[agent] = NixlPeer(self, session, agent)
        return peer

    def detach(self, session: object) -> None:
        """Forget the agent of a session that ended (for whatever reason)."""
        with self._lock:
            gone = [p for p in self._peers.values() if p.session is session]
            for peer in gone:
                del self._peers[peer.agent]
        for peer in gone:
            self._disconnected.discard(peer.agent)
            with contextlib.suppress(Exception):
                self._agent.remove_remote_agent(peer.agent)

    def notify(self, agent: str, message: bytes) -> None:
        if self._closed or agent in self._disconnected:
            return
        try:
            self._agent.send_notif(agent, message)
        except Exception as exc:  # the sender is gone: its heartbeat or pidfd will say so
            log.debug("nixl notification to %s failed: %s", agent, exc)
            if is_remote_disconnect(exc):
                # NIXL logs each failed notification on stderr: a consumer releasing a ring
                # of a sender killed wrote one line per credit (17 for a ring of 16). Nothing
                # reaches that agent again (its endpoint is gone): its session ends at the
                # next round of polling (_look_at_senders; not here, where the caller may be
                # in the middle of handing out credits). A credit lost meanwhile to
                # anything else is made good by the next, which carries the count released.
                self._disconnected.add(agent)

    # -- polling: the server's thread, or a consumer waiting for a message -----------------

    def poller(self, link: CreditLink) -> Poller:
        return self.poll  # one agent for every sender: its notifications are polled as one

    def poll(self, rest: bool = False) -> bool:
        """One round of progress from a consumer's thread that waits for a message: it completes
        the message itself, without a wake-up from our thread (BENCHMARKS.md: the 4 KiB round
        trip on one host fell from 278 µs to 118 µs). The polling thread stands back
        meanwhile, until the consumer rests (``rest``: it goes to sleep on the doorbell) or
        has not polled for CONSUMER_DRIVES."""
        if rest:
            self._driven_at = 0.0
            self._resume.set()
            return False
        now = self._driven_at = time.monotonic()
        if not self._peers or not self._polling.acquire(blocking=False):
            return False  # nobody to hear from, or the polling thread is in a round right now
        try:
            # The polling thread stands back while we poll, and one that never rests (a loop
            # of wait(timeout=0)) would leave it no round: its look at the senders is made
            # here meanwhile, when due (a comparison a round; the pings once a second). Before,
            # a sender killed on another host was left to the heartbeat timeout.
            if now >= self._next_ping or self._disconnected:
                self._look_at_senders(now)
            return self._progress()
        except Exception:  # the polling thread reports it (and keeps trying)
            return False
        finally:
            self._polling.release()

    def _poll_loop(self) -> None:
        backoff = Backoff()
        while not self._closed:
            driven = self._driven_at
            if driven and time.monotonic() - driven < CONSUMER_DRIVES:
                # A consumer polls: competing with it for the agent, the GIL and the cores only
                # slows it (and the sender it answers). Once it goes to sleep on the doorbell it
                # says so, and we poll again at once, as if a message were due.
                self._resume.wait(CONSUMER_DRIVES)
                self._resume.clear()
                backoff.reset()
                continue
            try:
                with self._polling:
                    self._look_at_senders(time.monotonic())
                    delivered = self._progress()
            except Exception as exc:
                log.warning("nixl progress failed: %s", exc)
                time.sleep(0.01)  # not holding the lock: a consumer may try meanwhile
                continue
            if delivered:
                backoff.reset()
            else:
                backoff.pause()

    def _progress(self) -> bool:
        """Take the agent's new notifications and complete them; True if any came. Called under
        ``_polling``: notifications are completed by one thread at a time, in order."""
        agent = self._agent
        if agent is None:  # closed
            return False
        notifs = agent.get_new_notifs()
        # Not held while completing: a protocol error's traceback, kept by a log record, would
        # keep this frame, and with it the agent and its UCX resources, alive after close().
        del agent
        if not notifs:
            return False
        for remote, messages in notifs.items():
            with self._lock:
                peer = self._peers.get(_name(remote))
            if peer is None:
                log.debug("ignored %d notifications of unknown agent %s", len(messages), remote)
                continue
            for raw in messages:
                if len(raw) == wire.CREDIT.size:  # not a header: a ping at connect
                    self._pong(peer, raw)
                elif not self._deliver(peer, raw):
                    break
        return True

    def _look_at_senders(self, now: float) -> None:
        """Ping the senders each PING_SENDERS_EVERY, and end the sessions of those NIXL said
        are gone. Made by whoever polls (the polling thread, or a consumer while that stands
        back), under ``_polling``: no message of a session it ends is completed meanwhile.
        ``now``: the caller's reading of the monotonic clock."""
        if now >= self._next_ping:
            self._next_ping = now + PING_SENDERS_EVERY
            self._ping_senders()
        if self._disconnected:
            self._end_disconnected()

    def _ping_senders(self) -> None:
        """A ping (a credit frame, UNASKED: the sender reads it and answers nothing) to every
        sender, so that NIXL says of one whose agent is gone that it is disconnected
        (:meth:`notify`); a credit tells it too, but none goes to a sender whose messages are
        not released."""
        with self._lock:
            agents = list(self._peers)
        ping = wire.encode_credit(PING, UNASKED)
        for agent in agents:
            self.notify(agent, ping)

    def _end_disconnected(self) -> None:
        """End the session of each sender whose agent NIXL said is disconnected (a ping or a
        credit to it refused: :meth:`notify`), as when its process was killed and its kernel
        closed the connection. A sender on another host was otherwise dropped only at the
        receiver's heartbeat timeout, and the waits for its tensors held that long; nothing
        reaches such an agent again."""
        gone = []
        with self._lock:
            for agent in list(self._disconnected):
                peer = self._peers.get(agent)
                if peer is None:  # its session ended already: nothing to keep of it
                    self._disconnected.discard(agent)
                else:
                    gone.append(peer)
        for peer in gone:
            self._finish(peer, "its NIXL agent is disconnected: a notification to it was refused")

    def _pong(self, peer: NixlPeer, raw: bytes) -> None:
        try:
            ping = wire.decode_credit(raw)
        except LocalProtocolError:
            ping = None
        if ping is None or ping.tensor_id != PING:
            self._deliver(peer, raw)  # let the header checks cut it off
        else:
            self.notify(peer.agent, wire.encode_credit(PING, 0))

    def _deliver(self, peer: NixlPeer, raw: bytes) -> bool:
        """Complete one notification's messages (and those of any it released); False once the
        peer is cut off."""
        try:
            fields = wire.peek_static_notification(raw)
            if fields is not None and fields[0] == peer.next and not peer.held:
                # each write's notification, in order (the common case): landed from its
                # fields, without building a header
                peer.next += 1
                self._sink().landed_fields(
                    peer.session, fields[1], fields[2], fields[3], fields[4], fields[5]
                )
                return True
            counter, headers = wire.decode_notification(raw)
            if counter < peer.next or counter in peer.held:
                raise LocalProtocolError(f"notification {counter} arrived twice")
            if counter > peer.next:
                if len(peer.held) >= MAX_OUT_OF_ORDER:
                    raise LocalProtocolError(f"over {MAX_OUT_OF_ORDER} notifications out of order")
                peer.held[counter] = headers
                return True
            while True:
                peer.next += 1
                if headers[0].bye:  # alone in its notification (decode_notification checks)
                    self.notify(peer.agent, wire.encode_credit(BYE_ACK, peer.next))
                    self._finish(peer, None)
                    return False
                sink = self._sink()
                for header in headers:
                    sink.landed(peer.session, header)  # the checks; the bytes are already there
                del sink
                if peer.next not in peer.held:
                    return True
                headers = peer.held.pop(peer.next)
        except (LocalProtocolError, TensorWireError) as exc:
            quiet.warning("nixl senders cut off", "cutting off nixl sender %s: %s", peer.agent, exc)
            self.notify(peer.agent, wire.encode_credit(SESSION_ENDED, 0))
            self._finish(peer, f"protocol error: {exc}")
            return False
        except ConnectionError:  # the receiver is gone
            return False

    def _finish(self, peer: NixlPeer, reason: str | None) -> None:
        sink = self._sink_ref()
        if sink is not None:
            sink.disconnected(peer.session, reason)  # the receiver's session drop detaches it
        else:
            self.detach(peer.session)
        del sink

    def _sink(self) -> DataSink:
        return live_sink(self._sink_ref)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            peers = list(self._peers.values())
            self._peers.clear()
        self._resume.set()  # the polling thread may be standing back
        if threading.current_thread() is not self._thread:
            self._thread.join()
        agent, self._agent = self._agent, None
        for peer in peers:
            with contextlib.suppress(Exception):
                agent.send_notif(peer.agent, wire.encode_credit(SESSION_ENDED, 0))
            with contextlib.suppress(Exception):
                agent.remove_remote_agent(peer.agent)
        for descs in self._registrations:
            with contextlib.suppress(Exception):
                agent.deregister_memory(descs)
        self._registrations.clear()
        del agent  # the last reference: NIXL tears the agent (and its UCX context) down


def start_server(settings: ServerSettings, sink: DataSink) -> NixlDataServer:
    """The receiving side, as :mod:`tensorwire.transports` starts it."""
    options = settings.options.get("nixl")
    return NixlDataServer(
        sink,
        options if isinstance(options, NixlOptions) else NixlOptions(),
        settings.loopback,
        settings.receiver_name,
    )
