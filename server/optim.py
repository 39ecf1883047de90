"""Optimizers that run on the parameter server, in place, one parameter chunk at a time.

The arrays are numpy's or, on a server with ``--device cuda``, cupy's: an optimizer calls the
array module it was made with (``xp``), whose functions are the same.

Weight decay is L2: ``weight_decay * param`` is added to the gradient before the update, but for
``adamw``, whose decay is decoupled from the gradient (the parameter shrinks by ``lr *
weight_decay`` of itself each step, apart from Adam's moments), as ``torch.optim.AdamW``'s is.
``step`` receives the gradient in a scratch buffer it may overwrite, and a ``scale`` to apply to it
(1/N for an average of N workers' sums), so an update of a large chunk allocates nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

Array = Any  # numpy.ndarray, or cupy.ndarray on a GPU server


class Optimizer:
    #: state slots kept in host memory wherever the parameters are (counters read every step)
    HOST_SLOTS: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, lr: float, weight_decay: float = 0.0, xp: Any = np) -> None:
        # (written so that NaN fails too: it compares false with everything, and would turn
        # every parameter into NaN at the first step)
        if not 0 < lr < math.inf:
            raise ValueError(f"learning rate must be a positive number, got {lr}")
        if not 0 <= weight_decay < math.inf:
            raise ValueError(f"weight decay must be zero or a positive number, got {weight_decay}")
        self.lr = lr
        self.weight_decay = weight_decay
        self.xp = xp
        #: each parameter chunk's state, by its key (what a checkpoint holds)
        self.state: dict[str, dict[str, Any]] = {}
        #: packs stepped as one array (:meth:`link_pack`): each one's members' keys and its
        #: flat state, whose slices are the members' state
        self._packs: dict[str, tuple[list[str], dict[str, Any]]] = {}

    def adopt(self, state: dict[str, dict[str, Any]], to_device: Callable[[Any], Any]) -> None:
        """Take ``state`` (host arrays, from a checkpoint), its device slots moved by
        ``to_device``."""
        self.state = {
            key: {
                slot: value if slot in self.HOST_SLOTS else to_device(value)
                for slot, value in slots.items()
            }
            for key, slots in state.items()
        }

    def _grad(self, param: Array, grad: Array, scale: float, l2: bool = True) -> Array:
        """The effective gradient, computed in ``grad``'s own buffer; ``l2``: with the weight
        decay's term (not for a decay decoupled from the gradient)."""
        if scale != 1.0:
            grad *= scale
        if l2 and self.weight_decay:
            grad += self.weight_decay * param
        return grad

    def new_state(self, param: Array) -> dict[str, Any]:
        """The state of a chunk like ``param`` before its first step."""
        return {}

    def step(self, key: str, param: Array, grad: Array, scale: float = 1.0) -> None:
        """One update of chunk ``key``'s ``param``, in place, with ``grad`` times ``scale``
        (``grad``: a scratch buffer, overwritten)."""
        st = self.state.get(key)
        if st is None:
            st = self.state[key] = self.new_state(param)
        if param.ndim == 0:
            # A scalar parameter is stepped through 1-element views of it and of its state:
            # numpy before 2.0 computes a 0-d float32 array with a Python float in float64
            # (value-based casting) and an array of one or more dimensions in float32, so the
            # scalar rounded otherwise than in a pack (step_pack's flat arrays) and than under
            # numpy 2 (found by `make test-floors`, numpy 1.24)
            param, grad = param.reshape(1), grad.reshape(1)
            st = {s: v if s in self.HOST_SLOTS else v.reshape(1) for s, v in st.items()}
        self._update(st, param, grad, scale)

    def _update(self, st: dict[str, Any], param: Array, grad: Array, scale: float) -> None:
        raise NotImplementedError

    def link_pack(
        self, key: str, members: list[str], param: Array, split: Callable[[Array], list[Array]]
    ) -> None:
        """Make the state of ``members`` (the chunks of a pack, whose parameters are the slices
        ``split`` gives of ``param``, the pack's flat parameters) slices of one flat state, so
        that :meth:`step_pack` steps them all at once and :meth:`step` any of them alone, on
        the same memory. State they had (adopted from a checkpoint) is copied in; a member's
        state stays its own to a checkpoint. Called again after :meth:`adopt`."""
        fresh = self.new_state(param)
        flat = {slot: value for slot, value in fresh.items() if slot not in self.HOST_SLOTS}
        for slot, whole in flat.items():
            for member, part in zip(members, split(whole), strict=True):
                had = self.state.get(member, {}).get(slot)
                if had is not None:
                    part[...] = had
                self.state.setdefault(member, {})[slot] = part
        for member in members:  # each member's own counters (a step count): kept, or fresh
            st = self.state.setdefault(member, {})
            for slot in self.HOST_SLOTS:
                st.setdefault(slot, fresh[slot].copy())
        self._packs[key] = (list(members), flat)

    def step_pack(self, key: str, param: Array, grad: Array, scale: float = 1.0) -> bool:
        """:meth:`step` of every member of pack ``key`` (:meth:`link_pack`) at once, ``param``
        and ``grad`` the pack's flat arrays: one update where each member's would take one
        (200 of a model's small tensors in 8 packs: 8 calls, not 200, and on a GPU 8 launches
        of each kernel). False, nothing done, where the members' counters differ (Adam's step
        count: one was stepped alone, on a step that had no gradient of the others): then
        each is stepped alone."""
        members, flat = self._packs[key]
        states = [self.state[m] for m in members]
        host = {}
        for slot in self.HOST_SLOTS:
            first = states[0][slot]
            if any(int(st[slot]) != int(first) for st in states[1:]):
                return False
            host[slot] = first.copy()
        self._update({**flat, **host}, param, grad, scale)
        for slot, value in host.items():
            for st in states:
                st[slot][...] = value
        return True


