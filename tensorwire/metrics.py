"""What tensorwire counts while it works, and how that reaches Prometheus.

Counting is always on and costs the per-message path a few integer additions: each writer and
each received tensor holds a :class:`Traffic` (messages, bytes, credit waits) that the process
shares per tensor name and transport, and events off that path (peers connected and lost, errors
answered, bad input from the network) go into one counter table. Nothing here imports
``prometheus_client``: the counts are read only when someone asks, by :func:`snapshot` (plain
:class:`Metric` values, for tests and for users without Prometheus) or by a scrape of the
``/metrics`` page that :func:`serve` starts (the ``metrics`` extra). Daemons add their own
figures (steps, loss, phases of a step) with :func:`add_source`.

Label cardinality is bounded: tensors are labelled by name up to :data:`MAX_TENSOR_LABELS` names
per direction (the rest count under ``_other``), transports are a fixed set, and every other label
is a code or reason chosen by tensorwire's own code, never text from the network.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from . import extras
from .endpoint import host_port, is_wildcard_host, loopback_for

#: distinct tensor names labelled per direction; further names are counted as ``_other``
MAX_TENSOR_LABELS = 256
OTHER = "_other"

Kind = Literal["counter", "gauge", "summary"]
#: a sample's label values (in the order of its metric's ``labels``) and its value; a summary's
#: value is ``(count, sum)``
Sample = tuple[tuple[str, ...], "float | tuple[float, float]"]


class Traffic:
    """Messages and bytes of one tensor in one direction over one transport, and the writer's
    waits for a free slot. Plain attributes, added to without a lock (and inline on the
    per-message paths: a method call would cost more than the additions): each is updated by
    the thread that moves the tensor's messages (one per tensor, as writes of a tensor are
    ordered)."""

    __slots__ = ("bytes", "messages", "wait_seconds", "waits")

    def __init__(self) -> None:
        self.messages = 0
        self.bytes = 0
        self.waits = 0
        self.wait_seconds = 0.0

    def waited(self, seconds: float) -> None:
        self.waits += 1
        self.wait_seconds += seconds


@dataclass
class Metric:
    """One metric family: Prometheus's name (with ``_total`` for a counter), kind, help text,
    label names and samples."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    samples: list[Sample] = field(default_factory=list)

    def value(self, *labels: str) -> float | tuple[float, float] | None:
        """The sample with these label values (None: no such sample)."""
        for key, value in self.samples:
            if key == labels:
                return value
        return None


class _HasGauges(Protocol):
    def metric_gauges(self) -> Iterable[tuple[str, tuple[str, ...], float]]: ...


#: events counted by :func:`count`: metric name, help text, label name
EVENTS: dict[str, tuple[str, str]] = {
    "tensorwire_peers_connected_total": (
        "Peers connected: senders welcomed by a receiver (role=receiver), receivers a sender "
        "connected to (role=sender)",
        "role",
    ),
    "tensorwire_peers_lost_total": (
        "Peers lost (died, went silent or cut the connection), by the role of who lost them",
        "role",
    ),
    "tensorwire_control_errors_total": (
        "Error replies sent by receivers' control planes, by code (auth, busy, fenced, ...)",
        "code",
    ),
    "tensorwire_claims_total": (
        "Tensors claimed by a sender at a receiver (a first write, or the first after a "
        "reconnect), by how: alone (a claim of its own) or batched (claim-many: a batch's first "
        "writes, one round trip)",
        "how",
    ),
    "tensorwire_rings_moved_total": (
        "Tensors whose ring a receiver moved to fresh memory for their next writer, as the "
        "writer it dropped could still store into the old one, by that writer's transport "
        "(each keeps its old ring's memory)",
        "transport",
    ),
    "tensorwire_bad_input_total": (
        "Bad input from the network, by reason: every case is counted, only a few are logged",
        "reason",
    ),
}


class _Ledger:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.traffic: dict[str, dict[tuple[str, str], Traffic]] = {"sent": {}, "received": {}}
        #: the tensor names labelled so far, per direction (at most MAX_TENSOR_LABELS each)
        self.labelled: dict[str, set[str]] = {"sent": set(), "received": set()}
        self.events: Counter[tuple[str, str]] = Counter()
        self.live: weakref.WeakSet[Any] = weakref.WeakSet()
        self.sources: list[Callable[[], Iterable[Metric]]] = []


