"""`tensorwire ray-job` on a real Ray cluster of two nodes: a head and a worker node started with
`ray start` on this machine, each in a network namespace of its own, so that traffic between
the nodes goes over TCP on a veth link. The cluster, its processes and the namespaces are removed
at the end, even when a test fails."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tensorwire.client.launch import run_job

from .jobs import log_has
from .netns import kill_everything_in, namespaces

pytest.importorskip("ray", reason="Ray is not installed (`make test` installs tensorwire[ray])")
# One process of the suite runs them all (`make test`: --dist loadgroup): one cluster, not one
# per process, and no job of another test's in /tmp while a test looks for what a job left.
pytestmark = pytest.mark.xdist_group("ray")

NET = "10.232.0"  # addresses inside this module's own namespaces only
HEAD = f"{NET}.1"
GCS_PORT = 6379
RAY = str(Path(sys.executable).with_name("ray"))
#: This test's cluster lives in namespaces of its own: no token authentication, whatever a token
#: left in ~/.ray by an earlier local Ray would otherwise turn on (with it, the head's GCS was
#: unreachable from inside the namespace here).
#: RAY_DEDUP_LOGS=0: the driver prints every daemon's line, not a digest of similar ones, so the
#: tests can follow a job's checkpoints in its log
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_DEDUP_LOGS": "0"}


def _in(ns: str, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *cmd]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Two Ray nodes, 2 CPUs each: the head in namespace ``head``, a worker node in ``node``."""
    tag = f"tr{os.getpid() % 100000}"
    logs = tmp_path_factory.mktemp("ray")
    # Ray keeps its sockets under its temp dir: a short path (a Unix socket's is limited)
    temp = f"/tmp/{tag}"
    with namespaces(tag, ["head", "node"], [("head", f"{HEAD}/24", "node", f"{NET}.2/24")]) as ns:
        common = [
            "--block",
            "--num-cpus",
            "2",
            "--object-store-memory",
            str(100 << 20),
            "--disable-usage-stats",
        ]
        starts = []
        try:
            for name, args in (
                (
                    "head",
                    [
                        "--head",
                        "--node-ip-address",
                        HEAD,
                        "--port",
                        str(GCS_PORT),
                        "--include-dashboard=false",
                        f"--temp-dir={temp}",
                    ],
                ),
                ("node", ["--address", f"{HEAD}:{GCS_PORT}", "--node-ip-address", f"{NET}.2"]),
            ):
                out = open(logs / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
                starts.append(
                    subprocess.Popen(
                        _in(ns[name], RAY, "start", *args, *common),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        env=ENV,
                    )
                )
                out.close()
                _until_nodes(ns["head"], 1 if name == "head" else 2, logs / f"{name}.log")
            yield {**ns, "address": f"{HEAD}:{GCS_PORT}"}
        finally:
            for name in ("node", "head"):  # every Ray process of a node lives in its namespace
                kill_everything_in(ns[name])
            for p in starts:
                p.wait(10)
            shutil.rmtree(temp, ignore_errors=True)


def _until_nodes(ns: str, count: int, log: Path, timeout: float = 90.0) -> None:
    """Wait (bounded) until the cluster has ``count`` live nodes."""
    probe = (
        f"import ray; ray.init(address='{HEAD}:{GCS_PORT}', log_to_driver=False); "
        "print(sum(n['Alive'] for n in ray.nodes()))"
    )
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(
            _in(ns, sys.executable, "-c", probe),
            capture_output=True,
            text=True,
            timeout=60,
            env=ENV,
        )
        if done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        assert time.monotonic() < deadline, (
            f"{count} Ray nodes not up ({done.stderr[-500:]}):\n{log.read_text()}"
        )
        time.sleep(1.0)


def _ray_job(
    cluster: dict[str, str], tmp: Path, *flags: str, log: str = "job"
) -> tuple[subprocess.Popen[str], Path, Path]:
    """Start `tensorwire ray-job` as a driver on the head node; its log and summary paths."""
    summary, out_path = tmp / f"{log}.json", tmp / f"{log}.log"
    out = open(out_path, "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        _in(
            cluster["head"],
            sys.executable,
            "-m",
            "tensorwire",
            "ray-job",
            "--address",
            cluster["address"],
            "--metrics",
            str(summary),
            *flags,
        ),
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
    )
    out.close()
    return proc, out_path, summary


