"""The ``ddp`` row of ``tensorwire bench ps --ddp``: what a PyTorch user runs instead of a
parameter server, the same model trained by PyTorch's ``DistributedDataParallel`` over the gloo
backend (an all-reduce of the gradients in buckets, overlapped with the backward pass).

The workers are as many processes as the parameter-server jobs' workers, each building the model
with the same factory, batch and seed, and stepping a torch optimizer of the servers' choice
(``--optimizer``, ``--lr``, ``--momentum``, ``--weight-decay`` in ``--ps-args``: SGD, SGD with
momentum, Adam or AdamW, as the servers compute them) on the mean gradient DDP gives every
worker: what a ``bsp`` job computes. Steps per second are counted as a parameter server counts
them, from the moment every worker is ready (the process group formed, DDP's first broadcast of
the parameters done) to the end of the last step at the slowest worker; the seconds to form are
from the start of the processes. Each takes the threads ``tensorwire-worker --threads auto``
would give it (the usable cores divided among the workers). The rendezvous store is this
process's.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

#: the store's and the collective operations' bound, and how long the rows' processes may take
TIMEOUT = datetime.timedelta(seconds=300)


@dataclass(frozen=True)
class DdpJob:
    """What every worker of the DDP job builds and runs."""

    model: str
    framework: str
    workers: int
    batch: int
    steps: int
    optimizer: str
    lr: float
    weight_decay: float
    #: of ``momentum`` (the servers' --momentum)
    momentum: float = 0.9
    #: rank 0 reports its parameters at the end (``params``, by name): for the tests
    keep_params: bool = False


def optimizer_of(ps_args: list[str]) -> tuple[str, float, float, float]:
    """The servers' optimizer, learning rate, weight decay and momentum as ``ps_args`` (and
    the environment's ``TENSORWIRE_*``) give them to the servers: read by their own parser."""
    from tensorwire.server import daemon, optim

    known, _ = daemon.build_parser().parse_known_args(ps_args)
    lr = known.lr if known.lr is not None else optim.default_lr(known.optimizer)
    return known.optimizer, lr, known.weight_decay, known.momentum


def _torch_optimizer(job: DdpJob, params: Any) -> Any:
    import torch

    if job.optimizer in ("sgd", "momentum"):
        momentum = job.momentum if job.optimizer == "momentum" else 0.0
        return torch.optim.SGD(params, lr=job.lr, momentum=momentum, weight_decay=job.weight_decay)
    kind = torch.optim.AdamW if job.optimizer == "adamw" else torch.optim.Adam
    return kind(params, lr=job.lr, weight_decay=job.weight_decay)


def _worker(rank: int, job: DdpJob, host: str, port: int, results: Connection) -> None:
    """One DDP worker: its report (or its failure, in one line) goes to ``results``."""
    try:
        results.send(_train(rank, job, host, port))
    except BaseException as exc:
        results.send({"rank": rank, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
    finally:
        results.close()


def _reports(readers: list[Connection], deadline: float) -> list[dict[str, Any]]:
    """Every worker's report, by ``deadline`` (monotonic); RuntimeError names the first that
    failed, or says which did not report."""
    reports: dict[int, dict[str, Any]] = {}
    waiting = list(readers)
    while waiting:
        ready = wait(waiting, timeout=max(deadline - time.monotonic(), 0))
        if not ready:
            raise RuntimeError(
                f"{len(waiting)} DDP worker(s) did not finish within {TIMEOUT.total_seconds():g} s"
            )
        for reader in ready:
            assert isinstance(reader, Connection)
            waiting.remove(reader)
            try:
                report = reader.recv()
            except EOFError:  # it died before it could say why (killed, out of memory)
                rank = readers.index(reader)
                raise RuntimeError(f"DDP worker {rank} exited without a report") from None
            if "error" in report:
                raise RuntimeError(f"DDP worker {report['rank']} failed: {report['error']}")
            reports[report["rank"]] = report
    return [reports[rank] for rank in sorted(reports)]


def _train(rank: int, job: DdpJob, host: str, port: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from tensorwire.client import tasks, threads

    # what tensorwire-worker --threads auto gives each of as many workers on this host
    count, _ = threads.choose("auto", {**os.environ, "LOCAL_WORLD_SIZE": str(job.workers)})
    if count is not None:
        torch.set_num_threads(count)
    factory = tasks.load_factory(job.model, job.framework)
    task = tasks.as_task(
        tasks.build(factory, job.model, tasks.JobInfo(rank, job.workers, job.batch, 0))
    )
    loss_at = getattr(task, "loss_at", None)
    if loss_at is None:
        raise ValueError(f"model {job.model!r} is not a PyTorch module")
    store = dist.TCPStore(host, port, job.workers + 1, False, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=job.workers, timeout=TIMEOUT)
    try:
        model = DistributedDataParallel(task.module)
        optimizer = _torch_optimizer(job, model.parameters())
        dist.barrier()
        ready = time.monotonic()
        loss = None
        for step in range(job.steps):
            optimizer.zero_grad(set_to_none=True)
            _, _, loss = loss_at(step, model)
            loss.backward()
            optimizer.step()
        dist.barrier()
        done = time.monotonic()
        return {
            "rank": rank,
            "threads": torch.get_num_threads(),
            "ready": ready,  # (the machine's monotonic clock, which every process shares)
            "seconds": done - ready,
            "final_loss": float(loss.detach()) if loss is not None else None,
            "accuracy": task.evaluate() if rank == 0 else None,
            "params": {
                name: p.detach().cpu().numpy().copy() for name, p in model.module.named_parameters()
            }
            if rank == 0 and job.keep_params
            else None,
        }
    finally:
        dist.destroy_process_group()


def run(job: DdpJob) -> dict[str, Any]:
    """Train ``job`` with DDP over gloo: its steps/s, the seconds it took to form, rank 0's
    final loss, test accuracy and (``keep_params``) parameters. RuntimeError names the first
    worker that failed."""
    import torch.distributed as dist

    host = "127.0.0.1"
    store = dist.TCPStore(host, 0, job.workers + 1, True, timeout=TIMEOUT, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    started = time.monotonic()
    procs, readers = [], []
    reports: list[dict[str, Any]] = []
    try:
        for rank in range(job.workers):
            reader, writer = ctx.Pipe(duplex=False)
            readers.append(reader)
            proc = ctx.Process(
                target=_worker,
                args=(rank, job, host, store.port, writer),
                name=f"tensorwire-bench-ddp-{rank}",
                daemon=True,
            )
            procs.append(proc)
            proc.start()
            writer.close()  # the worker's end: ours would keep its reader from seeing it exit
        reports = _reports(readers, started + TIMEOUT.total_seconds())
    finally:
        for proc in procs:
            # the others of a worker that failed wait in a collective for it: not for them
            proc.join(10 if reports else 0)
            if proc.is_alive():
                proc.kill()
                proc.join(10)
        for reader in readers:
            reader.close()
        del store  # after every worker left it
    slowest = max(r["seconds"] for r in reports)
    first = next(r for r in reports if r["rank"] == 0)
    return {
        "steps_per_s": job.steps / slowest if slowest else 0.0,
        "formed_s": max(r["ready"] for r in reports) - started,
        "final_loss": first["final_loss"],
        "accuracy": first["accuracy"],
        "params": first["params"],
        "threads": first["threads"],
    }