_LEDGER = _Ledger()


def traffic(direction: Literal["sent", "received"], tensor: str, transport: str) -> Traffic:
    """The process's counts for ``tensor`` in ``direction`` over ``transport`` (shared by every
    sender or receiver of that name; made on first use, off the per-message path)."""
    table = _LEDGER.traffic[direction]
    found = table.get((tensor, transport))
    if found is not None:
        return found
    with _LEDGER.lock:
        # (the names kept aside: gathered from the table here, each tensor's first writer and
        # claim walked every labelled one: 54 us a tensor, of 500 claimed, under the profiler)
        names = _LEDGER.labelled[direction]
        if tensor not in names:
            if len(names) >= MAX_TENSOR_LABELS:
                tensor = OTHER
            else:
                names.add(tensor)
        return table.setdefault((tensor, transport), Traffic())


def count(event: str, label: str) -> None:
    """One more ``event`` (a name in :data:`EVENTS`) with ``label`` (a fixed string of ours)."""
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}")
    with _LEDGER.lock:
        _LEDGER.events[(event, label)] += 1


def watch(obj: _HasGauges) -> None:
    """Report ``obj``'s gauges (held slots, live peers) while it exists."""
    with _LEDGER.lock:
        _LEDGER.live.add(obj)


def add_source(source: Callable[[], Iterable[Metric]]) -> Callable[[], None]:
    """Add metrics of one's own (a daemon's steps, loss, ...), read at every scrape; returns a
    function that removes them again."""
    with _LEDGER.lock:
        _LEDGER.sources.append(source)

    def remove() -> None:
        with _LEDGER.lock:
            if source in _LEDGER.sources:
                _LEDGER.sources.remove(source)

    return remove


def _library() -> Iterator[Metric]:
    with _LEDGER.lock:
        sent = list(_LEDGER.traffic["sent"].items())
        received = list(_LEDGER.traffic["received"].items())
        events = list(_LEDGER.events.items())
        live = list(_LEDGER.live)
    sent_by = "written by this process's senders"
    received_by = "handed to this process's consumers by its receivers"
    # (name, help, rows, the Traffic field counted)
    traffic_families = (
        ("tensorwire_sent_messages_total", f"Messages {sent_by}", sent, "messages"),
        ("tensorwire_sent_bytes_total", f"Payload bytes {sent_by}", sent, "bytes"),
        ("tensorwire_received_messages_total", f"Messages {received_by}", received, "messages"),
        ("tensorwire_received_bytes_total", f"Payload bytes {received_by}", received, "bytes"),
        (
            "tensorwire_credit_waits_total",
            "Writes that found every slot of the receiver's ring held and waited for a credit",
            sent,
            "waits",
        ),
        (
            "tensorwire_credit_wait_seconds_total",
            "Seconds writers spent waiting for credits",
            sent,
            "wait_seconds",
        ),
    )
    for name, help_text, rows, field_name in traffic_families:
        samples: list[Sample] = [(key, getattr(t, field_name)) for key, t in rows]
        yield Metric(name, "counter", help_text, ("tensor", "transport"), samples)
    for name, (help_text, label) in EVENTS.items():
        yield Metric(
            name,
            "counter",
            help_text,
            (label,),
            [((lab,), n) for (event, lab), n in events if event == name],
        )
    gauges: dict[str, dict[tuple[str, ...], float]] = {"slots_held": {}, "peers": {}}
    for obj in live:
        for name, key, value in obj.metric_gauges():
            bucket = gauges[name]
            if key not in bucket and len(bucket) >= MAX_TENSOR_LABELS:
                key = (OTHER,)
            bucket[key] = bucket.get(key, 0.0) + value
    yield Metric(
        "tensorwire_slots_held",
        "gauge",
        "Messages handed to consumers and not released yet, per tensor",
        ("tensor",),
        list(gauges["slots_held"].items()),
    )
    yield Metric(
        "tensorwire_peers",
        "gauge",
        "Peers connected now: sessions at receivers (role=receiver), receivers of senders "
        "(role=sender)",
        ("role",),
        list(gauges["peers"].items()),
    )


