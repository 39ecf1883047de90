"""The parameter server's figures as metrics (``tensorwire-ps --metrics-port``): steps, loss,
accuracy, step time, stragglers, checkpoints and workers, labelled with the shard.

Read from :class:`~.ps.PSStats` at each scrape; the transport's own counts (messages, bytes,
credit waits, peers) come from :mod:`tensorwire.metrics` in the same page.
"""

from __future__ import annotations

from tensorwire.metrics import Metric

from .ps import ParameterServer


def ps_metrics(server: ParameterServer) -> list[Metric]:
    stats = server.stats
    shard = (str(server.cfg.shard),)
    return [
        Metric(
            "tensorwire_ps_steps_total",
            "counter",
            "Steps done since the server started (bsp: global steps; asp and ssp: each "
            "worker's steps)",
            ("shard",),
            [(shard, stats.steps)],
        ),
        Metric(
            "tensorwire_ps_step",
            "gauge",
            "The global step the job is at (after a resume, counted from the checkpoint's)",
            ("shard",),
            [(shard, server.step)],
        ),
        Metric(
            "tensorwire_ps_learning_rate",
            "gauge",
            "The rate of an update at the job's step: --lr (asp, ssp: its share of a push), "
            "moved by --warmup-steps and --lr-schedule",
            ("shard",),
            [(shard, server.rate)],
        ),
        Metric(
            "tensorwire_ps_done",
            "gauge",
            "1 once the job is done: every step (or, under asp and ssp, every worker finished "
            "or left; the server then exits, or lingers to say so where --linger asks), else 0",
            ("shard",),
            [(shard, 1 if server.done or server.ended else 0)],
        ),
        Metric(
            "tensorwire_ps_step_seconds",
            "summary",
            "Duration of the steps (bsp: from waiting for the first gradient to sending the "
            "last parameters)",
            ("shard",),
            [(shard, (stats.steps, stats.step_seconds))],
        ),
        Metric(
            "tensorwire_ps_serve_seconds",
            "summary",
            "bsp: the steps' writes of parameters to the workers taking part, from the first "
            "write's start to the last one's end (--serve-threads writes them at once)",
            ("shard",),
            [(shard, (stats.serves, stats.serve_seconds))],
        ),
        Metric(
            "tensorwire_ps_longest_step_seconds",
            "gauge",
            "The longest step since the daemon started (a worker lost waits --step-timeout)",
            ("shard",),
            [(shard, stats.longest_step)],
        ),
        Metric(
            "tensorwire_ps_loss",
            "gauge",
            "Training loss of the last step (mean over the workers that sent it)",
            ("shard",),
            [(shard, stats.loss)],
        ),
        Metric(
            "tensorwire_ps_gradient_wait_seconds_total",
            "counter",
            "Seconds bsp steps waited for each worker's gradients once the workers before it "
            "had sent theirs: the straggler's grows fastest",
            ("shard", "worker"),
            [((shard[0], str(rank)), secs) for rank, secs in sorted(stats.gradient_wait.items())],
        ),
        Metric(
            "tensorwire_ps_checkpoint_seconds",
            "summary",
            "Checkpoints written, and the time they took",
            ("shard",),
            [(shard, (stats.checkpoints, stats.checkpoint_seconds))],
        ),
        Metric(
            "tensorwire_ps_checkpoint_failures_total",
            "counter",
            "Checkpoints that could not be written (a full disk, a volume gone): logged as "
            "errors, and training went on",
            ("shard",),
            [(shard, stats.checkpoint_failures)],
        ),
        Metric(
            "tensorwire_ps_caught_up_steps_total",
            "counter",
            "Steps this shard skipped, restarted alone behind the job's other servers, to go on "
            "at their step (its parameters miss those steps' updates)",
            ("shard",),
            [(shard, stats.caught_up)],
        ),
        Metric(
            "tensorwire_ps_clipped_steps_total",
            "counter",
            "(--clip-grad-norm) Steps whose mean gradient was scaled down to the norm (asp, "
            "ssp: workers' pushes)",
            ("shard",),
            [] if server.cfg.clip_grad_norm is None else [(shard, stats.clipped)],
        ),
        Metric(
            "tensorwire_ps_clipped_alone_steps_total",
            "counter",
            "(bsp, --clip-grad-norm over several shards) Steps clipped by this shard's own "
            "norm, as no worker gave the sum of the servers' norms (each lost, left or joining "
            "again, or none within --step-timeout): clipped less than the whole gradient's "
            "norm would",
            ("shard",),
            [(shard, stats.clipped_alone)]
            if server.cfg.clip_grad_norm is not None
            and server.cfg.shards > 1
            and server.cfg.sync == "bsp"
            else [],
        ),
        Metric(
            "tensorwire_ps_workers",
            "gauge",
            "Workers taking part now (joined, ready and not lost)",
            ("shard",),
            [(shard, sum(w.alive for w in server.workers))],
        ),
        Metric(
            "tensorwire_ps_worker_events_total",
            "counter",
            "Workers that joined at the start, were lost, rejoined after a loss, or left (stopped)",
            ("shard", "event"),
            [((shard[0], event), n) for event, n in stats.worker_events.items()],
        ),
        Metric(
            "tensorwire_ps_accuracy",
            "gauge",
            "Test accuracy rank 0 last reported (no sample before its first evaluation)",
            ("shard",),
            [] if stats.accuracy is None else [(shard, stats.accuracy)],
        ),
    ]
