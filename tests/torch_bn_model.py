"""A PyTorch model with buffers, as ``tensorwire-worker --model tests.torch_bn_model:make``
imports it: a linear layer, batch norm (running statistics, a batch count) and another linear
layer on the digits. The servers learn its parameters; its buffers stay with each worker."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tensorwire.client import models
from tensorwire.client.tasks import JobInfo


def module() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))


def make(job: JobInfo) -> tuple[nn.Module, Any, Any]:
    torch.set_num_threads(1)  # a job's processes share the machine's cores
    torch.manual_seed(job.seed)  # every worker builds the same initial model
    data = models.load("digits", job.seed)

    def batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = models.batch_at(data, job.rank, job.workers, job.batch, step, job.seed)
        return torch.from_numpy(x), torch.from_numpy(y)

    def evaluate(model: nn.Module) -> float:
        return accuracy(model, data)

    return module(), batches, evaluate


def accuracy(model: nn.Module, data: Any) -> float:
    """``model``'s accuracy on the digits' held-out set (in eval mode: its running
    statistics)."""
    model.eval()
    with torch.no_grad():
        predicted = model(torch.from_numpy(data.x_test)).argmax(dim=1)
    return float((predicted == torch.from_numpy(data.y_test)).float().mean())
