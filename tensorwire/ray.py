"""A parameter-server job on a Ray cluster: ``tensorwire ray-job``, ``python -m tensorwire.ray``,
and :func:`run_job` for scripts.

Ray places the processes, restarts the ones that fail and tells each where it runs; the tensors
move over tensorwire's own data plane, never through Ray. Every server shard and every worker is
a Ray actor whose only job is to run the very daemon an operator would start by hand
(``tensorwire-ps``, ``tensorwire-worker``) as its child process, with the flags the launcher
works out:

* **Placement**: one placement-group bundle per process (CPUs and GPUs as asked), spread across
  nodes by default (``--placement pack`` keeps them together). A restarted actor goes back to its
  bundle, so a server comes back on its node, at its address.
* **Addresses**: a server binds ``tcp://<its node's IP>:<--port + shard>`` and the launcher hands
  the list to the workers (no address flags to type); workers bind a free port on their node.
* **Transport**: ``auto`` unless told otherwise, i.e. shared memory between daemons on one node
  and TCP across nodes (``--transport nixl`` for RDMA across nodes).
* **Secret**: ``--secret-file`` or ``TENSORWIRE_SECRET``, else one made for the job; it reaches
  the daemons in their environment (never on a command line), through Ray's own control plane.
* **Failures**: a daemon that dies (or whose actor is killed) is started again by Ray, up to
  ``--max-restarts`` times: a worker rejoins at the current step; a server resumes from its
  last checkpoint (``--checkpoint-dir``, node-local by default, so on the same node).
* **Stopping early**: SIGTERM or Ctrl-C asks the servers to stop as their own SIGTERM does
  (each finishes its step, checkpoints and exits; the workers end with them) and the launcher
  writes the summary as at a normal end; a second signal, or a stop that outlasts
  :data:`STOP_GRACE`, abandons the job.
* **Cleanup**: at the end, on an error, a timeout or an abandoned stop, every actor and the
  placement group are removed; the daemons die with their actors (``PR_SET_PDEATHSIG``).

Needs the ``ray`` extra (``pip install 'tensorwire[ray]'``) here and tensorwire on every node.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .checks import check_amount, check_count
from .endpoint import tcp_endpoint
from .errors import MissingDependencyError, TensorWireError
from .extras import RAY, require
from .process import for_my_children

#: exit status of a daemon that was given unusable flags: starting it again cannot help
USAGE_ERROR = 2
#: seconds the daemons have, once a stop is asked, to finish their step, checkpoint and exit
STOP_GRACE = 60.0
#: flags the launcher sets for each process itself (refused on the command line)
LAUNCHER_SETS = (
    "--bind",
    "--shard",
    "--shards",
    "--rank",
    "--workers",
    "--servers",
    "--advertise",
    "--resume",
    "--resume-if-present",
    "--checkpoint-dir",
    "--metrics",
    "--secret",
    "--secret-file",
    "--config",
)


class RayJobError(TensorWireError):
    """A job launched on Ray failed: a daemon exhausted its restarts, or the job timed out."""


@dataclass
class RayJob:
    """What to run: ``ps_args`` and ``worker_args`` are the daemons' own flags (``--steps``,
    ``--model``, ``--transport``...); the rest is where and how Ray runs them."""

    shards: int = 1
    workers: int = 1
    ps_args: list[str] = field(default_factory=list)
    worker_args: list[str] = field(default_factory=list)
    cpus_per_server: float = 1.0
    cpus_per_worker: float = 1.0
    gpus_per_server: float = 0.0
    gpus_per_worker: float = 0.0
    placement: str = "spread"  # or "pack"
    port: int = 5700  # shard k listens on port + k on its node
    max_restarts: int = 3
    checkpoint_dir: str | None = None  # default: a node-local directory per job
    secret: str | None = None  # default: made for the job
    timeout: float = 3600.0
    env: dict[str, str] = field(default_factory=dict)  # for every daemon (OPENBLAS_NUM_THREADS)

    def check(self) -> None:
        check_count("shards", self.shards, 1)
        check_count("workers", self.workers, 1)
        if self.placement not in ("spread", "pack"):
            raise ValueError(f"placement must be 'spread' or 'pack', got {self.placement!r}")
        if not 0 < check_count("port", self.port, 1) <= 65535 - self.shards:
            raise ValueError(f"port {self.port} leaves no room for {self.shards} shards")
        check_count("max_restarts", self.max_restarts, 0)
        # Ray would be started first, then fail to place a negative amount, or wait for ever
        for name in ("cpus_per_server", "cpus_per_worker", "gpus_per_server", "gpus_per_worker"):
            check_amount(name, getattr(self, name))
        for who in ("server", "worker"):
            # an empty bundle, which Ray refused only once started ("Bundles cannot be an
            # empty dictionary or resources with only 0 values")
            if getattr(self, f"cpus_per_{who}") == 0 == getattr(self, f"gpus_per_{who}"):
                raise ValueError(
                    f"cpus_per_{who} and gpus_per_{who} are both 0: a {who} must ask Ray for "
                    "some CPU or GPU to be placed"
                )
        check_amount("timeout", self.timeout, positive=True)
        for token in (*self.ps_args, *self.worker_args):
            flag = token.split("=", 1)[0]
            if flag in LAUNCHER_SETS:
                raise ValueError(
                    f"{flag} is set by the launcher for each process; "
                    "leave it out (see tensorwire ray-job --help)"
                )


@dataclass
class RayJobResult:
    servers: list[dict[str, Any]]  # each shard's end-of-job JSON, with its node
    workers: list[dict[str, Any]]  # each worker's (the last run of a restarted one)
    wall_seconds: float  # from the call to the last daemon's exit
    setup_seconds: float  # from the call to the first step: placement, start-up, joining
    restarts: dict[str, int]  # per process ("ps0", "w1"): how often Ray started it again
    stopped: bool = False  # ended early by a stop asked of run_job, not by its step count


# --------------------------------------------------------------------------------------------
# The actor: one daemon, started with its actor and killed with it
# --------------------------------------------------------------------------------------------


class DaemonActor:
    """Runs one daemon. Its constructor starts it (again, when Ray restarts the actor);
    :meth:`wait` returns its end-of-job JSON once it exits 0. A daemon that fails takes its actor
    down with it, so that Ray restarts both; a usage error (exit 2) is reported instead, since
    the same flags would fail again."""

    def __init__(
        self, name: str, module: str, flags: list[str], env: dict[str, str], port: int, job: str
    ) -> None:
        import ray

        self.name = name
        self.host = ray.util.get_node_ip_address()
        self.bind = tcp_endpoint(self.host, port)  # the node may have an IPv6 address
        # The job's directory on this node: metrics, default checkpoints, and the count of
        # starts (an actor restarted by Ray comes back to its node: its placement bundle).
        self._dir = job_directory(job)
        os.makedirs(self._dir, exist_ok=True)
        self._metrics = os.path.join(self._dir, f"{name}.json")
        starts = os.path.join(self._dir, f"{name}.starts")
        with open(starts, "a") as f:
            f.write(f"{os.getpid()}\n")
        with open(starts) as f:
            self.restarts = len(f.read().split()) - 1
        # this node's Python, which may live elsewhere than the driver's
        argv = [sys.executable, "-m", module, "--metrics", self._metrics]
        fill = {"{bind}": self.bind, "{host}": self.host, "{job}": self._dir}
        for flag in flags:
            for key, value in fill.items():
                flag = flag.replace(key, value)
            argv.append(flag)
        # The daemon's output goes to the actor's, which Ray keeps and shows the driver.
        self._proc = subprocess.Popen(
            argv,
            env=for_my_children({**os.environ, **env}),  # the daemon dies with its actor
            stdin=subprocess.DEVNULL,
        )

    def info(self) -> dict[str, Any]:
        """Where it runs: node address, endpoint, pids, and how often Ray restarted it."""
        return {
            "host": self.host,
            "bind": self.bind,
            "actor_pid": os.getpid(),
            "daemon_pid": self._proc.pid,
            "restarts": self.restarts,
        }

    def wait(self) -> dict[str, Any]:
        code = self._proc.wait()
        if code == 0:
            try:
                with open(self._metrics) as f:
                    summary: dict[str, Any] = json.load(f)
            except (OSError, ValueError) as exc:  # (a flag that ends it early: not a restart)
                return {"failed": f"{self.name} exited 0 without its summary ({exc})"}
            summary["host"] = self.host
            return summary
        if code == USAGE_ERROR:
            return {"failed": f"{self.name} refused its flags (exit {code}): see its log"}
        print(f"tensorwire: {self.name} exited with {code}; Ray restarts it", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)  # the actor dies with its daemon: Ray restarts it (and this call)

    def stop(self) -> None:
        """Ask the daemon to stop as an operator's SIGTERM does: a server finishes its step,
        checkpoints and exits 0 (its workers end with it); :meth:`wait` returns its summary."""
        if self._proc.poll() is None:
            self._proc.terminate()

    def finish(self) -> None:
        """Stop the daemon if it still runs (SIGTERM: it finishes its step; SIGKILL after 10 s)
        and remove the job's directory on this node (the first actor there to finish does)."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


