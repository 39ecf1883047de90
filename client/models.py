"""Models and data the parameter-server layer trains: a numpy MLP with hand-written backprop.

``digits``: scikit-learn's bundled 8x8 digits (1797 images, no download), 64 -> 128 -> 10 with ReLU
and softmax cross-entropy. ``large``: the same network shape scaled to several million parameters on
synthetic data, to load the network in benchmarks. ``many``: a parameter list shaped like a
convolutional network's, for the per-tensor cost of a step: 100 layers, 200 tensors from 256 B
(biases) to 256 KiB (weights), 7 MB in all, on synthetic data: a residual chain (each hidden
layer adds a tanh branch to its input; a plain ReLU chain that deep learned nothing). Parameters
are a dict of float32 arrays; the training code never allocates them itself, so they can be
views of registered receive buffers.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import tensorwire as tw

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class ModelSpec:
    """An MLP: layer widths from input to classes."""

    name: str
    widths: tuple[int, ...]
    #: weights start at N(0, gain / fan_in): 2 (He) suits ReLU; a deep chain diverges with it
    gain: float = 2.0
    #: 0: a plain chain, each hidden layer ``relu(h @ w + b)``. Else each hidden layer adds
    #: ``residual * tanh(h @ w + b)`` to its input, cut or zero-padded to its width (no
    #: parameters of its own: the parameter list stays the chain's): a chain 100 layers deep
    #: learns so, and a plain one does not.
    residual: float = 0.0

    def shapes(self) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {}
        for i, (a, b) in enumerate(zip(self.widths[:-1], self.widths[1:], strict=True)):
            out[f"layer{i}.weight"] = (a, b)
            out[f"layer{i}.bias"] = (b,)
        return out

    def init(self, seed: int = 0) -> dict[str, Array]:
        """Weights of variance ``gain / fan_in`` (He for 2) and zero biases, float32,
        deterministic in ``seed``."""
        rng = np.random.default_rng(seed)
        params = {}
        for name, shape in self.shapes().items():
            if name.endswith("weight"):
                params[name] = (rng.standard_normal(shape) * np.sqrt(self.gain / shape[0])).astype(
                    np.float32
                )
            else:
                params[name] = np.zeros(shape, np.float32)
        return params

    @property
    def layers(self) -> int:
        return len(self.widths) - 1


#: hidden widths of ``many``, repeated: weights of 16 KiB to 256 KiB, biases of 256 B to 1 KiB
_MANY_WIDTHS = (256, 64, 128, 256, 64, 192, 96, 256, 128, 64)

MODELS = {
    "digits": ModelSpec("digits", (64, 128, 10)),
    # ~6.4 M parameters (25.6 MB of float32): several MB of gradients per step per worker.
    "large": ModelSpec("large", (1024, 2048, 2048, 10)),
    "many": ModelSpec(
        "many",
        (256, *(_MANY_WIDTHS[i % len(_MANY_WIDTHS)] for i in range(99)), 64),
        gain=1.0,
        residual=0.1,
    ),
}


def model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}") from None


def _carried(h: Array, width: int) -> Array:
    """A residual layer's input as its output's width: cut, or padded with zeros. Also the
    transpose of itself, for the gradient: padding what was cut, cutting what was padded."""
    if h.shape[1] >= width:
        return h[:, :width]
    out = np.zeros((h.shape[0], width), h.dtype)
    out[:, : h.shape[1]] = h
    return out


def forward(
    spec: ModelSpec, params: dict[str, Array], x: Array
) -> tuple[Array, list[Array], list[Array]]:
    """Logits, each layer's input (the activations backprop needs), and for a residual model
    each hidden layer's tanh branch (else nothing)."""
    acts = [x]
    branches: list[Array] = []
    h = x
    for i in range(spec.layers):
        z = h @ params[f"layer{i}.weight"] + params[f"layer{i}.bias"]
        if i == spec.layers - 1:
            h = z
        elif spec.residual:
            t = np.tanh(z)
            branches.append(t)
            h = _carried(h, z.shape[1]) + spec.residual * t
        else:
            h = np.maximum(z, 0)
        acts.append(h)
    return h, acts, branches