class SGD(Optimizer):
    def _update(self, st: dict[str, Any], param: Array, grad: Array, scale: float) -> None:
        if self.weight_decay:
            g = self._grad(param, grad, scale)
            g *= self.lr
        else:  # one pass over the chunk instead of two
            g = grad
            g *= self.lr * scale
        param -= g


class Momentum(Optimizer):
    def __init__(
        self, lr: float, weight_decay: float = 0.0, momentum: float = 0.9, xp: Any = np
    ) -> None:
        super().__init__(lr, weight_decay, xp)
        if not 0 <= momentum < 1:  # 1 and above: the velocity never decays, and diverges
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.momentum = momentum

    def new_state(self, param: Array) -> dict[str, Any]:
        return {"v": self.xp.zeros_like(param)}

    def _update(self, st: dict[str, Any], param: Array, grad: Array, scale: float) -> None:
        v = st["v"]
        v *= self.momentum
        v += self._grad(param, grad, scale)
        self.xp.multiply(v, self.lr, out=grad)
        param -= grad


class Adam(Optimizer):
    HOST_SLOTS = frozenset({"t"})
    #: the weight decay shrinks the parameter apart from the moments (AdamW), instead of
    #: passing through them as an L2 term of the gradient
    DECOUPLED = False

    def __init__(
        self,
        lr: float,
        weight_decay: float = 0.0,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        xp: Any = np,
    ) -> None:
        super().__init__(lr, weight_decay, xp)
        self.beta1, self.beta2, self.eps = beta1, beta2, eps

    def new_state(self, param: Array) -> dict[str, Any]:
        zeros = self.xp.zeros_like
        return {
            "m": zeros(param),
            "v": zeros(param),
            "t": np.zeros((), np.int64),  # in HOST_SLOTS: read each step without a sync
        }

    def _update(self, st: dict[str, Any], param: Array, grad: Array, scale: float) -> None:
        if self.DECOUPLED and self.weight_decay:
            param *= 1 - self.lr * self.weight_decay  # (before the step, as torch's)
        g = self._grad(param, grad, scale, l2=not self.DECOUPLED)
        st["t"] += 1
        t = int(st["t"])
        st["m"] *= self.beta1
        st["m"] += (1 - self.beta1) * g
        st["v"] *= self.beta2
        st["v"] += (1 - self.beta2) * g * g
        m_hat = st["m"] / (1 - self.beta1**t)
        v_hat = st["v"] / (1 - self.beta2**t)
        param -= (self.lr * m_hat / (self.xp.sqrt(v_hat) + self.eps)).astype(param.dtype)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter, "Decoupled Weight Decay
    Regularization", 2019): what ``torch.optim.AdamW`` computes, the usual optimizer of
    transformers."""

    DECOUPLED = True


OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")

#: each optimizer's --lr when none is given. Adam normalises each step by the gradient's running
#: scale, so its rate is a step size in parameter units and wants to be smaller than plain SGD's:
#: at 0.1 (0.033 a push with 3 workers under asp or ssp) the digits MLP ended below 0.9 test
#: accuracy in 6 of 80 ssp runs and 3 of 30 asp runs (down to 0.63) as late steps threw it off;
#: at 0.01, 60 of 60 ended at 0.986-0.994, and bsp rose from 0.969 to 0.983 (800 steps each)
DEFAULT_LR = {"sgd": 0.1, "momentum": 0.1, "adam": 0.01, "adamw": 0.01}


def _unknown(name: str) -> ValueError:
    return ValueError(f"unknown optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}")


#: how the learning rate moves over a job (--lr-schedule), after --warmup-steps
SCHEDULES = ("constant", "linear", "cosine")


def rate_factor(schedule: str, step: int, steps: int, warmup: int) -> float:
    """What --lr is multiplied by at ``step`` (0-based) of a job of ``steps``: during the first
    ``warmup`` steps it rises linearly from 0 (``step / warmup``), then stays 1 (``constant``)
    or falls to 0 at ``steps``, in a straight line (``linear``) or along half a cosine
    (``cosine``). The formulas of Hugging Face transformers' ``get_constant_schedule_with_
    warmup``, ``get_linear_schedule_with_warmup`` and ``get_cosine_schedule_with_warmup``,
    which a transformer's recipe usually names."""
    if step < warmup:
        return step / max(1, warmup)
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, steps - warmup)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    if schedule == "cosine":
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    raise ValueError(f"unknown learning-rate schedule {schedule!r}; choose one of {SCHEDULES}")


def default_lr(name: str) -> float:
    """The learning rate optimizer ``name`` uses when none is given (see DEFAULT_LR)."""
    try:
        return DEFAULT_LR[name]
    except KeyError:
        raise _unknown(name) from None


def make(
    name: str, lr: float, weight_decay: float = 0.0, momentum: float = 0.9, xp: Any = np
) -> Optimizer:
    """Optimizer ``name``, computing with array module ``xp`` (numpy, or cupy on a GPU)."""
    if name == "sgd":
        return SGD(lr, weight_decay, xp)
    if name == "momentum":
        return Momentum(lr, weight_decay, momentum, xp)
    if name == "adam":
        return Adam(lr, weight_decay, xp=xp)
    if name == "adamw":
        return AdamW(lr, weight_decay, xp=xp)
    raise _unknown(name)