def job_directory(token: str) -> str:
    """A job's directory on a node (the same path on every node)."""
    return os.path.join(tempfile.gettempdir(), f"tensorwire-ray-{token}")


# --------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------


def _ray() -> Any:
    require(RAY, "launching a job on Ray")
    import ray

    return ray


def _worker_flags(job: RayJob, servers: list[str]) -> list[list[str]]:
    """Each worker's flags (``{host}`` is filled in on its node)."""
    return [
        [
            "--servers",
            ",".join(servers),
            "--rank",
            str(rank),
            "--workers",
            str(job.workers),
            "--bind",
            "tcp://{host}:0",
            *job.worker_args,
        ]
        for rank in range(job.workers)
    ]


def _server_flags(job: RayJob, shard: int, checkpoints: str) -> list[str]:
    """A shard's flags (``{bind}`` is filled in on its node)."""
    return [
        "--bind",
        "{bind}",
        "--shard",
        str(shard),
        "--shards",
        str(job.shards),
        "--workers",
        str(job.workers),
        "--checkpoint-dir",
        checkpoints,
        "--resume-if-present",  # a restarted shard continues from its checkpoint
        # the daemon's default (50) suits checkpoints asked for; these are always on
        *([] if _has(job.ps_args, "--checkpoint-every") else ["--checkpoint-every", "500"]),
        # Once the job is done a server stays, telling a worker that Ray starts again then (one
        # that failed near the end) that it is: it exits 0. Without it, such a worker waited
        # for a server that had exited until its --connect-timeout, failed, and was started
        # again until its restarts ran out: the job was called failed. The launcher stops the
        # servers once every worker has ended (_wait_all).
        *([] if _has(job.ps_args, "--linger") else ["--linger", "forever"]),
        *job.ps_args,
    ]


