"""PyTorch models whose gradients are not one dense tensor per parameter at every step, as
``tensorwire-worker --model tests.torch_grads_model:make`` imports them.

``make``: a linear ``trunk`` every step uses, an ``extra`` layer added to it at some steps by
some workers (a branch taken by the data, as a mixture-of-experts' expert or a multi-task
model's head is), and a ``spare`` layer no step uses (``grad`` None). ``sparse``: an
``nn.Embedding(sparse=True)`` of the pixels' intensities (a sparse gradient: the rows looked
up). ``tied``: two layers sharing one weight. ``lazy``: ``nn.LazyLinear`` layers, whose
parameters have no shape until a first forward pass. :func:`reference` trains the first three
in one process, as a BSP job of its workers should."""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn

from tensorwire.client import models
from tensorwire.client.tasks import JobInfo


class Branched(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(64, 10)
        self.extra = nn.Linear(64, 10)
        self.spare = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor, use_extra: torch.Tensor) -> torch.Tensor:
        out = self.trunk(x)
        if bool(use_extra):
            out = out + self.extra(x)
        return out


def schedule_factor(kind: str, steps: int, warmup: int) -> Any:
    """The rate's factor at each step of ``--lr-schedule kind --warmup-steps warmup`` over a
    job of ``steps``, as Hugging Face transformers' ``get_{linear,cosine}_schedule_with_warmup``
    write it (for PyTorch's ``LambdaLR``): rising from 0 over the warmup, then falling to 0 at
    the last step."""

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        progress = (step - warmup) / (steps - warmup)
        if kind == "linear":
            return max(0.0, (steps - step) / (steps - warmup))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    return factor


def uses_extra(rank: int, step: int) -> bool:
    """Of two workers, rank 0 takes the branch at steps 0, 3, 6..., rank 1 at steps 2, 5, 8...,
    and neither at steps 1, 4, 7..."""
    return (step + rank) % 3 == 0


class Lookup(nn.Module):
    """Each pixel's intensity (0-16 in the digits' 0-1 scale) looked up in a sparse embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(17, 4, sparse=True)
        self.head = nn.Linear(64 * 4, 10)

    def forward(self, x: torch.Tensor, use_extra: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb((x * 16).round().long()).flatten(1))


class Tied(nn.Module):
    """Two layers sharing one weight (tied, as a language model's embedding and output often
    are): ``named_parameters`` names it once, and the gradient of both uses comes as one."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(64, 32)
        self.first = nn.Linear(32, 32)
        self.second = nn.Linear(32, 32)
        self.second.weight = self.first.weight
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor, use_extra: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.first(torch.tanh(self.inner(x))))
        return self.head(torch.tanh(self.second(h)))


MODULES = {"branched": Branched, "sparse": Lookup, "tied": Tied}


def module(seed: int = 0, kind: str = "branched") -> nn.Module:
    torch.manual_seed(seed)
    return MODULES[kind]()


def _batch(data: Any, rank: int, workers: int, batch: int, step: int, seed: int) -> Any:
    x, y = models.batch_at(data, rank, workers, batch, step, seed)
    return (torch.from_numpy(x), torch.tensor(uses_extra(rank, step))), torch.from_numpy(y)


def _factory(kind: str, job: JobInfo) -> tuple[nn.Module, Any, Any]:
    torch.set_num_threads(1)  # a job's processes share the machine's cores
    data = models.load("digits", job.seed)

    def batches(step: int) -> Any:
        return _batch(data, job.rank, job.workers, job.batch, step, job.seed)

    def evaluate(model: nn.Module) -> float:
        device = next(model.parameters()).device  # the worker's --device
        with torch.no_grad():
            out = model(torch.from_numpy(data.x_test).to(device), torch.tensor(False)).cpu()
        return float((out.argmax(dim=1) == torch.from_numpy(data.y_test)).float().mean())

    return module(job.seed, kind), batches, evaluate


def paced(job: JobInfo) -> tuple[nn.Module, Any, Any]:
    """``make``'s model and batches, each batch 100 ms late: a job slow enough to be stopped
    part way, with seconds to spare on a loaded machine (the batches, and so the gradients,
    are ``make``'s)."""
    model, batches, evaluate = _factory("branched", job)

    def late(step: int) -> Any:
        time.sleep(0.1)
        return batches(step)

    return model, late, evaluate


def on_gpu(job: JobInfo) -> tuple[nn.Module, Any, Any]:
    """``make``'s model, built on the GPU (``.cuda()``) by the factory itself."""
    model, batches, evaluate = _factory("branched", job)
    return model.cuda(), batches, evaluate


def make(job: JobInfo) -> tuple[nn.Module, Any, Any]:
    return _factory("branched", job)


def sparse(job: JobInfo) -> tuple[nn.Module, Any, Any]:
    return _factory("sparse", job)


def tied(job: JobInfo) -> tuple[nn.Module, Any, Any]:
    return _factory("tied", job)


def torch_optimizer(
    name: str, params: Any, lr: float, weight_decay: float, momentum: float = 0.9
) -> torch.optim.Optimizer:
    """PyTorch's own optimizer of the servers' ``--optimizer name``."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    assert name == "adamw", name
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def reference(
    steps: int,
    workers: int,
    batch: int,
    lr: float,
    momentum: float,
    weight_decay: float,
    kind: str = "branched",
    optimizer: str = "momentum",
    schedule: Any = None,
    clip: float | None = None,
) -> dict[str, Any]:
    """What a BSP job of ``workers`` workers computes: one process whose loss is the mean of
    the workers' losses, stepped by PyTorch's own optimizer (which skips a parameter whose
    ``grad`` is None, and takes a sparse one as it is); ``schedule(step)``: the factor of the
    rate at each step, through PyTorch's ``LambdaLR``; ``clip``: the gradient's global norm
    clipped to it first (``clip_grad_norm_``)."""
    data = models.load("digits", 0)
    model = module(0, kind)
    opt = torch_optimizer(optimizer, model.parameters(), lr, weight_decay, momentum)
    rates = None if schedule is None else torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        losses = []
        for rank in range(workers):
            (x, use), y = _batch(data, rank, workers, batch, step, 0)
            losses.append(nn.functional.cross_entropy(model(x, use), y))
        (sum(losses) / workers).backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if rates is not None:
            rates.step()
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def on_digits(job: JobInfo, model: nn.Module) -> tuple[nn.Module, Any, Any]:
    """A factory's answer for ``model``, a module of the digits' 64 pixels: its worker's
    batches, and its evaluation on the model's device."""
    torch.set_num_threads(1)  # a job's processes share the machine's cores
    data = models.load("digits", job.seed)

    def batches(step: int) -> Any:
        x, y = models.batch_at(data, job.rank, job.workers, job.batch, step, job.seed)
        return torch.from_numpy(x), torch.from_numpy(y)

    def evaluate(model: nn.Module) -> float:
        device = next(model.parameters()).device
        with torch.no_grad():
            out = model(torch.from_numpy(data.x_test).to(device)).cpu()
        return float((out.argmax(dim=1) == torch.from_numpy(data.y_test)).float().mean())

    return model, batches, evaluate


def lazy(job: JobInfo) -> tuple[nn.Module, Any, Any]:
    """A module of ``nn.LazyLinear`` layers, whose parameters have no shape until a first
    forward pass, on the digits."""
    torch.manual_seed(job.seed)
    return on_digits(job, nn.Sequential(nn.LazyLinear(32), nn.ReLU(), nn.LazyLinear(10)))