def loss_and_grads(
    spec: ModelSpec, params: dict[str, Array], x: Array, y: Array
) -> tuple[float, dict[str, Array], int]:
    """Mean softmax cross-entropy over the batch, its gradients, and the number correct."""
    logits, acts, branches = forward(spec, params, x)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    probs = exp / exp.sum(axis=1, keepdims=True)
    n = x.shape[0]
    loss = float(-np.log(probs[np.arange(n), y] + 1e-12).mean())
    correct = int((logits.argmax(axis=1) == y).sum())
    delta = probs  # d loss / d z of the layer at hand, from the last one down
    delta[np.arange(n), y] -= 1.0
    delta /= n
    grads: dict[str, Array] = {}
    out_grad = delta  # residual: d loss / d (layer i's output); the last layer's is delta
    for i in reversed(range(spec.layers)):
        grads[f"layer{i}.weight"] = (acts[i].T @ delta).astype(np.float32)
        grads[f"layer{i}.bias"] = delta.sum(axis=0).astype(np.float32)
        if not i:
            break
        # d loss / d (layer i's input), which is layer i-1's output
        back = delta @ params[f"layer{i}.weight"].T
        if spec.residual:
            if i < spec.layers - 1:  # layer i's own input carried past it
                back = back + _carried(out_grad, acts[i].shape[1])
            out_grad = back
            delta = back * spec.residual * (1.0 - branches[i - 1] ** 2)
        else:
            delta = back * (acts[i] > 0)
    return loss, grads, correct


def accuracy(spec: ModelSpec, params: dict[str, Array], x: Array, y: Array) -> float:
    logits, _, _ = forward(spec, params, x)
    return float((logits.argmax(axis=1) == y).mean())


@dataclass
class Dataset:
    x_train: Array
    y_train: Array
    x_test: Array
    y_test: Array


#: scikit-learn's digits, inside its package: 1797 rows of 64 pixels (0-16) and the label
DIGITS_FILE = ("datasets", "data", "digits.csv.gz")


def digits() -> tuple[Array, Array]:
    """scikit-learn's bundled digits data set (no download): the pixels (1797 x 64, float64)
    and the labels, the arrays ``sklearn.datasets.load_digits()`` returns.

    Read from the package's data file without importing scikit-learn, which takes about 2 s
    (scipy with it) on a small VM: at the start of every worker. Where that file is not where
    it was (another scikit-learn layout), scikit-learn's own reader takes over."""
    try:
        found = importlib.util.find_spec("sklearn")
    except ImportError:
        found = None
    if found is None or found.origin is None:
        raise tw.MissingDependencyError(
            "the digits data set comes with scikit-learn: pip install 'tensorwire[ps]'"
        )
    path = Path(found.origin).parent.joinpath(*DIGITS_FILE)
    if path.is_file():
        table = np.loadtxt(path, delimiter=",")
        return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data, bunch.target


def load(name: str, seed: int = 0) -> Dataset:
    """The data of a model: ``digits`` (bundled with scikit-learn), or synthetic for the others."""
    rng = np.random.default_rng(seed)
    if name == "digits":
        pixels, labels = digits()
        x = (pixels / 16.0).astype(np.float32)
        y = labels.astype(np.int64)
        order = rng.permutation(len(x))
        x, y = x[order], y[order]
        cut = int(0.8 * len(x))
        return Dataset(x[:cut], y[:cut], x[cut:], y[cut:])
    spec = model(name)
    n = 4096
    centers = rng.standard_normal((spec.widths[-1], spec.widths[0])).astype(np.float32)
    y = rng.integers(0, spec.widths[-1], n)
    x = centers[y] + 0.5 * rng.standard_normal((n, spec.widths[0])).astype(np.float32)
    cut = int(0.9 * n)
    return Dataset(x[:cut], y[:cut], x[cut:], y[cut:])


def batch_at(
    data: Dataset, rank: int, world: int, batch: int, step: int, seed: int = 0
) -> tuple[Array, Array]:
    """Worker ``rank``'s batch at ``step``: rows of its shard (``rank::world``), reshuffled every
    epoch. A pure function of its arguments, so a resumed run sees the same batches and the union
    of all workers' batches at a step is well defined."""
    x, y = data.x_train[rank::world], data.y_train[rank::world]
    per_epoch = len(x) // batch
    if per_epoch == 0:
        raise ValueError(
            f"batch {batch} is larger than worker {rank}'s shard of {len(x)} rows (the training "
            f"set split over {world} worker(s)): give a --batch of at most {len(x)}"
        )
    epoch, k = divmod(step, per_epoch)
    idx = _epoch_order(len(x), seed, rank, epoch)[k * batch : (k + 1) * batch]
    return x[idx], y[idx]


@functools.lru_cache(maxsize=4)
def _epoch_order(rows: int, seed: int, rank: int, epoch: int) -> Array:
    """The order of a shard's rows in one epoch, made once per epoch rather than at every step
    (a generator seeded from the tuple and a permutation: about 45 us, most of batch_at)."""
    order = np.random.default_rng((seed, rank, epoch)).permutation(rows)
    order.flags.writeable = False  # (shared by the epoch's steps)
    return order