def _has(flags: list[str], flag: str) -> bool:
    return any(f == flag or f.startswith(flag + "=") for f in flags)


def run_job(job: RayJob, *, log: Any = None, stop: threading.Event | None = None) -> RayJobResult:
    """Run ``job`` on the Ray cluster this process is connected to (``ray.init`` first; a
    local one is started if there is none) and return every daemon's summary. Raises
    :class:`RayJobError` when a daemon fails for good or the job runs past ``job.timeout``.

    ``stop``, once set (from a signal handler or another thread), ends the job early: the
    servers are asked to stop as their own SIGTERM does (each finishes its step, checkpoints and
    exits; the workers end with them) and the summaries are returned as at a normal end, with
    ``stopped`` true. A stop asked before the daemons start is a RayJobError; one the daemons
    do not finish within :data:`STOP_GRACE` seconds is too."""
    job.check()
    ray = _ray()
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    say = log or (lambda message: print(f"tensorwire ray-job: {message}", file=sys.stderr))
    if not ray.is_initialized():
        ray.init()
    started = time.monotonic()
    token = secrets.token_hex(4)
    secret = job.secret or secrets.token_hex(32)
    env = {"OPENBLAS_NUM_THREADS": "1", **job.env, "TENSORWIRE_SECRET": secret}
    checkpoints = job.checkpoint_dir or "{job}/checkpoints"  # filled in on each node
    bundles = [_bundle(job.cpus_per_server, job.gpus_per_server) for _ in range(job.shards)] + [
        _bundle(job.cpus_per_worker, job.gpus_per_worker) for _ in range(job.workers)
    ]
    group = placement_group(bundles, strategy=job.placement.upper(), name=f"tensorwire-{token}")
    actors: dict[str, Any] = {}
    remote = ray.remote(DaemonActor)
    try:
        if not _ready(ray, group.ready(), job.timeout, stop):
            if stop is not None and stop.is_set():
                raise RayJobError("stopped before the job started")
            raise RayJobError(
                f"Ray could not place {len(bundles)} processes ({_describe(bundles)}) within "
                f"{job.timeout:g} s: the cluster lacks the resources"
            )

        def start(name: str, index: int, cpus: float, gpus: float, *args: Any) -> None:
            actors[name] = remote.options(
                name=f"tensorwire-{token}-{name}",
                num_cpus=cpus,
                num_gpus=gpus,
                max_restarts=job.max_restarts,
                max_task_retries=-1,  # a call in flight when the actor died goes to its successor
                max_concurrency=2,  # finish() may come while wait() is in flight
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=index
                ),
            ).remote(name, *args, token)

        for shard in range(job.shards):
            start(
                f"ps{shard}",
                shard,
                job.cpus_per_server,
                job.gpus_per_server,
                "tensorwire.server.daemon",
                _server_flags(job, shard, checkpoints),
                env,
                job.port + shard,
            )
        servers = ray.get([actors[f"ps{s}"].info.remote() for s in range(job.shards)])
        addresses = [s["bind"] for s in servers]
        say(f"job tensorwire-{token}: servers at {', '.join(addresses)}")
        for rank, flags in enumerate(_worker_flags(job, addresses)):
            start(
                f"w{rank}",
                job.shards + rank,
                job.cpus_per_worker,
                job.gpus_per_worker,
                "tensorwire.client.worker",
                flags,
                env,
                0,
            )
        calls = {name: actor.wait.remote() for name, actor in actors.items()}
        servers_of = [actors[f"ps{s}"] for s in range(job.shards)]
        stopper = _Stopper(stop, servers_of, say)

        def trained() -> None:  # every worker ended: the servers linger, or end by themselves
            for actor in servers_of:
                actor.stop.remote()

        summaries = _wait_all(ray, calls, job.timeout, say, stopper, trained)
        wall = time.monotonic() - started
        restarts = _restarts(ray, actors)
        training = _training_seconds(summaries, restarts)
        return RayJobResult(
            servers=[summaries[f"ps{s}"] for s in range(job.shards)],
            workers=[summaries[f"w{r}"] for r in range(job.workers)],
            wall_seconds=wall,
            setup_seconds=max(wall - training, 0.0),
            restarts=restarts,
            stopped=stopper.deadline is not None,  # passed on while daemons still ran
        )
    finally:
        with contextlib.suppress(Exception):  # best effort: the kills below are the guarantee
            ray.get([actor.finish.remote() for actor in actors.values()], timeout=15)
        for actor in actors.values():
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)  # its daemon dies with it
        with contextlib.suppress(Exception):
            remove_placement_group(group)


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}


