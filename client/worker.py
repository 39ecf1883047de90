"""``tensorwire-worker`` (also ``tensorwire worker``): a data-parallel training worker.

It trains a task (:mod:`.tasks`: a built-in numpy MLP, or a user's factory, numpy or PyTorch)
on its shard of the data through a :class:`PSClient`: wait for the servers' parameters (written
straight into the model's registered storage), compute the gradient of its batch, push it
one-sided into the servers. Rank 0 evaluates test accuracy every
``--eval-every`` steps and at the end. Configured by flags, ``--config`` TOML or ``TENSORWIRE_*``
variables. SIGTERM or Ctrl-C: finish the current step, leave the job, then exit 0 (a SIGTERM
with ``--on-sigterm restart``: exit 143, to be started again).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from typing import Any

import tensorwire as tw
from tensorwire import curve
from tensorwire import metrics as tw_metrics
from tensorwire.checks import check_distinct
from tensorwire.job import config, files, limits
from tensorwire.job.progress import Progress
from tensorwire.process import die_with_launcher

from . import tasks, threads
from .metrics import WorkerStats, worker_metrics
from .psclient import PSClient, PSClientJobDone, PSClientStopped
from .tasks import Task

#: A worker's exit status at a SIGTERM with --on-sigterm restart: not done, to be started again
#: (a shell's status of a process a SIGTERM ended)
EXIT_RESTART = 128 + signal.SIGTERM

log = logging.getLogger("tensorwire.worker")


def build_parser(prog: str = "tensorwire-worker") -> config.DaemonParser:
    p = config.new_parser(
        prog,
        "A data-parallel worker: its model parameters are registered buffers that the parameter "
        "servers write into; it pushes gradients one-sided into the servers.",
        "worker",
    )
    p.add_argument(
        "--servers",
        default="tcp://127.0.0.1:5700",
        help="comma-separated server addresses, every shard's once, in any order: each "
        "server says which shard it is (default tcp://127.0.0.1:5700)",
    )
    p.add_argument(
        "--rank",
        type=config.at_least(0),
        default=None,
        help="this worker's rank, 0..workers-1 (default: RANK or SLURM_PROCID as a launcher "
        "such as torchrun or srun sets them, else 0)",
    )
    p.add_argument(
        "--workers",
        type=config.at_least(1),
        default=None,
        help="number of workers, i.e. data shards (default: WORLD_SIZE or SLURM_NTASKS as a "
        "launcher sets them, else 1)",
    )
    p.add_argument(
        "--model",
        default="digits",
        help="what to train: a built-in model (digits, large, many), package.module:factory or "
        "path/to/file.py:factory (see tensorwire.client.tasks; a factory may build a PyTorch "
        "nn.Module); default digits",
    )
    p.add_argument(
        "--framework",
        choices=tasks.FRAMEWORKS,
        default="auto",
        help="auto: the framework of what --model builds; torch: a built-in model as a PyTorch "
        "module (the numpy model's parameters, names and start), and a factory must build a "
        "torch module; numpy: a factory must build a numpy model (default auto)",
    )
    p.add_argument(
        "--batch", type=config.at_least(1), default=32, help="batch size per worker (default 32)"
    )
    p.add_argument(
        "--device",
        type=config.device_form,
        default="cpu",
        metavar="cpu|cuda|cuda:N",
        help="where a torch model trains and its parameters' buffers live; on a GPU the servers "
        "write the parameters into GPU memory (default cpu; needs torch with CUDA and cupy: "
        "pip install 'tensorwire[torch,gpu]')",
    )
    p.add_argument(
        "--threads",
        type=_threads_flag,
        default="auto",
        metavar="N|auto",
        help="threads of a PyTorch model's compute (torch.set_num_threads); auto: the host's "
        "usable cores (its CPU affinity within its cgroup's quota) divided among the workers "
        "computing there (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE, else the tensorwire workers "
        "running here as this one joins), or torch's own where OMP_NUM_THREADS or "
        "MKL_NUM_THREADS is set: torch's default of every core made the compute of two "
        "workers on a 2-core host 25x slower (default auto)",
    )
    p.add_argument(
        "--transport",
        default="auto",
        choices=tw.TRANSPORT_NAMES,
        help="data plane towards the servers (default auto: shm to a server on this host, "
        "else tcp)",
    )
    config.add_nixl_flags(p)
    config.add_memory_flags(p)
    config.add_secret_flags(p)
    p.add_argument(
        "--bind",
        default="tcp://127.0.0.1:0",
        help="this worker's receiver endpoint (default tcp://127.0.0.1:0: loopback, any free port)",
    )
    p.add_argument(
        "--advertise",
        default=None,
        help="host name or address servers reach this worker at (when --bind is 0.0.0.0 or "
        "[::]); found from the route to the first server if not given",
    )
    p.add_argument(
        "--eval-every",
        type=config.at_least(0),
        default=50,
        help="rank 0: test accuracy every N steps, and at the end (0: only at the end; default 50)",
    )
    p.add_argument(
        "--seed",
        type=config.at_least(0),
        default=0,
        help="data order and initialisation seed (default 0)",
    )
    p.add_argument(
        "--connect-timeout",
        type=config.positive_seconds,
        metavar="SECONDS",
        default=60.0,
        help="seconds to wait for the servers at start (default 60)",
    )
    p.add_argument(
        "--step-timeout",
        type=config.positive_seconds,
        metavar="SECONDS",
        default=300.0,
        help="seconds to wait for the servers' parameters within a step (default 300)",
    )
    p.add_argument(
        "--reconnect-timeout",
        type=config.positive_seconds,
        default=120.0,
        metavar="SECONDS",
        help="seconds to wait for a lost server to come back (default 120)",
    )
    p.add_argument(
        "--on-sigterm",
        choices=("stop", "restart"),
        default="stop",
        help="what SIGTERM means to this worker. Either way it finishes its step, tells the "
        "servers it leaves (they go on without it) and writes its summary. stop (default): "
        f"then exit 0. restart: its leave says it will be back (the servers wait for it as "
        f"for one lost), then exit {EXIT_RESTART} (128 + SIGTERM), so that an orchestrator "
        "that moves it (a Kubernetes pod evicted) starts it again rather than count its part "
        "done; it rejoins the job. Ctrl-C (SIGINT) always exits 0",
    )
    p.add_argument(
        "--curve-keys",
        type=config.path,
        metavar="DIR",
        default=None,
        help="the job's CURVE key pair (both files): encrypts the control plane",
    )
    config.add_heartbeat_flags(p, "server", 5.0, 30.0)
    p.add_argument(
        "--metrics",
        metavar="PATH",
        type=files.output_file,
        help="write a JSON summary here at the end (one started after its job ended, which "
        "trains nothing, keeps the summary of this rank's run that trained there)",
    )
    config.add_metrics_flags(p)
    p.add_argument(
        "--save-params",
        metavar="PATH.npz",
        type=files.output_file,
        help="save the final parameters (.npz is added where the name lacks it), and a "
        "PyTorch module's buffers (batch norm's statistics) as this worker kept them: the file "
        "is the module's whole state_dict",
    )
    p.add_argument(
        "--steps-hint",
        type=config.at_least(0),
        default=0,
        help="total steps, for the progress bar (default 0: no bar)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    config.add_logging_flags(p)
    return p


def _threads_flag(value: str) -> str:
    try:
        return threads.parse(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _set_threads(task: Task, setting: str) -> None:
    """Give a PyTorch model's compute the threads ``--threads`` says (:mod:`.threads`), once
    the worker has joined: the other workers of its host are running by then."""
    if getattr(task, "framework", None) != "torch":
        return
    import torch

    count, why = threads.choose(setting, os.environ)
    if count is not None:
        torch.set_num_threads(count)
    log.info(
        "PyTorch computes with %d thread(s) (%s%s)",
        torch.get_num_threads(),
        why,
        "" if setting != "auto" else "; --threads sets it",
    )


def train(
    client: PSClient,
    task: Task,
    *,
    rank: int,
    eval_every: int,
    progress: Progress,
    stop: list[bool],
    stats: WorkerStats | None = None,
) -> dict[str, Any]:
    """The training loop; returns its summary. ``stats`` is kept up to date as it goes."""
    stats = stats or WorkerStats(rank)
    stats.client = client
    task.bind(client.params)  # the model reads the buffers the servers write
    t0 = time.monotonic()
    stopped_waiting = False
    while True:
        try:
            step = client.wait_params()
            if step is None or stop[0]:
                break
            c0 = time.perf_counter()
            result = task.step(step)
            tasks.check_batch(step, result.samples)  # (before a NaN gradient goes out)
            c1 = time.perf_counter()
            stats.compute_seconds += c1 - c0
            acc = None
            if rank == 0 and eval_every and step % eval_every == 0:
                acc = stats.accuracy = task.evaluate()
                stats.evaluate_seconds += time.perf_counter() - c1
            client.push(
                result.grads,
                loss=result.loss,
                correct=result.correct,
                samples=result.samples,
                accuracy=acc,
            )
        except PSClientStopped as exc:  # a SIGTERM while a server is gone or silent
            # (or the server came back done: ended while we waited for it, PSClientJobDone)
            log.warning(
                "%s" if isinstance(exc, PSClientJobDone) else "%s: stopping without it", exc
            )
            stopped_waiting = True
            break
        stats.steps += 1
        stats.loss = result.loss
        progress.update(step + 1, loss=result.loss, accuracy=acc)
    secs = time.monotonic() - t0
    failed: dict[str, str] = {}
    try:
        final_acc = stats.accuracy = task.evaluate()
    except Exception as exc:  # the model's own code, after the whole job trained
        # The training it follows is kept: --save-params still writes the parameters, and
        # the worker exits 1 once it has (main). Before, the traceback ended the worker here
        # and nothing was saved (a model on the GPU evaluated on host data, say).
        log.error("the final evaluation (the model's evaluate) failed", exc_info=True)
        final_acc = None
        failed["evaluation_error"] = f"{type(exc).__name__}: {exc}"
    steps = stats.steps
    return _summary(
        rank,
        steps,
        secs,
        compute_s=stats.compute_seconds + stats.evaluate_seconds,
        communication_s=client.comm_seconds,
        device=getattr(task, "device", "cpu"),  # where it trained (its --device)
        threads=_torch_threads(task),
        final_loss=stats.loss if stats.steps else None,
        test_accuracy=final_acc,
        stopped_by_signal=stop[0],
        # the servers' last write of the parameters may not have been whole (one was lost)
        stopped_waiting=stopped_waiting,
        **failed,
    )


def _torch_threads(task: Task) -> int | None:
    """The threads a PyTorch model computed with (None: a numpy model)."""
    if getattr(task, "framework", None) != "torch":
        return None
    import torch

    return int(torch.get_num_threads())


def _summary(rank: int, steps: int, secs: float, **figures: Any) -> dict[str, Any]:
    """A worker's end-of-job summary (--metrics): its steps and time, ``figures``, its traffic."""
    rate = steps / secs if secs else 0.0
    return {
        "rank": rank,
        "steps": steps,
        "seconds": secs,
        "steps_per_s": rate,
        **figures,
        "traffic": tw_metrics.totals(),
    }


