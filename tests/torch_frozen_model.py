"""A PyTorch model fine-tuned on a frozen layer, as ``tensorwire-worker --model
tests.torch_frozen_model:make`` imports it: a bfloat16 linear layer with ``requires_grad=False``
(a pretrained backbone, in half precision as such backbones often are) under a float32 head that
trains. ``all_frozen`` freezes the head too."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tensorwire.client import models
from tensorwire.client.tasks import JobInfo


class FineTuned(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(64, 32).to(torch.bfloat16).requires_grad_(False)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.backbone(x.to(torch.bfloat16))).float())


def module(seed: int = 0) -> FineTuned:
    """The model every worker builds: the same frozen layer from the same seed."""
    torch.manual_seed(seed)
    return FineTuned()


def make(job: JobInfo) -> tuple[nn.Module, Any, Any]:
    torch.set_num_threads(1)  # a job's processes share the machine's cores
    data = models.load("digits", job.seed)

    def batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = models.batch_at(data, job.rank, job.workers, job.batch, step, job.seed)
        return torch.from_numpy(x), torch.from_numpy(y)

    def evaluate(model: nn.Module) -> float:
        with torch.no_grad():
            predicted = model(torch.from_numpy(data.x_test)).argmax(dim=1)
        return float((predicted == torch.from_numpy(data.y_test)).float().mean())

    return module(job.seed), batches, evaluate


def all_frozen(job: JobInfo) -> tuple[nn.Module, Any, Any]:
    model, batches, evaluate = make(job)
    model.requires_grad_(False)
    return model, batches, evaluate


def unseeded(job: JobInfo) -> tuple[nn.Module, Any, Any]:
    """``make``, whose frozen layer each worker draws differently (as a factory that does not
    seed torch would, the servers keeping no frozen parameter to hand out)."""
    model, batches, evaluate = make(job)
    torch.manual_seed(job.seed + 1 + job.rank)
    with torch.no_grad():
        model.backbone.weight.normal_()
    return model, batches, evaluate
