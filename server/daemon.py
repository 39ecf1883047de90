"""``tensorwire-ps`` (also ``tensorwire ps``): one parameter-server shard as a daemon.

Configured by flags, a TOML file (``--config``) or ``TENSORWIRE_*`` variables (flags win). SIGTERM
or Ctrl-C: finish the current step, checkpoint, tell the workers to stop, exit 0.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import signal
import sys
import time
from typing import Any

import tensorwire as tw
from tensorwire import metrics as tw_metrics
from tensorwire.job import config, files, limits
from tensorwire.job.progress import Progress
from tensorwire.process import die_with_launcher

from . import checkpoint, optim
from .linger import ENDED_ELSEWHERE_LINGER, linger
from .metrics import ps_metrics
from .ps import (
    ASYNC_LR,
    SYNC_MODES,
    WIRE_DTYPES,
    ParameterServer,
    PSConfig,
    StepReport,
    update_problem,
)


def build_parser(prog: str = "tensorwire-ps") -> config.DaemonParser:
    d = PSConfig()
    p = config.new_parser(
        prog,
        "A parameter-server shard: receives gradients one-sided into registered buffers, applies "
        "the optimizer, writes parameters straight into the workers' memory. It runs no model "
        "code: the workers bring the parameters' specs and rank 0 their initial values.",
        "ps",
    )
    p.add_argument("--bind", default=d.bind, help=f"control-plane endpoint (default {d.bind})")
    p.add_argument(
        "--shard", type=config.at_least(0), default=d.shard, help="this server's index (default 0)"
    )
    p.add_argument(
        "--shards", type=config.at_least(1), default=d.shards, help="number of servers (default 1)"
    )
    p.add_argument(
        "--workers",
        type=config.at_least(1),
        default=d.workers,
        help=f"workers to wait for (default {d.workers})",
    )
    p.add_argument(
        "--steps", type=config.at_least(0), default=d.steps, help=f"steps (default {d.steps})"
    )
    p.add_argument(
        "--sync",
        default=d.sync,
        choices=SYNC_MODES,
        help="consistency model. bsp: each step waits for every worker's gradients; asp: each "
        "worker's gradients are applied as they land; ssp: as asp, no worker more than "
        f"--staleness steps ahead of the slowest (default {d.sync})",
    )
    p.add_argument(
        "--staleness",
        type=config.at_least(0),
        default=d.staleness,
        help=f"ssp: most steps a worker may be ahead of the slowest (default {d.staleness})",
    )
    p.add_argument(
        "--optimizer",
        default=d.optimizer,
        choices=optim.OPTIMIZERS,
        help="the update the servers make with the gradients: sgd, sgd with momentum, adam, "
        f"or adamw (adam with decoupled weight decay) (default {d.optimizer})",
    )
    rates = ", ".join(f"{r:g} for {n}" for n, r in optim.DEFAULT_LR.items())
    p.add_argument(
        "--lr",
        type=config.positive_number,
        default=d.lr,
        help=f"learning rate (default: the optimizer's, {rates})",
    )
    p.add_argument(
        "--async-lr",
        default=d.async_lr,
        choices=ASYNC_LR,
        help="asp, ssp: the rate of each worker's gradient as it lands. mean: --lr divided by "
        "--workers, so a round of every worker's push moves the parameters as one bsp step "
        "does and --lr means the same under every --sync; each: every push at the full --lr "
        f"(Downpour SGD; divide --lr yourself for momentum and adam) (default {d.async_lr})",
    )
    p.add_argument(
        "--momentum",
        type=config.below_one,
        default=d.momentum,
        help=f"momentum of sgd (default {d.momentum:g})",
    )
    p.add_argument(
        "--weight-decay",
        type=config.amount,
        default=d.weight_decay,
        help="weight decay: L2 (added to the gradient), decoupled for adamw (the parameters "
        f"shrink by --lr times it each step, as torch.optim.AdamW's, whose own default is "
        f"0.01) (default {d.weight_decay:g})",
    )
    p.add_argument(
        "--lr-schedule",
        default=d.lr_schedule,
        choices=optim.SCHEDULES,
        help="how the rate moves over the job's --steps after the warmup: constant at --lr, or "
        "falling to 0 at the last step in a line (linear) or along half a cosine (cosine); "
        f"Hugging Face transformers' schedules of those names (default {d.lr_schedule})",
    )
    p.add_argument(
        "--warmup-steps",
        type=config.at_least(0),
        default=d.warmup_steps,
        help="steps over which the rate rises linearly from 0 to --lr before the schedule "
        f"(default {d.warmup_steps})",
    )
    p.add_argument(
        "--clip-grad-norm",
        type=config.positive_number,
        default=d.clip_grad_norm,
        metavar="MAX",
        help="scale the gradient down to this global norm where it is above it, as "
        "torch.nn.utils.clip_grad_norm_ does: bsp, a step's mean gradient (with several shards "
        "the workers add up the servers' norms each step, a round trip more); asp and ssp, "
        "each worker's push, whose norm the worker sends with it (default: no clipping)",
    )
    p.add_argument(
        "--transport",
        default=d.transport,
        choices=tw.TRANSPORT_NAMES,
        help="data plane towards the workers (default auto: shm to a worker on this host, "
        "else tcp)",
    )
    p.add_argument(
        "--wire-dtype",
        default=d.wire_dtype,
        choices=WIRE_DTYPES,
        help="what gradients and parameters travel as (default float32); the server keeps "
        "float32 parameters and optimizer state, and the workers learn the choice from it",
    )
    p.add_argument(
        "--device",
        type=config.device_form,
        default=d.device,
        metavar="cpu|cuda|cuda:N",
        help="where the shard keeps its parameters, the workers' gradients and the optimizer's "
        "state (default cpu); on a GPU the gradients land in its memory and the update runs "
        "there (needs cupy: pip install 'tensorwire[gpu]'; float32 on the wire)",
    )
    config.add_nixl_flags(p)
    config.add_memory_flags(p)
    config.add_secret_flags(p)
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="where to write checkpoints (checked at start: it must be a writable directory, or "
        "creatable)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=config.at_least(0),
        default=d.checkpoint_every,
        help=f"steps between checkpoints (default {d.checkpoint_every}; 0: only the last one, "
        "as the server ends)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last checkpoint (the job forms again without the workers it "
        "records as done with their steps, left on their own, or lost: the last two are taken "
        "back when they join)",
    )
    p.add_argument(
        "--resume-if-present",
        action="store_true",
        help="continue from the last checkpoint if there is one, else start afresh: for "
        "orchestrators that restart a server with the command it first ran with (Kubernetes)",
    )
    p.add_argument(
        "--join-timeout",
        type=config.positive_seconds,
        metavar="SECONDS",
        default=d.join_timeout,
        help="seconds to wait for every worker to join (a job forming for the first time "
        "fails past it; one resumed from a checkpoint goes on with the workers that came back, "
        f"and takes the others back when they join; default {d.join_timeout:g})",
    )
    p.add_argument(
        "--step-timeout",
        type=config.positive_seconds,
        default=d.step_timeout,
        metavar="SECONDS",
        help="seconds to wait for a worker within a step (for its gradients, or for it to take "
        "the parameters) before going on without it; it is told, and joins again (default "
        f"{d.step_timeout:g})",
    )
    p.add_argument(
        "--stop-grace",
        type=config.positive_seconds,
        metavar="SECONDS",
        default=d.stop_grace,
        help="once stopped (SIGTERM, SIGINT): seconds the step in flight waits for the workers "
        "still to push (longer where 3 mean steps take longer; never past --step-timeout), "
        "then for each worker to take the last parameters or hear that we stop; keep it "
        f"well within an orchestrator's grace period (Kubernetes: 30 s; default {d.stop_grace:g})",
    )
    p.add_argument(
        "--linger",
        type=config.seconds_or_forever,
        metavar="SECONDS",
        default=0.0,
        help="once the job is done (every step, under asp and ssp every worker finished or "
        "left, or a checkpoint of the last step resumed): "
        "seconds to keep answering at --bind that it is, so that a worker started again "
        "then exits 0 at once rather than wait for us and fail; 'forever' until SIGTERM, for "
        "orchestrators that restart a server that exits (a Kubernetes StatefulSet). The "
        "job's memory is given back first (default 0: exit at once)",
    )
    p.add_argument(
        "--on-sigterm",
        choices=("stop", "restart"),
        default="stop",
        help="what SIGTERM means. stop (default): the job stops: the step in flight is "
        "finished and checkpointed, and every worker is told to stop (they exit 0), as a "
        "launcher stopping a job wants. restart: this server goes away and will be started "
        "again (an orchestrator moving it: a Kubernetes pod deleted, evicted or rolled): it "
        "checkpoints where the job is and exits 0 without telling the workers, which wait for "
        "it (their --reconnect-timeout) and rejoin it once it resumes. SIGINT always stops the "
        "job; once the job is done, SIGTERM ends a linger either way",
    )
    p.add_argument(
        "--split-bytes",
        type=config.at_least(1),
        default=d.split_bytes,
        help=f"split tensors larger than this many bytes into chunks (default {d.split_bytes})",
    )
    p.add_argument(
        "--pack-bytes",
        type=config.at_least(0),
        default=d.pack_bytes,
        help="whole parameters smaller than this many bytes travel together, in packs of at "
        "most --split-bytes: one message each way a step for many small tensors (biases, "
        f"norms) instead of one each; 0: each alone (default {d.pack_bytes})",
    )
    p.add_argument(
        "--serve-threads",
        type=config.at_least(0),
        default=d.serve_threads,
        metavar="N",
        help="bsp: threads that write each step's parameters to the workers at once; 0: one "
        "per worker, up to this machine's cores and 8, which pays for large models (tens of "
        "MB; the metric tensorwire_ps_serve_seconds says what the writes take) and costs small "
        "ones; default 1, one worker after another. A shard on a GPU serves from one thread",
    )
    p.add_argument(
        "--seed",
        type=config.at_least(0),
        default=d.seed,
        help="the job's seed: every worker must be started with the same --seed (it orders "
        "and cuts their data, and a model factory seeds its model by it), and one started with "
        f"another is refused as it joins (default {d.seed})",
    )
    p.add_argument(
        "--curve-keys",
        type=config.path,
        metavar="DIR",
        default=None,
        help="encrypt the control plane with the CURVE key pair in DIR (`tensorwire keys DIR`)",
    )
    config.add_heartbeat_flags(p, "worker", d.heartbeat, d.heartbeat_timeout)
    p.add_argument(
        "--metrics",
        metavar="PATH",
        type=files.output_file,
        help="write a JSON summary here at the end",
    )
    config.add_metrics_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    config.add_logging_flags(p)
    return p


def _workers(awaited: int, workers: int) -> str:
    """The workers a server waits for: all of them, or (resumed) those its checkpoint does not
    record as gone (ParameterServer.awaited)."""
    some = "" if awaited == workers else f" of {workers}"
    return f"{awaited}{some} worker{'' if awaited == 1 and not some else 's'}"


def main(argv: list[str] | None = None, prog: str = "tensorwire-ps") -> int:
    """The daemon: its exit status (a stop that comes as it exits changes nothing)."""
    return config.ignoring_late_stops(lambda: _run(argv, prog))


def _keep_the_checkpoint_there(directory: str, shard: int) -> None:
    """(Started afresh, without --resume.) Move this shard's checkpoint in ``directory``, if
    there is one, to a name of its own beside it, and say where: the server's first checkpoint
    would write over it. That is right for one of several servers restarted alone, which goes
    on at the others' step (from rank 0's copy of its parameters), and loses a job's progress
    where the whole job was started again without --resume, or a second job was given the
    first one's directory: found so, a checkpoint of step 300 became one of a new job's step
    100, without a word. Kept, it is there to go on from (moved back, with --resume). OSError
    where it cannot be moved."""
    kept = checkpoint.path_for(directory, shard)
    if not os.path.exists(kept):
        return
    try:
        at = f"step{checkpoint.layout_of(kept).step}-"
    except (ValueError, OSError, KeyError):
        at = ""
    moved = f"{kept}.before-{at}{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    os.rename(kept, moved)
    # Never deleted (each may be the only copy of a job's progress), so said as they pile up:
    # a job started again and again without --resume keeps one more each time.
    aside = glob.glob(glob.escape(kept) + ".before-*")
    piled = ""
    if len(aside) > 1:
        size = sum(os.path.getsize(f) for f in aside if os.path.isfile(f))
        piled = (
            f"; {len(aside)} of this shard's checkpoints are kept aside there now, "
            f"{size / 2**20:.1f} MiB in all: delete those you no longer need"
        )
    logging.getLogger("tensorwire.ps").warning(
        "started without --resume: this shard's checkpoint in %s is kept as %s (move it back "
        "and give --resume, or --resume-if-present, to go on from it)%s",
        directory,
        moved,
        piled,
    )


def _run(argv: list[str] | None, prog: str) -> int:
    die_with_launcher()
    parser = build_parser(prog)
    args = config.parse(parser, argv)
    config.setup_logging(args.log_level, f"ps{args.shard}", args.log_format)
    limits.open_files_at_start(f"{args.workers} workers", args.workers, args.transport)
    args.secret = config.resolve_secret(parser, args, args.bind)
    if args.checkpoint_dir is not None:
        problem = checkpoint.unusable(args.checkpoint_dir)
        if problem:
            parser.error(f"--checkpoint-dir {args.checkpoint_dir}: {problem}")
    if args.resume and args.checkpoint_dir is None:
        parser.error("--resume needs --checkpoint-dir (where the checkpoint is)")
    # (ParameterServer says so too, once bound: here first)
    problem = update_problem(args.steps, args.warmup_steps)
    if problem:
        parser.error(problem)
    if args.resume_if_present:
        if args.checkpoint_dir is None:
            parser.error("--resume-if-present needs --checkpoint-dir (where to look)")
        found = os.path.exists(checkpoint.path_for(args.checkpoint_dir, args.shard))
        if not found:
            logging.getLogger("tensorwire.ps").info(
                "no checkpoint in %s yet: starting afresh", args.checkpoint_dir
            )
        args.resume = args.resume or found
    values: dict[str, Any] = {
        k: getattr(args, k) for k in PSConfig.__dataclass_fields__ if k != "nixl"
    }
    cfg = PSConfig(**values, nixl=config.nixl_options(args))
    bar = Progress(f"ps{cfg.shard}", cfg.steps, enabled=not args.no_progress)

    def on_step(r: StepReport) -> None:
        # the accuracy with the step it was measured at: rank 0 measures it every
        # --eval-every steps, and "accuracy 0.1028" beside step 40 read as that step's
        measured = f"accuracy@{r.accuracy_step}" if r.accuracy_step is not None else "accuracy"
        bar.update(r.step, loss=r.loss, **{measured: r.accuracy})

    try:
        server = ParameterServer(cfg, on_step)
    except (tw.TensorWireError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    if args.checkpoint_dir is not None and not args.resume:
        # (once serving at --bind: a second server started by mistake beside the one that
        # holds the address, and the checkpoint, fails before it moves anything)
        try:
            _keep_the_checkpoint_there(args.checkpoint_dir, args.shard)
        except OSError as exc:
            server.close()
            print(
                f"{prog}: error: cannot move this shard's checkpoint in {args.checkpoint_dir} "
                f"aside ({exc.strerror}), and started afresh the server would write over it: "
                "give --resume to go on from it",
                file=sys.stderr,
            )
            return 1
    try:
        scrape = config.start_metrics(args, cfg.bind, lambda: ps_metrics(server))
    except tw.TensorWireError as exc:
        server.close()
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGINT, lambda *_: server.request_stop())  # (also ends a linger)
    signal.signal(
        signal.SIGTERM,
        lambda *_: (
            server.request_departure() if args.on_sigterm == "restart" else server.request_stop()
        ),
    )
    logging.getLogger("tensorwire.ps").info(
        "shard %d of %d serving at %s; waiting for %s (they bring the model)",
        cfg.shard,
        cfg.shards,
        server.address,
        _workers(server.awaited, cfg.workers),
    )
    if cfg.sync != "bsp":
        logging.getLogger("tensorwire.ps").info(
            "%s: each worker's gradient is applied as it lands, at %g (--lr %g, --async-lr %s)",
            cfg.sync,
            server.push_lr,
            server.lr,
            cfg.async_lr,
        )
    if cfg.lr_schedule != "constant" or cfg.warmup_steps:
        rise = f"rises from 0 over {cfg.warmup_steps} step(s), then " if cfg.warmup_steps else ""
        after = (
            "stays at its full value"
            if cfg.lr_schedule == "constant"
            else f"falls to 0 ({cfg.lr_schedule})"
        )
        logging.getLogger("tensorwire.ps").info(
            "the rate %s%s over the job's %d steps (--warmup-steps %d, --lr-schedule %s)",
            rise,
            after,
            cfg.steps,
            cfg.warmup_steps,
            cfg.lr_schedule,
        )
    if cfg.clip_grad_norm is not None:
        if cfg.sync != "bsp":
            what, how = "each worker's push", " (its whole gradient's, which the worker sends)"
        elif cfg.shards > 1:
            what, how = (
                "each step's mean gradient",
                (
                    f" (the norm of all {cfg.shards} shards' chunks: the workers add up the "
                    "servers' norms each step, a round trip more)"
                ),
            )
        else:
            what, how = "each step's mean gradient", ""
        logging.getLogger("tensorwire.ps").info(
            "%s is scaled down to a norm of %g where it is above it%s",
            what,
            cfg.clip_grad_norm,
            how,
        )
    start = server.step
    if server.resumed_done:
        logging.getLogger("tensorwire.ps").info(
            "the checkpoint is at step %d, the job's last (--steps %d): nothing left to train; "
            "workers that join within --join-timeout are told to stop",
            server.step,
            cfg.steps,
        )
    try:
        try:
            server.run()
        except tw.TensorWireError as exc:  # PSError, and a transport's error that ends the job
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 1
        finally:
            bar.close()
            server.close()
        if server.stopped_while_joining is not None:
            print(
                f"ps{cfg.shard}: stopped before the job began: {server.stopped_while_joining}",
                file=sys.stderr,
            )
            return 0
        code = _summarise(server, args, start, prog)
        seconds = args.linger
        if server.ended_elsewhere is not None:
            seconds = max(seconds, ENDED_ELSEWHERE_LINGER)
        if code == 0 and server.ended and not server.stop_requested and seconds > 0:
            published = server.published(done_at=server.step)

            def asked() -> bool:  # (either signal ends a linger)
                return server.stop_requested or server.departing

            linger(cfg, server.address, published, seconds, asked)
        return code
    finally:
        if scrape is not None:  # (scraped while we linger: a server done is not one down)
            scrape.close()


def _summarise(server: ParameterServer, args: argparse.Namespace, start: int, prog: str) -> int:
    """Say how the job went, and write --metrics: the exit status."""
    cfg = server.cfg
    if server.done_unjoined is not None:
        print(
            f"ps{cfg.shard}: the job was done at step {server.step} (its checkpoint); "
            f"told the workers that came: {server.done_unjoined}",
            file=sys.stderr,
        )
    if server.ended_elsewhere is not None:
        print(
            f"ps{cfg.shard}: the job ended on another server (a worker told to stop there said "
            f"so, or one that found it done): it ended here too, at step {server.step}",
            file=sys.stderr,
        )
    secs = time.monotonic() - server.started_at
    # the steps done here: not those skipped to catch up with the other servers
    steps = server.step - start - server.stats.caught_up
    summary = {
        "steps": server.step,
        "seconds": secs,
        "steps_per_s": steps / secs if secs else 0,
        # seconds from this server's start to the job formed (None: it never did)
        "formed_s": server.formed_after,
        "final_loss": server.last_loss,
        "accuracy": server.last_accuracy,
        "caught_up": server.stats.caught_up,
        # the step another server ended the job at, as a worker told us; None where none did
        "ended_elsewhere": server.ended_elsewhere,
        "longest_step_s": server.stats.longest_step,
        # (bsp) mean seconds of a step's writes of parameters to its workers (_serve_all)
        "serve_s": server.stats.serve_seconds / server.stats.serves
        if server.stats.serves
        else None,
        "checkpoint_failures": server.stats.checkpoint_failures,
        # (--clip-grad-norm) the steps whose mean gradient was scaled down to it (asp, ssp:
        # the pushes)
        "clipped_steps": server.stats.clipped if cfg.clip_grad_norm is not None else None,
        # (bsp and several shards) the steps clipped by this shard's own norm: no worker gave
        # the servers' sum (each lost, left or joining again)
        "clipped_alone_steps": server.stats.clipped_alone
        if cfg.clip_grad_norm is not None and cfg.shards > 1 and cfg.sync == "bsp"
        else None,
        "sync": cfg.sync,
        "transport": cfg.transport,
        "traffic": tw_metrics.totals(),
    }
    if server.departed:
        print(
            f"ps{cfg.shard}: left the job at step {server.step} (SIGTERM, --on-sigterm "
            "restart), its checkpoint written there; the workers wait for this server to be "
            "started again (--resume-if-present)",
            file=sys.stderr,
        )
    loss = summary["final_loss"]  # (None, or NaN, before any step)
    print(
        f"ps{cfg.shard}: {'left' if server.departed else 'done'} at step {server.step}: "
        f"{steps} steps in {secs:.2f} s ({summary['steps_per_s']:.1f} steps/s), "
        + (f"loss {loss:.4g}" if isinstance(loss, float) else "no loss yet"),
        file=sys.stderr,
    )
    return config.write_summary(args.metrics, summary, prog)


if __name__ == "__main__":
    raise SystemExit(main())
