"""Parameter-server jobs for the tests: real daemons as subprocesses on loopback.

:class:`Processes` starts daemons with a log file each and always reaps them (the job harness
below, and the tests that run docker/compose.yaml's and deploy/k8s's commands); :func:`log_has`
waits for a line in a daemon's log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from tensorwire.bench.common import UNSHARE
from tensorwire.client import models
from tensorwire.client.launch import ps_command, worker_command
from tensorwire.server import optim

from .conftest import free_port

PY = sys.executable


def log_has(path: Path, text: str, timeout: float, count: int = 1) -> float:
    """Wait until ``text`` is ``count`` times in the file at ``path``; seconds it took."""
    start = time.monotonic()
    while path.read_text(errors="replace").count(text) < count:
        assert time.monotonic() - start < timeout, f"{text!r} not in:\n{path.read_text()}"
        time.sleep(0.05)
    return time.monotonic() - start


class Processes:
    """Daemons started as subprocesses, each logging to ``tmp/NAME.log``; :meth:`kill` reaps
    every one still running."""

    def __init__(self, tmp: Path, env: dict[str, str] | None = None, *, hosts: str = "one") -> None:
        self.tmp = tmp
        self.env = {**os.environ, **(env or {})}
        self.procs: list[subprocess.Popen[str]] = []
        #: "separate": each daemon in a pid and mount namespace of its own, as on a machine of
        #: its own (conftest.in_pid_namespace); signal it at conftest.namespaced_pid
        self.prefix = UNSHARE if hosts == "separate" else []

    def start(
        self, cmd: list[str], *, log: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """Start ``cmd`` with stdout and stderr in ``log``.log and ``env`` over the base one."""
        out = open(self.tmp / f"{log}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [*self.prefix, *cmd],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env={**self.env, **(env or {})},
        )
        out.close()
        self.procs.append(proc)
        return proc

    def wait(self, timeout: float = 120) -> list[int]:
        """Every process's exit code, in start order, all within ``timeout``."""
        deadline = time.monotonic() + timeout
        return [p.wait(max(deadline - time.monotonic(), 0.1)) for p in self.procs]

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


class Job(Processes):
    """One parameter-server job: S server daemons and N worker daemons, always reaped."""

    def __init__(
        self,
        tmp: Path,
        *,
        servers: int = 1,
        workers: int = 2,
        ps: list[str] | None = None,
        worker: list[str] | None = None,
        start_workers: int | None = None,
        env: dict[str, str] | None = None,
        hosts: str = "one",
        each_worker: dict[int, list[str]] | None = None,
    ) -> None:
        """``each_worker``: more flags for one rank's worker, after ``worker``."""
        super().__init__(tmp, env, hosts=hosts)
        self.addresses = [f"tcp://127.0.0.1:{free_port()}" for _ in range(servers)]
        self.ps = [
            self.start(
                ps_command(
                    addr,
                    "--no-progress",
                    "--metrics",
                    str(tmp / f"ps{s}.json"),
                    *(ps or []),
                    shard=s,
                    shards=servers,
                    workers=workers,
                ),
                log=f"ps{s}",
            )
            for s, addr in enumerate(self.addresses)
        ]
        self.workers = [
            self.start(
                worker_command(
                    self.addresses,
                    "--no-progress",
                    "--metrics",
                    str(tmp / f"w{r}.json"),
                    "--save-params",
                    str(tmp / f"w{r}.npz"),
                    *(worker or []),
                    *(each_worker or {}).get(r, []),
                    rank=r,
                    workers=workers,
                ),
                log=f"w{r}",
            )
            for r in range(workers if start_workers is None else start_workers)
        ]

    def restart_worker(self, rank: int, *extra: str) -> subprocess.Popen[str]:
        """Start worker ``rank`` again (a new process, a new receiver, the same rank)."""
        args = next(p.args for p in self.workers if f"--rank {rank} " in " ".join(p.args) + " ")
        proc = self.start([*self.command(args), *extra], log=f"w{rank}-again")
        self.workers.append(proc)
        return proc

    def command(self, args: Any) -> list[str]:
        """The daemon's own command line, of a process :meth:`start` started."""
        return list(args)[len(self.prefix) :]

    def metrics(self, name: str) -> dict[str, Any]:
        return json.loads((self.tmp / f"{name}.json").read_text())

    def params(self, rank: int = 0) -> dict[str, np.ndarray[Any, Any]]:
        with np.load(self.tmp / f"w{rank}.npz") as data:
            return {k: data[k] for k in data.files}


def ok(j: Job, timeout: float = 120) -> None:
    codes = j.wait(timeout)
    assert codes == [0] * len(codes), "\n".join(j.log(p) for p in ["ps0", "w0"])


def cli(
    *args: str, env: dict[str, str | None] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python ARGS``, with ``env`` over this process's environment (None: a variable unset),
    within ``timeout`` seconds."""
    merged = {**os.environ, **(env or {})}
    return subprocess.run(
        [PY, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in merged.items() if v is not None},
        check=False,
    )


def bench_job(tmp: Path, *args: str, timeout: float) -> tuple[str, dict[str, Any]]:
    """Run ``python -m tensorwire.bench ARGS`` (a whole-job command: ``soak``, ``chaos``), which
    must exit 0, with ``--json``; its output, and the JSON it wrote."""
    path = tmp / "bench.json"
    out = subprocess.run(
        [PY, "-m", "tensorwire.bench", *args, "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout, json.loads(path.read_text())


def digits_reference(steps: int, workers: int, batch: int, opt: optim.Optimizer) -> dict[str, Any]:
    """What a BSP job of the digits model computes: one process training on the union of the
    workers' batches, with the optimizer code the servers run."""
    spec = models.model("digits")
    data = models.load("digits")
    params = spec.init(0)
    for step in range(steps):
        xs, ys = zip(
            *(models.batch_at(data, r, workers, batch, step) for r in range(workers)), strict=True
        )
        _, grads, _ = models.loss_and_grads(spec, params, np.concatenate(xs), np.concatenate(ys))
        for name in params:
            opt.step(name, params[name], grads[name])
    return params


def digits_bsp_job(
    job: Any,
    *,
    servers: int,
    optimizer: str,
    lr: float,
    steps: int,
    ps: list[str],
    worker: list[str],
    each_worker: dict[int, list[str]] | None = None,
) -> Job:
    """A BSP job of the digits model (two workers, batch 32, weights split at 8 KiB) that
    :func:`digits_reference` computes in one process; ``ps`` and ``worker`` (``each_worker``,
    by rank): more flags."""
    return job(  # type: ignore[no-any-return]
        servers=servers,
        each_worker=each_worker,
        ps=[
            "--steps",
            str(steps),
            "--optimizer",
            optimizer,
            "--lr",
            str(lr),
            "--split-bytes",
            "8192",
            *ps,
        ],
        worker=worker,
    )


def assert_params_close(got: dict[str, Any], want: dict[str, Any], bound: float) -> None:
    """Each of ``want``'s parameters is in ``got`` within ``bound`` relative error."""
    for name, value in want.items():
        err = np.linalg.norm(got[name] - value) / max(float(np.linalg.norm(value)), 1e-12)
        assert err < bound, f"{name}: relative error {err:.2e}"
