"""Model factories a new user might give ``tensorwire-worker --model``, each probing one thing
the PyTorch path had not met (run.sh runs each through ``tensorwire demo``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tensorwire.client import models


def _digits(job: Any) -> tuple[Any, Any]:
    data = models.load("digits", job.seed)

    def batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = models.batch_at(data, job.rank, job.workers, job.batch, step, job.seed)
        return torch.from_numpy(x), torch.from_numpy(y)

    return data, batches


def _accuracy(data: Any) -> Any:
    def evaluate(model: nn.Module) -> float:
        with torch.no_grad():
            out = model(torch.from_numpy(data.x_test))
        scores = out["logits"] if isinstance(out, dict) else out
        return float((scores.argmax(1) == torch.from_numpy(data.y_test)).float().mean())

    return evaluate


class Lookup(nn.Module):
    """Each pixel's intensity looked up in an ``nn.Embedding(sparse=True)``."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(17, 8, sparse=True)
        self.head = nn.Linear(64 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb((x * 16).long().clamp(0, 16)).flatten(1))


class DictOutput(nn.Module):
    """Returns ``{"logits": ...}``, as a Hugging Face model's ``ModelOutput`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.layer(x)}


def _on_digits(job: Any, make: Any) -> tuple[nn.Module, Any, Any]:
    """``make()``'s module (seeded) with the digits' batches and accuracy."""
    torch.manual_seed(job.seed)
    data, batches = _digits(job)
    return make(), batches, _accuracy(data)


def sparse(job: Any) -> tuple[nn.Module, Any, Any]:
    return _on_digits(job, Lookup)


def lazy(job: Any) -> tuple[nn.Module, Any, Any]:
    """An ``nn.LazyLinear``, whose parameters have no shape until a first forward pass."""
    return _on_digits(job, lambda: nn.Sequential(nn.LazyLinear(32), nn.ReLU(), nn.Linear(32, 10)))


def dict_output(job: Any) -> tuple[nn.Module, Any, Any]:
    return _on_digits(job, DictOutput)


def running_out(job: Any) -> tuple[nn.Module, Any, Any]:
    """Batches sliced by the step without going round the data: empty past its end."""
    torch.manual_seed(job.seed)
    data = models.load("digits", job.seed)
    x_all, y_all = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)

    def batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        lo = (step * job.workers + job.rank) * job.batch
        return x_all[lo : lo + job.batch], y_all[lo : lo + job.batch]

    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return model, batches, _accuracy(data)
