"""A PyTorch regression, as ``tensorwire-worker --model tests.torch_regression_model:make``
imports it: a linear layer fitted to y = x @ w + noise with mean squared error, the loss the
factory gives as the fourth item of what it returns; ``evaluate`` scores it by the negative mean
squared error on held-out data (higher is better; 0 a perfect fit)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tensorwire.client.tasks import JobInfo

FEATURES = 8


def data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training and held-out ``(x, y)`` of one linear relation, with noise."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=FEATURES).astype(np.float32)
    x = rng.normal(size=(1200, FEATURES)).astype(np.float32)
    y = (x @ w + 0.1 * rng.normal(size=len(x))).astype(np.float32)
    t = torch.from_numpy
    return t(x[:1000]), t(y[:1000]), t(x[1000:]), t(y[1000:])


def squared_error(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.squeeze(-1), y)


def make(job: JobInfo) -> tuple[nn.Module, Any, Any, Any]:
    torch.set_num_threads(1)  # a job's processes share the machine's cores
    torch.manual_seed(job.seed)
    x, y, x_test, y_test = data(job.seed)
    share = len(x) // job.workers

    def batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = job.rank * share + (step * job.batch) % (share - job.batch)
        return x[start : start + job.batch], y[start : start + job.batch]

    def evaluate(model: nn.Module) -> float:
        with torch.no_grad():
            return -float(F.mse_loss(model(x_test).squeeze(-1), y_test))

    return nn.Linear(FEATURES, 1), batches, evaluate, squared_error
