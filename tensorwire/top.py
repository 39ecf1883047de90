"""``tensorwire top``: a live terminal view of running daemons, read from their ``/metrics``.

Every ``--interval`` seconds it scrapes each endpoint (``tensorwire-ps``, ``tensorwire-worker``
or ``tensorwire bench serve`` started with ``--metrics-port``), turns counters into rates between
two scrapes, and shows one row per daemon: its step and steps/s, loss, where a worker's time goes,
the server's straggler, bytes/s per transport, credit waits, peers and refusals. On a terminal
the table redraws in place (rich); elsewhere each refresh is printed, so it can be logged.
"""

from __future__ import annotations

import argparse
import http.client
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from . import extras
from .endpoint import ipv6_hint, zeromq_greeting_problem
from .job.argtypes import add_version
from .job.config import at_least, positive_seconds

#: {sample name: {label items, sorted: value}}
Page = dict[str, dict[tuple[tuple[str, str], ...], float]]


def metrics_url(endpoint: str) -> str:
    """``HOST:PORT``, ``http://HOST:PORT`` or a full ``.../metrics`` URL, as a URL to scrape;
    ValueError saying what is wrong with any other (checked here, where a port out of range
    raised from the first scrape, a traceback)."""
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{endpoint!r} is not an http address of a /metrics page")
    where = urllib.parse.urlsplit(url)
    try:
        port = where.port
    except ValueError:
        port = 0
    if port == 0 or not where.hostname or (port is None and "://" not in endpoint):
        raise ValueError(
            f"{endpoint!r} is not HOST:PORT with a port of 1-65535 (a daemon's "
            f"--metrics-port){ipv6_hint(endpoint)}"
        )
    tail = url.split("://", 1)[1]
    return url if "/" in tail else f"{url}/metrics"


def scrape(url: str, timeout: float) -> Page:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as reply:
        text = reply.read().decode()
    page: Page = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            page.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return page


def total(page: Page, name: str, **match: str) -> float | None:
    """The sum of ``name``'s samples whose labels include ``match`` (None: no such sample)."""
    rows = [v for k, v in page.get(name, {}).items() if all((a, b) in k for a, b in match.items())]
    return sum(rows) if rows else None


