"""A small MLP on the digits, compiled with ``torch.compile`` (``make``) or not (``plain``), as
``tensorwire-worker --model tests.torch_compiled_model:make`` imports it. The compiled module's
parameters are named as its wrapper names them (``_orig_mod.`` first), and the worker binds
them to the buffers the servers write, which must not make it compile again at each step."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tensorwire.client import models
from tensorwire.client.tasks import JobInfo


def plain(job: JobInfo) -> tuple[nn.Module, Any, Any]:
    torch.set_num_threads(1)  # a job's processes share the machine's cores
    torch.manual_seed(job.seed)
    data = models.load("digits", job.seed)

    def batches(step: int) -> Any:
        x, y = models.batch_at(data, job.rank, job.workers, job.batch, step, job.seed)
        return torch.from_numpy(x), torch.from_numpy(y)

    def evaluate(model: nn.Module) -> float:
        with torch.no_grad():
            out = model(torch.from_numpy(data.x_test))
        return float((out.argmax(dim=1) == torch.from_numpy(data.y_test)).float().mean())

    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return model, batches, evaluate


def make(job: JobInfo) -> tuple[Any, Any, Any]:
    model, batches, evaluate = plain(job)
    return torch.compile(model), batches, evaluate