def trained_summary(path: str | None, rank: int) -> dict[str, Any] | None:
    """The summary at ``path`` (--metrics) where it is that of a run of worker ``rank`` that
    trained, else None (none there, unreadable, another rank's, or nothing trained). A worker
    started after its job ended (a job applied again once done, which starts every worker
    again) keeps it rather than write over it a summary of nothing trained: the run's figures
    were lost that way."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        return None
    if isinstance(earlier, dict) and earlier.get("rank") == rank and earlier.get("steps"):
        return earlier
    return None


def nothing_trained(rank: int, done_at: int) -> dict[str, Any]:
    """The summary of a worker that reached its servers after they ended the job at step
    ``done_at``: :func:`train`'s, with nothing trained (no parameters came, so no accuracy
    either)."""
    return _summary(
        rank,
        0,
        0.0,
        compute_s=0.0,
        communication_s=0.0,
        final_loss=None,
        test_accuracy=None,
        stopped_by_signal=False,
        stopped_waiting=False,
        job_done_at=done_at,
    )


def saved_arrays(client: PSClient, task: Task) -> dict[str, Any]:
    """What ``--save-params`` writes: the parameters (the servers' last write, on the host),
    then the state the task keeps of its own (a PyTorch module's buffers, such as batch norm's
    running statistics: each worker keeps its own, which no server sees), by name."""
    state = getattr(task, "state", None)
    return {**client.host_params(), **(state() if state is not None else {})}


def _not_saved(path: str, done: PSClientJobDone) -> str:
    """What a worker that came after the job's end says of its ``--save-params``: it had no
    parameters to write, and where the servers' checkpoints of the last step are."""
    kept = {addr: ckpt for addr, ckpt in done.checkpoints.items() if ckpt is not None}
    said = (
        f"--save-params {files.npz_name(path)} not written: no parameters came (the job had ended)"
    )
    if not kept:
        return f"{said}, and the servers wrote no checkpoint of its last step (--checkpoint-dir)"
    where = ", ".join(f"{ckpt} on the host of {addr}" for addr, ckpt in kept.items())
    return (
        f"{said}; the servers' checkpoints of its last step hold them ({where}): "
        "`tensorwire export CHECKPOINT... --out FILE` writes them as --save-params would"
    )


def main(argv: list[str] | None = None, prog: str = "tensorwire-worker") -> int:
    """The daemon: its exit status (a stop that comes as it exits changes nothing)."""
    return config.ignoring_late_stops(lambda: _run(argv, prog))


def _run(argv: list[str] | None, prog: str) -> int:
    die_with_launcher()
    parser = build_parser(prog)
    args = config.parse(parser, argv)
    if args.rank is None:
        args.rank = config.launcher_int(parser, "RANK", "SLURM_PROCID") or 0
    if args.workers is None:
        args.workers = config.launcher_int(parser, "WORLD_SIZE", "SLURM_NTASKS") or 1
    config.setup_logging(args.log_level, f"worker{args.rank}", args.log_format)
    args.secret = config.resolve_secret(parser, args, args.bind)
    if not 0 <= args.rank < args.workers:
        parser.error(f"--rank {args.rank} is not in 0..{args.workers - 1}")
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if not servers:
        parser.error("argument --servers: names no parameter server")
    limits.open_files_at_start(f"{len(servers)} servers", len(servers), args.transport)
    for server in servers:  # refused now, as --bind is, not at its first connect
        config.check_endpoint(parser, "--servers", server, to_bind=False)
    if args.advertise is not None:
        config.check_host(parser, "--advertise", args.advertise)
    try:  # one connection would serve two shards, and the job's plan would not fit
        check_distinct("the list", servers)
    except ValueError as exc:
        parser.error(f"argument --servers: {exc}: list each server of the job once")
    try:
        factory = tasks.load_factory(args.model, args.framework)
    except ValueError as exc:
        parser.error(str(exc))
    job = tasks.JobInfo(args.rank, args.workers, args.batch, args.seed)
    try:
        made = tasks.build(factory, args.model, job)
    except (tw.MissingDependencyError, ValueError) as exc:  # (the user's code: where it failed)
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    try:
        task = tasks.as_task(made, args.device)  # a torch module is moved to --device here
        tasks.check_framework(task, args.framework)
        initial = task.initial_params()
    except (ValueError, TypeError) as exc:  # what the model cannot do (e.g. a GPU for numpy)
        print(f"{prog}: error: --model {args.model!r}: {exc}", file=sys.stderr)
        return 1
    stop = [False]
    restart = [False]  # a SIGTERM under --on-sigterm restart: exit EXIT_RESTART

    def on_signal(sig: int, _frame: object) -> None:
        stop[0] = True
        restart[0] = restart[0] or (sig == signal.SIGTERM and args.on_sigterm == "restart")

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    progress = Progress(
        f"worker{args.rank}", args.steps_hint, enabled=not args.no_progress and args.steps_hint > 0
    )
    stats = WorkerStats(args.rank)
    scrape = None
    try:
        scrape = config.start_metrics(args, args.bind, lambda: worker_metrics(stats))
        log.info(
            "reaching %d parameter server(s): %s (for up to %g s, --connect-timeout)",
            len(servers),
            ", ".join(servers),
            args.connect_timeout,
        )
        with PSClient(
            servers,
            args.rank,
            {name: value.shape for name, value in initial.items()},
            transport=args.transport,
            secret=args.secret,
            bind=args.bind,
            advertise=args.advertise,
            connect_timeout=args.connect_timeout,
            reconnect_timeout=args.reconnect_timeout,
            heartbeat=args.heartbeat,
            heartbeat_timeout=args.heartbeat_timeout,
            curve_keys=curve.load(args.curve_keys) if args.curve_keys else None,
            timeout=args.step_timeout,
            nixl=config.nixl_options(args),
            shm=args.shm,
            init=initial if args.rank == 0 else None,
            device=getattr(task, "device", "cpu"),
            stopping=lambda: stop[0],
            workers=args.workers,
            fixed=task.fixed() if hasattr(task, "fixed") else None,
            seed=args.seed,
        ) as client:
            log.info(
                "joined %d server(s), pushing to them over %s",
                len(servers),
                client.tx.transport_of(servers[0]),
            )
            _set_threads(task, args.threads)
            metrics = train(
                client,
                task,
                rank=args.rank,
                eval_every=args.eval_every,
                progress=progress,
                stop=stop,
                stats=stats,
            )
            client.returning = restart[0]  # (its leave, as it closes, says it comes back)
            if args.save_params and metrics["stopped_waiting"]:
                log.warning(
                    "--save-params %s not written: a server was lost or silent as we stopped, "
                    "and its last write of the parameters may not be whole",
                    args.save_params,
                )
            elif args.save_params:
                try:
                    files.write_arrays(args.save_params, saved_arrays(client, task))
                except OSError as exc:
                    raise tw.TensorWireError(
                        f"cannot write --save-params {files.npz_name(args.save_params)}: "
                        f"{exc.strerror}"
                    ) from None
    except PSClientJobDone as exc:  # started again after the job ended: nothing to do
        print(f"worker{args.rank}: {exc}", file=sys.stderr)
        if args.save_params:
            print(f"worker{args.rank}: {_not_saved(args.save_params, exc)}", file=sys.stderr)
        kept = trained_summary(args.metrics, args.rank)
        if kept is not None:
            print(
                f"worker{args.rank}: --metrics {args.metrics} keeps the summary of the run that "
                f"trained ({kept['steps']} steps)",
                file=sys.stderr,
            )
            return 0
        # (its summary all the same: a launcher waiting for it reads one, `tensorwire ray-job`)
        return config.write_summary(args.metrics, nothing_trained(args.rank, exc.done_at), prog)
    except PSClientStopped as exc:  # asked to stop before the job formed: nothing trained
        print(f"worker{args.rank}: {exc}, before the job began", file=sys.stderr)
        return EXIT_RESTART if restart[0] else 0
    except (tw.TensorWireError, tasks.BatchError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        progress.close()
        if scrape is not None:
            scrape.close()
    accuracy = metrics["test_accuracy"]
    print(
        f"worker{args.rank}: {metrics['steps']} steps, {metrics['steps_per_s']:.1f} steps/s, "
        + (f"test accuracy {accuracy:.4f}" if accuracy is not None else "not evaluated"),
        file=sys.stderr,
    )
    code = config.write_summary(args.metrics, metrics, prog)
    failed = metrics.get("evaluation_error")
    if failed is not None:
        saved = (
            f"; the parameters were saved to {files.npz_name(args.save_params)}"
            if args.save_params and not metrics["stopped_waiting"]
            else ""
        )
        print(
            f"{prog}: error: the final evaluation (the model's evaluate) failed: {failed}{saved}",
            file=sys.stderr,
        )
        return 1
    if code == 0 and restart[0]:
        print(
            f"worker{args.rank}: stopped by SIGTERM (--on-sigterm restart): exit "
            f"{EXIT_RESTART}, to be started again; the job goes on without it meanwhile",
            file=sys.stderr,
        )
        return EXIT_RESTART
    return code


if __name__ == "__main__":
    raise SystemExit(main())