def by_label(page: Page, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in page.get(name, {}).items():
        lab = dict(key).get(label)
        if lab is not None:
            out[lab] = out.get(lab, 0.0) + value
    return out


@dataclass
class Target:
    """One endpoint: its last two scrapes."""

    url: str
    page: Page = field(default_factory=dict)
    before: Page = field(default_factory=dict)
    at: float = 0.0
    seconds: float = 0.0  # between the two scrapes
    error: str = ""

    def refresh(self, timeout: float) -> None:
        try:
            page = scrape(self.url, timeout)
        except (OSError, urllib.error.URLError, ValueError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", None) or exc
            if not isinstance(exc, urllib.error.HTTPError) and self._speaks_zeromq(timeout):
                reason = (
                    "a tensorwire control plane (ZeroMQ) listens there, not a /metrics page: "
                    "give the daemon's --metrics-port"
                )
            self.error, self.before, self.page = f"unreachable: {reason}", {}, {}
            return
        now = time.monotonic()
        self.before, self.page, self.seconds, self.at = self.page, page, now - self.at, now
        self.error = ""

    def _speaks_zeromq(self, timeout: float) -> bool:
        """Whether the port greets as ZeroMQ does: the daemon's --bind port given for its
        --metrics-port, which the HTTP client saw only as a timeout or a bad status line."""
        where = urllib.parse.urlsplit(self.url)
        if where.hostname is None or where.port is None:
            return False
        return zeromq_greeting_problem((where.hostname, where.port), min(timeout, 1.0)) is None

    def rate(self, name: str, **match: str) -> float | None:
        now, then = total(self.page, name, **match), total(self.before, name, **match)
        if now is None or then is None or self.seconds <= 0:
            return None
        return max(now - then, 0.0) / self.seconds  # a restarted daemon counts from 0 again

    def rates_by(self, name: str, label: str) -> dict[str, float]:
        if self.seconds <= 0:
            return {}
        now, then = by_label(self.page, name, label), by_label(self.before, name, label)
        return {k: max(v - then.get(k, 0.0), 0.0) / self.seconds for k, v in now.items()}


COLUMNS = (
    "daemon",
    "step",
    "steps/s",
    "loss",
    "accuracy",
    "time split",
    "sent/s",
    "received/s",
    "credit waits/s",
    "peers",
    "lost",
    "refused",
)


def _num(value: float | None, fmt: str = ".3g") -> str:
    # NaN: a gauge with nothing to say yet (a server's loss before its first step)
    return "-" if value is None or value != value else format(value, fmt)


def _bytes_per_s(rates: dict[str, float]) -> str:
    shown = [f"{t} {v / 1e6:.1f} MB/s" for t, v in sorted(rates.items()) if v > 0]
    return ", ".join(shown) or "-"


def row(t: Target) -> list[str]:
    """One daemon's line of the table."""
    p = t.page
    if t.error:
        return [t.url, t.error, *["" for _ in COLUMNS[2:]]]
    shard = by_label(p, "tensorwire_ps_step", "shard")
    rank = by_label(p, "tensorwire_worker_steps_total", "rank")
    split = "-"
    alarm = ""  # what an operator must act on, beside the step
    if shard:
        who = f"ps{next(iter(shard))}"
        step = total(p, "tensorwire_ps_step")
        failed = total(p, "tensorwire_ps_checkpoint_failures_total")
        if failed:
            alarm = f" ({failed:.0f} checkpoint{'s' if failed != 1 else ''} failed)"
        alone = total(p, "tensorwire_ps_clipped_alone_steps_total")
        if alone:  # (bsp, --clip-grad-norm over several shards: no worker gave the sum)
            alarm += f" ({alone:.0f} step{'s' if alone != 1 else ''} clipped by its own norm)"
        if total(p, "tensorwire_ps_done"):
            alarm += " (done)"  # (lingering: --linger)
        steps = t.rate("tensorwire_ps_steps_total")
        loss, accuracy = total(p, "tensorwire_ps_loss"), total(p, "tensorwire_ps_accuracy")
        waits = t.rates_by("tensorwire_ps_gradient_wait_seconds_total", "worker")
        if waits and max(waits.values()) > 0:
            slowest = max(waits, key=lambda w: waits[w])
            split = f"waits most on worker {slowest} ({waits[slowest]:.0%} of the time)"
    elif rank:
        who = f"worker{next(iter(rank))}"
        step = total(p, "tensorwire_worker_steps_total")
        steps = t.rate("tensorwire_worker_steps_total")
        loss, accuracy = total(p, "tensorwire_worker_loss"), total(p, "tensorwire_worker_accuracy")
        phases = t.rates_by("tensorwire_worker_phase_seconds_total", "phase")
        busy = sum(phases.values())
        if busy > 0:
            split = " ".join(f"{k} {v / busy:.0%}" for k, v in phases.items() if v / busy >= 0.01)
    else:
        who, step, steps, loss, accuracy = "tensorwire", None, None, None, None
    refused = (total(p, "tensorwire_control_errors_total") or 0) + (
        total(p, "tensorwire_bad_input_total") or 0
    )
    return [
        f"{who} {t.url.split('://', 1)[1].split('/', 1)[0]}",
        _num(step, ".0f") + alarm,
        _num(steps, ".1f"),
        _num(loss, ".4g"),
        _num(accuracy, ".4f"),
        split,
        _bytes_per_s(t.rates_by("tensorwire_sent_bytes_total", "transport")),
        _bytes_per_s(t.rates_by("tensorwire_received_bytes_total", "transport")),
        _num(t.rate("tensorwire_credit_waits_total"), ".1f"),
        _num(total(p, "tensorwire_peers"), ".0f"),
        _num(total(p, "tensorwire_peers_lost_total") or 0, ".0f"),
        _num(refused, ".0f"),
    ]


def table(targets: list[Target]) -> Any:
    from rich.table import Table

    out = Table(title=f"tensorwire top  {time.strftime('%H:%M:%S')}", title_justify="left")
    for name in COLUMNS:
        out.add_column(name, overflow="fold")
    for t in targets:
        out.add_row(*row(t))
    return out


def frames(targets: list[Target], interval: float, count: int | None) -> Iterator[Any]:
    """A table after each refresh (the first after one interval, so that rates exist)."""
    for t in targets:
        t.refresh(timeout=max(interval, 1.0))
    shown = 0
    while count is None or shown < count:
        time.sleep(interval)
        for t in targets:
            t.refresh(timeout=max(interval, 1.0))
        shown += 1
        yield table(targets)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tensorwire top",
        description="A live view of running daemons' metrics (tensorwire-ps, tensorwire-worker, "
        "tensorwire bench serve, each started with --metrics-port): steps/s, loss, time split, "
        "bytes/s per transport, credit waits, peers, losses and refusals.",
    )
    add_version(parser)
    parser.add_argument(
        "endpoints",
        nargs="+",
        metavar="ENDPOINT",
        help="HOST:PORT of a daemon's --metrics-port (or its http://.../metrics URL)",
    )
    parser.add_argument(
        "--interval",
        type=positive_seconds,
        default=2.0,
        help="seconds between refreshes (default 2)",
    )
    parser.add_argument(
        "--count",
        type=at_least(1),
        default=None,
        help="stop after this many refreshes (default: never); the exit status is 1 if no "
        "endpoint answered the last one",
    )
    args = parser.parse_args(argv)
    try:
        targets = [Target(metrics_url(e)) for e in args.endpoints]
    except ValueError as exc:
        parser.error(str(exc))
    for extra in (extras.METRICS, extras.RICH):
        if not extras.installed(extra):
            print(
                f"tensorwire top: error: needs {extra.module}: pip install 'tensorwire[metrics]'",
                file=sys.stderr,
            )
            return 1
    from rich.console import Console
    from rich.live import Live

    console = Console()
    if not console.is_terminal:  # logged or piped: wide enough for every column
        console = Console(width=200)
    try:
        if console.is_terminal:
            with Live(console=console, auto_refresh=False) as live:
                for frame in frames(targets, args.interval, args.count):
                    live.update(frame, refresh=True)
        else:
            for frame in frames(targets, args.interval, args.count):
                console.print(frame)
    except KeyboardInterrupt:
        pass
    if targets and all(t.error for t in targets):
        # a script's `top --count 1` learns that nothing answered, as a health check would
        print("tensorwire top: no endpoint answered at the last refresh", file=sys.stderr)
        return 1
    return 0