def snapshot() -> list[Metric]:
    """Every metric now: the library's, then each source's."""
    with _LEDGER.lock:
        sources = list(_LEDGER.sources)
    out = list(_library())
    for source in sources:
        out.extend(source())
    return out


def counter(name: str, *labels: str) -> float:
    """A counter of :func:`snapshot` now: its sample with these label values, or with none
    given the sum of all its samples; 0 while nothing was counted under it (a counter's family
    appears with its first count)."""
    family = next((m for m in snapshot() if m.name == name), None)
    if family is None:
        return 0.0
    if family.kind != "counter":
        raise TypeError(f"{name} is a {family.kind}, not a counter")
    values = [v for key, v in family.samples if not labels or key == labels]
    return float(sum(v for v in values if isinstance(v, (int, float))))


def totals() -> dict[str, Any]:
    """The library's counts summed over tensors and transports, and the bytes sent over each
    transport (what ``auto`` chose, peer by peer): for end-of-job summaries."""
    with _LEDGER.lock:
        sent_by = list(_LEDGER.traffic["sent"].items())
        received = list(_LEDGER.traffic["received"].values())
    sent = [t for _, t in sent_by]
    by_transport: Counter[str] = Counter()
    for (_tensor, transport), t in sent_by:
        by_transport[transport] += t.bytes
    return {
        "sent_messages": sum(t.messages for t in sent),
        "sent_bytes": sum(t.bytes for t in sent),
        "received_messages": sum(t.messages for t in received),
        "received_bytes": sum(t.bytes for t in received),
        "credit_waits": sum(t.waits for t in sent),
        "credit_wait_seconds": sum(t.wait_seconds for t in sent),
        "sent_bytes_by_transport": dict(sorted(by_transport.items())),
    }


class _Collector:
    """prometheus_client's side: :func:`snapshot` as metric families, at each scrape."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            SummaryMetricFamily,
        )

        for m in snapshot():
            family: Any
            if m.kind == "counter":
                family = CounterMetricFamily(m.name, m.help, labels=m.labels)
            elif m.kind == "gauge":
                family = GaugeMetricFamily(m.name, m.help, labels=m.labels)
            else:
                family = SummaryMetricFamily(m.name, m.help, labels=m.labels)
            for key, value in m.samples:
                if isinstance(value, tuple):
                    family.add_metric(list(key), count_value=value[0], sum_value=value[1])
                else:
                    family.add_metric(list(key), value)
            yield family


_registered = False


def register() -> None:
    """Add tensorwire's metrics to prometheus_client's default registry (once), for an
    application that serves its own ``/metrics``. Needs the ``metrics`` extra."""
    global _registered
    extras.require(extras.METRICS)
    from prometheus_client import REGISTRY

    with _LEDGER.lock:
        if _registered:
            return
        _registered = True
    REGISTRY.register(_Collector())


@dataclass
class MetricsServer:
    """A running ``/metrics`` page; :meth:`close` stops it."""

    host: str
    port: int
    _close: Callable[[], None]

    @property
    def url(self) -> str:
        host = loopback_for(self.host) if is_wildcard_host(self.host) else self.host
        return f"http://{host_port(host, self.port)}/metrics"

    def close(self) -> None:
        self._close()


def serve(
    port: int, host: str = "0.0.0.0", sources: Iterable[Callable[[], Iterable[Metric]]] = ()
) -> MetricsServer:
    """Serve the default registry (tensorwire's metrics, every source, the process's own) on
    ``http://host:port/metrics`` from a background thread; port 0 takes a free one. ``sources``
    are added (:func:`add_source`) until the server is closed. Needs the ``metrics`` extra; a
    port that cannot be bound raises TensorWireError naming it."""
    from .errors import TensorWireError

    register()
    from prometheus_client import start_http_server

    try:
        server, thread = start_http_server(port, addr=host)
    except OSError as exc:
        raise TensorWireError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
    removers = [add_source(source) for source in sources]

    def close() -> None:
        for remove in removers:
            remove()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return MetricsServer(host, int(server.server_port), close)
