"""A PyTorch model trained by the parameter server: a small convolutional network on digits.

    tensorwire-ps --workers 2 --steps 600 --optimizer momentum --lr 0.05 &
    tensorwire-worker --rank 0 --workers 2 --model examples/torch_digits.py:make &
    tensorwire-worker --rank 1 --workers 2 --model examples/torch_digits.py:make

(``make demo-torch`` runs exactly this; ``--device cuda`` on the workers trains on a GPU, the
servers writing the parameters straight into GPU memory.) The factory returns the module, this
worker's batch at each step, and an evaluation: the worker does the rest. Every parameter of the
module is a view of the buffer the servers write, so their updates land in the memory the next
forward pass reads.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tensorwire.client import models
from tensorwire.client.tasks import JobInfo


class DigitsCNN(nn.Module):
    """8x8 grey images -> 10 classes: two 3x3 convolutions, a pooling, a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classify = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(x).flatten(1))


def make(job: JobInfo) -> tuple[nn.Module, Any, Any]:
    torch.set_num_threads(1)  # a job's processes share the machine's cores
    torch.manual_seed(job.seed)  # every worker builds the same initial model (rank 0's is used)
    data = models.load("digits", job.seed)

    def batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = models.batch_at(data, job.rank, job.workers, job.batch, step, job.seed)
        return torch.from_numpy(x).reshape(-1, 1, 8, 8), torch.from_numpy(y)

    x_test = torch.from_numpy(data.x_test).reshape(-1, 1, 8, 8)
    y_test = torch.from_numpy(data.y_test)

    def evaluate(model: nn.Module) -> float:
        device = next(model.parameters()).device  # the worker's --device
        predicted = model(x_test.to(device)).argmax(dim=1).cpu()
        return float((predicted == y_test).float().mean())

    return DigitsCNN(), batches, evaluate
