"""A small MLP on the digits, compiled with ``torch.compile`` (``make``) or not (``plain``), as
``tensorwire-worker --model tests.torch_compiled_model:make`` imports it. The compiled module's
parameters are named as its wrapper names them (``_orig_mod.`` first), and the worker binds
them to the buffers the servers write, which must not make it compile again at each step."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tensorwire.client.tasks import JobInfo

from .torch_grads_model import on_digits


def plain(job: JobInfo) -> tuple[nn.Module, Any, Any]:
    torch.manual_seed(job.seed)
    return on_digits(job, nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)))


def make(job: JobInfo) -> tuple[Any, Any, Any]:
    model, batches, evaluate = plain(job)
    return torch.compile(model), batches, evaluate
