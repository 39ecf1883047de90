"""Optimizers that run on the parameter server, in place, one parameter chunk at a time.

Weight decay is L2: ``weight_decay * param`` is added to the gradient before the update.
``step`` receives the gradient in a scratch buffer it may overwrite, and a ``scale`` to apply to it
(1/N for an average of N workers' sums), so an update of a large chunk allocates nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]


class Optimizer:
    def __init__(self, lr: float, weight_decay: float = 0.0) -> None:
        if lr <= 0:
            raise ValueError(f"learning rate must be positive, got {lr}")
        self.lr = lr
        self.weight_decay = weight_decay
        self.state: dict[str, dict[str, Any]] = {}

    def _grad(self, param: Array, grad: Array, scale: float) -> Array:
        """The effective gradient, computed in ``grad``'s own buffer."""
        if scale != 1.0:
            grad *= scale
        if self.weight_decay:
            grad += self.weight_decay * param
        return grad

    def step(self, key: str, param: Array, grad: Array, scale: float = 1.0) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    def step(self, key: str, param: Array, grad: Array, scale: float = 1.0) -> None:
        if self.weight_decay:
            g = self._grad(param, grad, scale)
            g *= self.lr
        else:  # one pass over the chunk instead of two
            g = grad
            g *= self.lr * scale
        param -= g


class Momentum(Optimizer):
    def __init__(self, lr: float, weight_decay: float = 0.0, momentum: float = 0.9) -> None:
        super().__init__(lr, weight_decay)
        self.momentum = momentum

    def step(self, key: str, param: Array, grad: Array, scale: float = 1.0) -> None:
        st = self.state.setdefault(key, {"v": np.zeros_like(param)})
        v = st["v"]
        v *= self.momentum
        v += self._grad(param, grad, scale)
        np.multiply(v, self.lr, out=grad)
        param -= grad


class Adam(Optimizer):
    def __init__(
        self,
        lr: float,
        weight_decay: float = 0.0,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
    ) -> None:
        super().__init__(lr, weight_decay)
        self.beta1, self.beta2, self.eps = beta1, beta2, eps

    def step(self, key: str, param: Array, grad: Array, scale: float = 1.0) -> None:
        st = self.state.setdefault(
            key, {"m": np.zeros_like(param), "v": np.zeros_like(param), "t": np.zeros((), np.int64)}
        )
        g = self._grad(param, grad, scale)
        st["t"] += 1
        t = int(st["t"])
        st["m"] *= self.beta1
        st["m"] += (1 - self.beta1) * g
        st["v"] *= self.beta2
        st["v"] += (1 - self.beta2) * g * g
        m_hat = st["m"] / (1 - self.beta1**t)
        v_hat = st["v"] / (1 - self.beta2**t)
        param -= (self.lr * m_hat / (np.sqrt(v_hat) + self.eps)).astype(param.dtype)


OPTIMIZERS = ("sgd", "momentum", "adam")


def make(name: str, lr: float, weight_decay: float = 0.0, momentum: float = 0.9) -> Optimizer:
    if name == "sgd":
        return SGD(lr, weight_decay)
    if name == "momentum":
        return Momentum(lr, weight_decay, momentum)
    if name == "adam":
        return Adam(lr, weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}")