def _finish(proc: subprocess.Popen[str], log: Path, timeout: float) -> None:
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(
            f"ray-job still running after {timeout} s:\n{log.read_text()}"
        ) from None
    assert code == 0, log.read_text()


def test_a_job_spread_over_two_nodes_trains_as_well_as_by_hand(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """One server and two workers spread over the two nodes by Ray: daemons on one node talk
    over shared memory, across nodes over TCP, and the model reaches the accuracy of the same
    job started by hand on this machine."""
    began = time.time()
    proc, log, out = _ray_job(
        cluster, tmp_path, "--workers", "2", "--steps", "300", "--no-progress"
    )
    try:
        by_hand = run_job(transport="auto", steps=300, workers=2)  # while Ray sets its job up
    finally:
        _finish(proc, log, 240)
    summary: dict[str, Any] = json.loads(out.read_text())
    server = summary["servers"][0]
    hosts = {server["host"], *(w["host"] for w in summary["workers"])}
    assert hosts == {HEAD, f"{NET}.2"}, "spread placement uses both nodes"
    for w in summary["workers"]:
        used = set(w["traffic"]["sent_bytes_by_transport"])
        assert used == ({"shm"} if w["host"] == server["host"] else {"tcp"}), w
        assert w["steps"] == 300
    assert server["steps"] == 300
    accuracy = summary["workers"][0]["test_accuracy"]
    assert accuracy >= by_hand.accuracy - 0.02, (accuracy, by_hand.accuracy)
    assert summary["restarts"] == {"ps0": 0, "w0": 0, "w1": 0}
    assert 0 < summary["setup_seconds"] < summary["wall_seconds"]
    left = [p for p in Path("/tmp").glob("tensorwire-ray-*") if p.stat().st_mtime >= began]
    assert not left, "each node's job directory is removed at the end"


#: A driver that connects once and then kills the actors named on its stdin, one per line:
#: connecting (importing Ray, joining the cluster) takes seconds under load, and a job can end in
#: that time, before the kill that the test is about.
ACTOR_KILLER = """
import os, ray, signal, sys
ray.init(address=sys.argv[1], log_to_driver=False)
print("ready", flush=True)
for line in sys.stdin:
    what, name = line.split()
    found = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"] == name]
    if len(found) != 1:
        print(f"error: actors named {name!r}: {found}", flush=True)
        continue
    actor = ray.get_actor(name, namespace=found[0]["namespace"])
    if what == "freeze":  # its daemon (SIGSTOP; one host: the nodes share the pid namespace)
        os.kill(ray.get(actor.info.remote(), timeout=60)["daemon_pid"], signal.SIGSTOP)
        print(f"froze {name}", flush=True)
        continue
    ray.kill(actor, no_restart=False)
    print(f"killed {name}", flush=True)
"""


class ActorKiller:
    """ray.kill actors by name, letting Ray restart them (as a crash of their process would),
    through one driver connected in advance (:data:`ACTOR_KILLER`)."""

    def __init__(self, cluster: dict[str, str]) -> None:
        self._proc = subprocess.Popen(
            _in(cluster["head"], sys.executable, "-c", ACTOR_KILLER, cluster["address"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=ENV,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            self._expect("ready", 90)
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put("(ended)")

    def _expect(self, reply: str, timeout: float) -> None:
        """Skip the driver's own log lines until ``reply``; bounded."""
        deadline = time.monotonic() + timeout
        seen: list[str] = []
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no {reply!r} from the actor killer: {seen}") from None
            if line == reply:
                return
            seen.append(line)
            assert line != "(ended)" and not line.startswith("error"), seen

    def kill(self, name: str) -> None:
        self._ask("kill", name, f"killed {name}")

    def freeze(self, name: str) -> None:
        """SIGSTOP the daemon of actor ``name`` (its actor runs on)."""
        self._ask("freeze", name, f"froze {name}")

    def _ask(self, what: str, name: str, reply: str) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(f"{what} {name}\n")
        self._proc.stdin.flush()
        self._expect(reply, 60)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait(10)
        self._reader.join(10)  # it reads to the end of the output, then the pipe may close
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                pipe.close()


def _reap(killer: ActorKiller, proc: subprocess.Popen[str]) -> None:
    """At a test's end: the actor killer's driver closed, the launcher killed if it runs."""
    killer.close()
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _checkpointed_past(log: Path, step: int, timeout: float) -> None:
    """Wait until the job's log has a server checkpoint at ``step`` or later; bounded."""
    deadline = time.monotonic() + timeout
    while True:
        found = [int(s) for s in re.findall(r"checkpoint at step (\d+)", log.read_text())]
        if found and max(found) >= step:
            return
        assert time.monotonic() < deadline, f"no checkpoint at {step}:\n{log.read_text()}"
        time.sleep(0.1)


@pytest.mark.timeout(360)  # above its own bounded waits, which fail with the job's log
def test_killed_worker_and_server_actors_are_restarted_by_ray_and_the_job_goes_on(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """Kill worker 1's actor mid-training (ray.kill, restart allowed): Ray starts it again in
    its placement bundle and its daemon rejoins the server at the current step. Then kill the
    server's actor: Ray starts it again on its node, at its address, it resumes from its last
    checkpoint and both workers reconnect. The job trains on past two more checkpoints, and a
    SIGTERM to the launcher stops it as the server's own does: the summary has every process,
    its restarts and the accuracy bar reached. (The job has no step limit that would have to
    outlast both restarts on a loaded machine: the SIGTERM ends it.)"""
    killer = ActorKiller(cluster)
    proc, log, out = _ray_job(
        cluster,
        tmp_path,
        "--workers",
        "2",
        "--steps",
        "1000000",
        "--checkpoint-every",
        "500",
        "--no-progress",
        "--log-level",
        "INFO",
    )
    try:
        # the server took both workers in: each by name, as Ray prints a line twice (with and
        # without the node's address), and a count of two was met by worker 0's line alone, so
        # that worker 1 was killed before it had joined (its replacement then joined, not
        # rejoined: a suite run on a slow day, 2026-12-02)
        for rank in (0, 1):
            log_has(log, f"worker {rank} joined from", 120)
        time.sleep(1.0)
        job = log.read_text().split("ray-job: job ")[1].split(":")[0]  # its actors' prefix
        killer.kill(f"{job}-w1")
        log_has(log, "worker 1 rejoined", 120)
        log_has(log, "checkpoint at step", 120)
        killer.kill(f"{job}-ps0")
        log_has(log, "resumed shard 0 from", 120)
        text = log.read_text()
        resumed_at = int(text.split("resumed shard 0 from ")[1].split(" at step ")[1].split()[0])
        _checkpointed_past(log, resumed_at + 1000, 120)  # both workers are back and training
        proc.send_signal(signal.SIGTERM)
        _finish(proc, log, 120)
    finally:
        _reap(killer, proc)
    summary: dict[str, Any] = json.loads(out.read_text())
    text = log.read_text()
    assert "worker 1 lost at step" in text
    assert "ray-job: stopping: the servers finish their step" in text
    assert summary["stopped"] is True
    assert summary["restarts"] == {"ps0": 1, "w0": 0, "w1": 1}
    steps = summary["servers"][0]["steps"]
    assert steps >= resumed_at + 1000
    assert summary["workers"][0]["steps"] >= steps  # it also redid the steps after the checkpoint
    assert summary["workers"][1]["steps"] < steps  # the second worker 1 joined mid-job
    assert summary["workers"][0]["test_accuracy"] >= 0.95
    # The server restarted: its count starts at its resume, so setup is what worker 0 (never
    # restarted) did not spend training, not everything before the server's restart.
    setup = summary["wall_seconds"] - summary["workers"][0]["seconds"]
    assert summary["setup_seconds"] == pytest.approx(max(setup, 0.0))


def test_bad_flags_are_refused_before_anything_starts(tmp_path: Path) -> None:
    """Flags neither daemon has, or that the launcher sets itself, are one clear line each."""
    for flags, says in (
        (["--stepz", "3"], "unknown flag '--stepz'"),
        (["--bind", "tcp://0.0.0.0:1"], "--bind is set by the launcher"),
        (["--steps"], "--steps needs a value"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "tensorwire", "ray-job", *flags],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert says in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cpus_per_worker", float("nan")),
        ("gpus_per_server", -1.0),
        ("timeout", 0.0),
        ("timeout", float("inf")),
        ("shards", 1.5),
        ("max_restarts", -1),
    ],
)
def test_a_job_with_an_impossible_amount_is_refused_before_ray_starts(
    field: str, value: float
) -> None:
    """Before, Ray was started first, then failed to place a negative or NaN amount of CPUs
    (or waited for the cluster to answer for a minute), and a NaN --timeout said "cannot
    convert float NaN to integer"."""
    from tensorwire.ray import RayJob

    with pytest.raises(ValueError, match=field):
        RayJob(**{field: value}).check()


#: the job of the test below: long enough that worker 1 is frozen well before its end
STEPS = 3000


@pytest.mark.timeout(360)  # above its own bounded waits, which fail with the job's log
def test_a_worker_ray_starts_again_after_the_job_ended_ends_it_cleanly(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """Worker 1's daemon is frozen, the server goes on without it and ends the job; then its
    actor is killed and Ray starts it again. The new worker reaches the server, which lingers
    once its job is done (`ray-job` starts servers with --linger forever), hears that the job
    ended and exits 0 with a summary of nothing trained; the launcher, every worker ended,
    stops the servers, and the job is done. Before, the restarted worker found nobody at the
    server's address, waited its --connect-timeout and failed, and again at each restart until
    they ran out: the job was called failed although it had trained to its end."""
    killer = ActorKiller(cluster)
    proc, log, out = _ray_job(
        cluster,
        tmp_path,
        *("--workers", "2", "--steps", str(STEPS), "--checkpoint-every", "100"),
        # The frozen worker is dropped as its heartbeats stop: a --step-timeout as short (a
        # flag of both daemons) ended worker 0 too, waiting as long for that step's parameters
        *("--heartbeat-timeout", "2", "--connect-timeout", "10"),
        *("--no-progress", "--log-level", "INFO"),
    )
    try:
        log_has(log, "checkpoint at step 100", 120)  # both workers are training
        job = log.read_text().split("ray-job: job ")[1].split(":")[0]  # its actors' prefix
        killer.freeze(f"{job}-w1")
        log_has(log, "worker 1 lost at step", 120)
        log_has(log, f"ps0: done at step {STEPS}", 120)
        log_has(log, "w0 done", 60)
        killer.kill(f"{job}-w1")
        _finish(proc, log, 120)
    finally:
        _reap(killer, proc)
    summary: dict[str, Any] = json.loads(out.read_text())
    text = log.read_text()
    assert f"had ended the job at step {STEPS} when this worker reached it" in text, text
    assert summary["stopped"] is False
    assert summary["restarts"] == {"ps0": 0, "w0": 0, "w1": 1}, text
    assert summary["servers"][0]["steps"] == STEPS
    first = summary["workers"][0]
    assert first["steps"] == STEPS and first["test_accuracy"] >= 0.9
    again = summary["workers"][1]
    assert again["steps"] == 0 and again["job_done_at"] == STEPS and again["test_accuracy"] is None


def test_the_launchers_last_line_says_the_accuracy_of_a_worker_0_started_after_the_end() -> None:
    """A worker 0 that Ray started again after the job ended trained nothing (its summary has
    no accuracy, and says where the job ended): the line says so, with the accuracy it last
    sent the servers, rather than "worker 0's test accuracy None"."""
    from tensorwire.ray import RayJobResult, _accuracy_said

    def result(worker0: dict[str, Any]) -> RayJobResult:
        return RayJobResult(
            servers=[{"steps": 400, "accuracy": 0.97}],
            workers=[worker0],
            wall_seconds=10.0,
            setup_seconds=1.0,
            restarts={},
            stopped=False,
        )

    assert _accuracy_said(result({"test_accuracy": 0.98})) == "worker 0's test accuracy 0.98"
    late = result({"steps": 0, "test_accuracy": None, "job_done_at": 400})
    assert _accuracy_said(late) == (
        "worker 0 was started again after the job ended (the test accuracy it last sent the "
        "servers: 0.97)"
    )
