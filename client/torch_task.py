"""A PyTorch ``nn.Module`` as a worker's task: its parameters *are* the registered buffers.

:meth:`TorchTask.bind` points every parameter's storage at the buffer the servers write
(``torch.from_numpy``: no copy), so a server's write lands in the memory the next forward pass
reads. The gradients go out from ``param.grad`` as numpy views of the same memory. Trained with
cross-entropy on the module's output; CPU tensors here (GPU buffers come with the GPU issue).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .tasks import StepResult

Array = np.ndarray[Any, Any]


def bind_module(module: torch.nn.Module, params: Mapping[str, Array]) -> None:
    """Point every parameter of ``module`` at ``params[name]`` (``PSClient.params``): no copy,
    so what the servers write is what the next forward pass reads."""
    with warnings.catch_warnings():
        # The buffers are read-only to us (the servers write them); torch warns that it cannot
        # mark a tensor read-only. The model only reads its parameters.
        warnings.simplefilter("ignore", UserWarning)
        for name, p in module.named_parameters():
            p.data = torch.from_numpy(np.asarray(params[name]))


def module_grads(module: torch.nn.Module) -> dict[str, Array]:
    """Every parameter's gradient as a numpy view (zeros for one the forward pass did not use),
    for ``PSClient.push``."""
    return {
        n: p.grad.numpy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
        for n, p in module.named_parameters()
    }


class TorchTask:
    def __init__(
        self,
        module: torch.nn.Module,
        batches: Callable[[int], tuple[Any, Any]],
        evaluate: Callable[[torch.nn.Module], float],
    ) -> None:
        self.module, self.batches, self._evaluate = module, batches, evaluate
        self._params = dict(module.named_parameters())
        odd = [n for n, p in self._params.items() if p.dtype != torch.float32 or p.is_cuda]
        if odd:
            raise TypeError(f"parameter {odd[0]!r}: the servers keep float32 CPU parameters")

    def initial_params(self) -> dict[str, Array]:
        return {n: p.detach().numpy().copy() for n, p in self._params.items()}

    def bind(self, params: Mapping[str, Array]) -> None:
        bind_module(self.module, params)

    def step(self, step: int) -> StepResult:
        x, y = self.batches(step)
        x, y = torch.as_tensor(x), torch.as_tensor(y)
        self.module.train()
        for p in self._params.values():
            p.grad = None
        out = self.module(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        grads = module_grads(self.module)
        correct = int((out.argmax(dim=1) == y).sum())
        return StepResult(float(loss.detach()), grads, correct, len(y))

    def evaluate(self) -> float:
        self.module.eval()
        with torch.no_grad():
            return float(self._evaluate(self.module))
