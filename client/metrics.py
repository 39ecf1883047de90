"""A worker's figures as metrics (``tensorwire-worker --metrics-port``): steps, loss, accuracy
and where each step's time goes, labelled with the rank.

The training loop keeps a :class:`WorkerStats`; the phases of communication come from its
:class:`~.psclient.PSClient`. Read at each scrape, beside :mod:`tensorwire.metrics`'s own.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorwire.metrics import Metric

from .psclient import PSClient


@dataclass
class WorkerStats:
    rank: int
    steps: int = 0
    loss: float = float("nan")
    accuracy: float | None = None  # rank 0's last test accuracy
    compute_seconds: float = 0.0  # the task's steps: forward, backward
    evaluate_seconds: float = 0.0  # rank 0's test evaluations
    client: PSClient | None = None  # set once joined


def worker_metrics(stats: WorkerStats) -> list[Metric]:
    rank = (str(stats.rank),)
    phases = {"compute": stats.compute_seconds, "evaluate": stats.evaluate_seconds}
    reconnects = 0
    if stats.client is not None:
        phases.update(stats.client.phase_seconds)
        reconnects = stats.client.reconnects
    return [
        Metric(
            "tensorwire_worker_steps_total",
            "counter",
            "Training steps this worker has done",
            ("rank",),
            [(rank, stats.steps)],
        ),
        Metric(
            "tensorwire_worker_loss",
            "gauge",
            "Loss of this worker's last batch",
            ("rank",),
            [(rank, stats.loss)],
        ),
        Metric(
            "tensorwire_worker_accuracy",
            "gauge",
            "Test accuracy of the last evaluation (rank 0 evaluates; none before the first)",
            ("rank",),
            [] if stats.accuracy is None else [(rank, stats.accuracy)],
        ),
        Metric(
            "tensorwire_worker_phase_seconds_total",
            "counter",
            "Seconds of the steps by phase: compute (the model), evaluate (rank 0's tests), "
            "wait (for the servers' parameters: includes the servers' and the other workers' "
            "time), pull (16-bit parameters into float32), push (gradients out)",
            ("rank", "phase"),
            [((rank[0], phase), secs) for phase, secs in phases.items()],
        ),
        Metric(
            "tensorwire_worker_reconnects_total",
            "counter",
            "Times this worker lost a parameter server and rejoined it",
            ("rank",),
            [(rank, reconnects)],
        ),
    ]