def _describe(bundles: list[dict[str, float]]) -> str:
    cpus = sum(b.get("CPU", 0) for b in bundles)
    gpus = sum(b.get("GPU", 0) for b in bundles)
    return f"{cpus:g} CPUs" + (f", {gpus:g} GPUs" if gpus else "")


#: how often the launcher's waits look at a stop asked of them, in seconds
STOP_CHECK = 0.5


def _ready(ray: Any, ref: Any, timeout: float, stop: threading.Event | None) -> bool:
    """Whether ``ref`` is ready within ``timeout``; False as soon as ``stop`` is set."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        done, _ = ray.wait([ref], timeout=max(min(left, STOP_CHECK), 0.0))
        if done:
            return True
        if left <= STOP_CHECK or (stop is not None and stop.is_set()):
            return False


class _Stopper:
    """A stop asked of :func:`run_job`: passed on to the servers once, then bounded."""

    def __init__(self, stop: threading.Event | None, servers: list[Any], say: Any) -> None:
        self._stop = stop
        self._servers = servers
        self._say = say
        self.deadline: float | None = None  # once passed on: when the daemons must be done

    def poll(self) -> None:
        if self.deadline is not None or self._stop is None or not self._stop.is_set():
            return
        self._say(
            "stopping: the servers finish their step and checkpoint "
            "(signal again to abandon the job)"
        )
        for server in self._servers:
            server.stop.remote()
        self.deadline = time.monotonic() + STOP_GRACE


def _wait_all(
    ray: Any,
    calls: dict[str, Any],
    timeout: float,
    say: Any,
    stopper: _Stopper,
    trained: Callable[[], None] = lambda: None,
) -> dict[str, dict[str, Any]]:
    """Every daemon's summary; RayJobError at the first that fails for good (the others are
    stopped by the caller), when the job runs past ``timeout``, or when a stop asked of it is
    not done within :data:`STOP_GRACE`. ``trained()`` is called once every worker's (``w<N>``)
    summary is in: the servers, lingering, are to end."""
    from ray.exceptions import RayActorError

    names = {ref: name for name, ref in calls.items()}
    pending = list(calls.values())
    out: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while pending:
        stopper.poll()
        if stopper.deadline is not None and time.monotonic() > stopper.deadline:
            raise RayJobError(
                f"the job did not stop within {STOP_GRACE:g} s of being asked to; still "
                "running: " + ", ".join(names[r] for r in pending)
            )
        left = deadline - time.monotonic()
        if left <= 0:
            raise RayJobError(
                f"the job ran past its timeout of {timeout:g} s; still running: "
                + ", ".join(names[r] for r in pending)
            )
        done, pending = ray.wait(pending, num_returns=1, timeout=min(left, STOP_CHECK))
        for ref in done:
            name = names[ref]
            try:
                summary = ray.get(ref)
            except RayActorError as exc:
                raise RayJobError(
                    f"{name} failed and was not restarted again (its restarts are used up, or "
                    f"its node is gone): {exc}. Its log is above, or in Ray's logs"
                ) from None
            if "failed" in summary:
                raise RayJobError(summary["failed"])
            out[name] = summary
            say(f"{name} done")
            if name.startswith("w") and all(n in out for n in calls if n.startswith("w")):
                trained()
    return out


def _training_seconds(summaries: dict[str, dict[str, Any]], restarts: dict[str, int]) -> float:
    """How long the job trained, as a server Ray never restarted counts it (from the step all
    workers joined at). A restarted daemon counts only from its restart, which would make the
    time before it look like setup: with every server restarted, a worker never restarted
    counts instead (from its own join), and with every daemon restarted, the longest count."""
    for role in ("ps", "w"):
        kept = [
            float(s["seconds"])
            for name, s in summaries.items()
            if name.startswith(role) and name[len(role) :].isdigit() and restarts.get(name) == 0
        ]
        if kept:
            return max(kept)
    return max(float(s["seconds"]) for s in summaries.values())


def _restarts(ray: Any, actors: dict[str, Any]) -> dict[str, int]:
    """How many times Ray started each process again."""
    infos = ray.get([actor.info.remote() for actor in actors.values()])
    return {name: info["restarts"] for name, info in zip(actors, infos, strict=True)}


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def _split_flags(rest: Sequence[str]) -> tuple[list[str], list[str]]:
    """Share the daemons' flags out: each goes to the daemon that has it (both, for flags they
    share, like --transport or --seed). Unknown flags are an error naming them."""
    from .client.worker import build_parser as worker_parser
    from .server.daemon import build_parser as ps_parser

    known = [ps_parser()._option_string_actions, worker_parser()._option_string_actions]
    ps: list[str] = []
    worker: list[str] = []
    tokens = list(rest)
    while tokens:
        token = tokens.pop(0)
        flag, has_value, _ = token.partition("=")
        actions = [k.get(flag) for k in known]
        if not token.startswith("--") or not any(actions):
            raise ValueError(
                f"unknown flag {token!r}: neither tensorwire-ps nor tensorwire-worker has it"
            )
        takes = next(a for a in actions if a is not None).nargs != 0
        words = [token]
        if takes and not has_value:
            if not tokens:
                raise ValueError(f"{flag} needs a value")
            words.append(tokens.pop(0))
        if actions[0] is not None:
            ps += words
        if actions[1] is not None:
            worker += words
    return ps, worker


def build_parser() -> argparse.ArgumentParser:
    from .job.argtypes import add_version
    from .job.config import amount, at_least, path, positive_seconds
    from .job.files import output_file

    parser = argparse.ArgumentParser(
        prog="tensorwire ray-job",
        description="Run a parameter-server job on a Ray cluster: server shards and workers as "
        "Ray actors, placed by Ray, restarted by Ray when they fail, talking over tensorwire "
        "(shared memory within a node, TCP or NIXL across nodes). Every other flag is a "
        "daemon flag (tensorwire-ps --help, tensorwire-worker --help), handed to the daemons "
        "that have it, e.g. --steps 300 --model digits --transport auto.",
        epilog="The launcher sets --bind, --shard(s), --rank, --workers, --servers, "
        "--checkpoint-dir, --resume-if-present and --metrics for each daemon.",
    )
    add_version(parser)
    parser.add_argument(
        "--address",
        default=None,
        help="the Ray cluster (host:port of its head, or ray://...; default: RAY_ADDRESS, "
        "else a local cluster started for the job)",
    )
    parser.add_argument("--shards", type=at_least(1), default=1, help="server shards (default 1)")
    parser.add_argument("--workers", type=at_least(1), default=1, help="workers (default 1)")
    parser.add_argument("--cpus-per-server", type=amount, default=1.0, help="default 1")
    parser.add_argument("--cpus-per-worker", type=amount, default=1.0, help="default 1")
    parser.add_argument("--gpus-per-server", type=amount, default=0.0, help="default 0")
    parser.add_argument(
        "--gpus-per-worker",
        type=amount,
        default=0.0,
        help="default 0; with GPUs, add --device cuda to train on them",
    )
    parser.add_argument(
        "--placement",
        choices=["spread", "pack"],
        default="spread",
        help="spread the processes over the nodes (default) or pack them onto few",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=5700,
        help="shard k listens on PORT+k on its node (default 5700)",
    )
    parser.add_argument(
        "--max-restarts",
        type=at_least(0),
        default=3,
        help="how often Ray may start a failed daemon again (default 3)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=path,
        default=None,
        help="where servers checkpoint (--checkpoint-every sets how often, default 500 steps "
        "here); shared storage lets a shard resume on another node (default: a directory on "
        "each server's node, removed at the end)",
    )
    parser.add_argument(
        "--secret-file",
        type=path,
        default=None,
        metavar="PATH",
        help="the job's shared secret (or TENSORWIRE_SECRET; default: one made for the job)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=3600.0,
        help="seconds for the whole job (default 3600)",
    )
    parser.add_argument(
        "--metrics",
        default=None,
        metavar="PATH",
        type=output_file,
        help="write the summary here",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    from .job import config  # the daemons' own reading of secrets and writing of summaries

    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        ps_args, worker_args = _split_flags(rest)
    except ValueError as exc:
        parser.error(str(exc))
    secret = os.environ.get("TENSORWIRE_SECRET")
    if args.secret_file:
        secret = config.read_secret_file(
            parser, args.secret_file, also=(secret, "TENSORWIRE_SECRET")
        )
    job = RayJob(
        shards=args.shards,
        workers=args.workers,
        ps_args=ps_args,
        worker_args=worker_args,
        cpus_per_server=args.cpus_per_server,
        cpus_per_worker=args.cpus_per_worker,
        gpus_per_server=args.gpus_per_server,
        gpus_per_worker=args.gpus_per_worker,
        placement=args.placement,
        port=args.port,
        max_restarts=args.max_restarts,
        checkpoint_dir=args.checkpoint_dir,
        secret=secret or None,
        timeout=args.timeout,
    )
    try:
        job.check()
    except ValueError as exc:
        parser.error(str(exc))
    try:
        ray = _ray()
    except MissingDependencyError as exc:
        print(f"tensorwire ray-job: error: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    with _signals_stop(stop) as watch:
        try:
            ray.init(address=args.address, log_to_driver=True)
            watch()  # again: ray.init puts a SIGTERM handler of its own in place of the first
            result = run_job(job, stop=stop)
        except (RayJobError, ValueError, ConnectionError) as exc:
            print(f"tensorwire ray-job: error: {exc}", file=sys.stderr)
            return 1
        finally:
            if ray.is_initialized():
                ray.shutdown()
    summary = {
        "wall_seconds": result.wall_seconds,
        "setup_seconds": result.setup_seconds,
        "restarts": result.restarts,
        "stopped": result.stopped,
        "servers": result.servers,
        "workers": result.workers,
    }
    print(
        f"tensorwire ray-job: {'stopped' if result.stopped else 'done'} at step "
        f"{result.servers[0].get('steps')} in {result.wall_seconds:.1f} s "
        f"({result.setup_seconds:.1f} s to the first step); {_accuracy_said(result)}",
        file=sys.stderr,
    )
    return config.write_summary(args.metrics, summary, "tensorwire ray-job")


def _accuracy_said(result: RayJobResult) -> str:
    """Worker 0's test accuracy, for the launcher's last line. A worker 0 that Ray started
    again after the job ended trained nothing and has none (``job_done_at``): the accuracy it
    last sent the servers is said instead."""
    first = result.workers[0]
    if first.get("test_accuracy") is None and "job_done_at" in first:
        return (
            "worker 0 was started again after the job ended (the test accuracy it last sent "
            f"the servers: {result.servers[0].get('accuracy')})"
        )
    return f"worker 0's test accuracy {first.get('test_accuracy')}"


@contextlib.contextmanager
def _signals_stop(stop: threading.Event) -> Iterator[Callable[[], None]]:
    """The first SIGTERM or Ctrl-C sets ``stop`` (run_job ends the job as the servers' own
    SIGTERM does, and the summary is written); a second abandons the job through run_job's
    cleanup, as a KeyboardInterrupt. Yields a call that puts the handlers back in place after
    a library replaced them."""

    def handle(*_: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    def watch() -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, handle)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    watch()
    try:
        yield watch
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["DaemonActor", "RayJob", "RayJobError", "RayJobResult", "main", "run_job"]
