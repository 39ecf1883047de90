"""A PyTorch ``nn.Module`` as a worker's task: its parameters *are* the registered buffers.

:meth:`TorchTask.bind` points every parameter's storage at the buffer the servers write
(``torch.from_numpy``: no copy), so a server's write lands in the memory the next forward pass
reads. The gradients go out from ``param.grad`` without a copy. Trained with the factory's loss
function on the module's output (cross-entropy where it gives none).

Only the parameters that train (``requires_grad``) go to the servers. A frozen one (a
fine-tuned model's backbone) stays the module's own on each worker, as its buffers do: it is not
sent, no gradient of it is pushed, and no optimizer step (weight decay, momentum) touches it. The
factory builds it the same on every worker (from a seed, or the pretrained weights it loads);
``--save-params`` writes it with the buffers, so that the worker's file loads whole.

On a GPU (``device="cuda"``, the worker's ``--device``) the module is moved there, the client
registers the parameters' buffers in GPU memory, and each parameter is bound to its buffer through
DLPack (``torch.from_dlpack`` of the cupy array the receiver hands out: the same memory); the
batches are moved to the GPU before the forward pass and the gradients leave from GPU memory.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from . import models
from .tasks import JobInfo, StepResult

log = logging.getLogger("tensorwire.worker")

Array = np.ndarray[Any, Any]


def trainable_parameters(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """``module``'s parameters that train (``requires_grad``), by name: what the servers keep.
    A parameter shared by two layers (tied weights) is named once, as ``named_parameters``
    names it."""
    return {n: p for n, p in module.named_parameters() if p.requires_grad}


def frozen_digest(module: torch.nn.Module) -> str | None:
    """A digest of ``module``'s frozen parameters (names, dtypes, shapes and values), which no
    server keeps and every worker must build the same; None where it has none. Given to
    ``PSClient(fixed=...)``, it lets the servers refuse a worker whose frozen layers differ
    (an unseeded factory) rather than train on with workers that compute otherwise."""
    frozen = [(n, p) for n, p in module.named_parameters() if not p.requires_grad]
    if not frozen:
        return None
    digest = hashlib.sha256()
    for name, p in frozen:
        digest.update(f"{name}:{p.dtype}:{tuple(p.shape)};".encode())
        # the bytes as they are (a bfloat16 one has no numpy dtype: viewed as bytes)
        digest.update(p.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:32]


def bind_module(module: torch.nn.Module, params: Mapping[str, Array]) -> None:
    """Point every parameter of ``module`` that trains at ``params[name]`` (``PSClient.params``):
    no copy, so what the servers write is what the next forward pass reads. A frozen one
    (``requires_grad=False``) is bound too where ``params`` has it, and otherwise left as it is;
    KeyError names a trainable parameter ``params`` lacks."""
    with warnings.catch_warnings():
        # The buffers are read-only to us (the servers write them); torch warns that it cannot
        # mark a tensor read-only. The model only reads its parameters.
        warnings.simplefilter("ignore", UserWarning)
        for name, p in module.named_parameters():
            buffer = params.get(name)
            if buffer is None:
                if not p.requires_grad:
                    continue
                raise KeyError(
                    f"parameter {name!r} trains (requires_grad) and the servers hold no buffer "
                    "for it: give the PSClient the shapes of trainable_parameters(module)"
                )
            if isinstance(buffer, np.ndarray):
                p.data = torch.from_numpy(buffer)
            else:  # a GPU buffer (cupy): shared through DLPack, no copy
                p.data = torch.from_dlpack(buffer)


def module_state(module: torch.nn.Module) -> dict[str, Array]:
    """The entries of ``module``'s ``state_dict`` that the servers do not keep (its persistent
    buffers: batch norm's running statistics and batch count; and its frozen parameters),
    copied to host numpy arrays by name; one in a dtype numpy lacks (bfloat16, float8) as
    float32, which holds it exactly."""
    params = set(trainable_parameters(module))
    state: dict[str, Array] = {}
    for name, value in module.state_dict().items():
        if name in params or not isinstance(value, torch.Tensor):
            continue
        host = value.detach().cpu()
        try:
            state[name] = host.numpy().copy()
        except TypeError:  # "Got unsupported ScalarType BFloat16": widened, exactly
            # (an .npz keeps an ml_dtypes array as bare bytes, "V2"; load_state_dict copies
            # float32 back into the buffer's own dtype)
            state[name] = host.float().numpy()
    return state


def module_grads(module: torch.nn.Module) -> dict[str, Any]:
    """The gradient of every parameter that trains, without a copy, for ``PSClient.push``:
    numpy views on the CPU, the CUDA tensors themselves on a GPU (the transport reads GPU
    memory directly); None for one the forward pass did not use (its ``grad`` is None), which
    the servers then leave as it is, as PyTorch's optimizers do; a sparse gradient made dense
    (a copy). A frozen parameter has none."""
    return {n: _grad_of(p) for n, p in trainable_parameters(module).items()}


def _grad_of(p: torch.nn.Parameter) -> Any:
    g = p.grad
    if g is None:
        return None
    if g.layout != torch.strided:
        # a sparse gradient (nn.Embedding(sparse=True): the rows the batch looked up): the
        # servers keep dense parameters and step every row of a chunk, so it goes dense, as
        # a copy; before, numpy() refused it with a traceback at the first step
        g = g.to_dense()
    return g.detach() if g.is_cuda else g.detach().numpy()


def class_scores(out: Any) -> torch.Tensor | None:
    """The class scores in a module's output: the output itself where it is a tensor, its
    ``logits`` (a Hugging Face ``ModelOutput``, a dict), or the first item of a tuple or list
    (a model returning ``(logits, hidden)``); None where it holds none of these."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping) and isinstance(out.get("logits"), torch.Tensor):
        return out["logits"]
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def cross_entropy(out: Any, y: torch.Tensor) -> torch.Tensor:
    """The loss a module is trained on where its factory gives none: cross-entropy of its class
    scores (:func:`class_scores`) against integer labels (or class probabilities), averaged.
    Scores of one more axis than the labels, whose leading axes are the labels' (a sequence
    model's ``(batch, tokens, vocabulary)`` against ``(batch, tokens)``), have their classes on
    the last axis, and each token counts (label -100 is left out, as PyTorch's default);
    otherwise the classes are on axis 1, as ``F.cross_entropy`` takes them. Before, a sequence
    model's logits went to ``F.cross_entropy`` as they were, which took the tokens for the
    classes (an error, or a wrong loss where there were as many tokens as classes), and an
    output that was no tensor ended in its TypeError."""
    scores = class_scores(out)
    if scores is None:
        raise TypeError(
            f"the module returned a {type(out).__name__}, in which the default loss "
            "(cross-entropy) finds no class scores (a tensor; a dict or ModelOutput with "
            "'logits'; a tuple whose first item is a tensor): give the factory a loss of its "
            "own, (model, batches, evaluate, loss) with loss(output, y)"
        )
    if scores.ndim > 2 and _per_position(scores, y):
        return F.cross_entropy(scores.flatten(0, -2), y.flatten())
    return F.cross_entropy(scores, y)


def _per_position(scores: torch.Tensor, y: torch.Tensor) -> bool:
    """``scores`` hold a class score vector, on their last axis, for each of ``y``'s labels."""
    return not y.is_floating_point() and scores.ndim == y.ndim + 1 and scores.shape[:-1] == y.shape


def _say_if_moved_off_a_gpu(module: torch.nn.Module, device: str) -> None:
    """A factory that built its module on a GPU, for a worker that trains elsewhere (its
    ``--device``, cpu by default): the module is moved there, as ``--device`` says, and the
    operator is told, as a GPU job that runs on the CPU is otherwise only slow."""
    built_on = {
        str(p.device)
        for p in module.parameters()
        if p.device.type == "cuda" and not isinstance(p, torch.nn.parameter.UninitializedParameter)
    } - {device}
    if built_on:
        log.warning(
            "the model factory built the module on %s; this worker trains on %s (--device), "
            "so it is moved there (pass --device %s to train it where it was built)",
            ", ".join(sorted(built_on)),
            device,
            sorted(built_on)[0],
        )


class TorchTask:
    framework = "torch"

    def __init__(
        self,
        module: torch.nn.Module,
        batches: Callable[[int], tuple[Any, Any]],
        evaluate: Callable[[torch.nn.Module], float],
        device: str = "cpu",
        *,
        loss: Callable[[Any, Any], torch.Tensor] | None = None,
    ) -> None:
        """``device``: where the module trains (``cpu``, ``cuda``, ``cuda:N``); it is moved
        there, and ``evaluate`` is given it there. ``loss(output, y)``: the scalar the module is
        trained on (:func:`cross_entropy` when None)."""
        self.module, self.batches, self._evaluate = module, batches, evaluate
        if loss is not None and not callable(loss):
            raise TypeError(
                f"the factory's loss must be a function of (output, y), got {type(loss).__name__}"
            )
        self._loss = cross_entropy if loss is None else loss
        try:
            self.torch_device = torch.device(device)
        except RuntimeError:  # torch's message lists every backend it knows
            raise ValueError(f"device {device!r}: use cpu, cuda or cuda:N") from None
        if self.torch_device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device {device!r}: this torch build or machine has no CUDA")
            if self.torch_device.index is None:
                self.torch_device = torch.device("cuda", torch.cuda.current_device())
        elif self.torch_device.type != "cpu":
            raise ValueError(f"device {device!r}: use cpu, cuda or cuda:N")
        #: where the parameters' buffers live, as tensorwire names it (``cpu`` or ``cuda:N``)
        self.device = str(self.torch_device)
        _say_if_moved_off_a_gpu(module, self.device)
        module.to(self.torch_device)
        self._materialize()
        self._params = trainable_parameters(module)
        #: the parameters frozen as the job started: they must stay so (the servers lack them)
        self._frozen = {n: p for n, p in module.named_parameters() if not p.requires_grad}
        if not self._params:
            raise ValueError(
                "the module has no parameter to train"
                + (
                    f" (all {len(self._frozen)} of its parameters are frozen: requires_grad=False)"
                    if self._frozen
                    else ""
                )
            )
        odd = [n for n, p in self._params.items() if p.dtype != torch.float32]
        if odd:
            dtype = str(self._params[odd[0]].dtype).removeprefix("torch.")
            raise TypeError(
                f"parameter {odd[0]!r} is {dtype} ({len(odd)} of the module's "
                f"{len(self._params)} that train are not float32): the servers keep float32 "
                "parameters, so build the module in float32 (module.float()); for 16-bit "
                "compute, torch.autocast in the forward pass, and 16-bit traffic with the "
                "servers' --wire-dtype bfloat16"
            )

    def initial_params(self) -> dict[str, Array]:
        return {n: p.detach().cpu().numpy().copy() for n, p in self._params.items()}

    def bind(self, params: Mapping[str, Array]) -> None:
        bind_module(self.module, params)

    def fixed(self) -> str | None:
        """What every worker must hold the same besides the parameters: its frozen ones."""
        return frozen_digest(self.module)

    def state(self) -> dict[str, Array]:
        """What of the module's state_dict the servers do not keep (its buffers and its frozen
        parameters), as this worker kept it: ``--save-params`` writes it beside the
        parameters."""
        return module_state(self.module)

    def step(self, step: int) -> StepResult:
        for p in self._params.values():
            p.grad = None
        out, y, loss = self.loss_at(step)
        loss.backward()
        for n, p in self._frozen.items():
            if p.grad is not None:
                raise RuntimeError(
                    f"parameter {n!r} was frozen (requires_grad=False) when the job started "
                    "and now has a gradient: the servers keep only the parameters that trained "
                    "from the start, so start the job again with it unfrozen"
                )
        grads = {n: _grad_of(p) for n, p in self._params.items()}
        # the predictions that hit, where the output scores classes of integer labels (per
        # token for a sequence's); else none is counted (a regression)
        scores = class_scores(out)
        correct, samples = 0, len(y)
        if scores is not None and _per_position(scores, y):
            correct, samples = int((scores.argmax(dim=-1) == y).sum()), y.numel()
        return StepResult(float(loss.detach()), grads, correct, samples)

    def loss_at(
        self, step: int, through: Callable[..., Any] | None = None
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """This worker's batch of ``step`` forward, in training mode, through the module or
        ``through`` (a wrapper of it, such as ``DistributedDataParallel``, which
        ``tensorwire bench ps --ddp`` trains): the output, the labels on the device, and the
        loss, checked to be a scalar one ``backward()`` can start from."""
        x, y = self.batches(step)
        x = self._on_device(x)
        y = torch.as_tensor(y).to(self.torch_device, non_blocking=True)
        self.module.train()
        out = self._forward(x, through)
        loss = self._loss(out, y)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.grad_fn is None:
            raise TypeError(
                "the loss function must return a scalar tensor computed from the output (one "
                "backward() can start from); it returned "
                + (
                    f"a tensor of shape {tuple(loss.shape)}"
                    + ("" if loss.grad_fn is not None else " with no gradient to follow")
                    if isinstance(loss, torch.Tensor)
                    else type(loss).__name__
                )
            )
        return out, y, loss

    def _forward(self, x: Any, through: Callable[..., Any] | None = None) -> Any:
        """The output of the module (or of ``through``) for input ``x``: a model of several
        inputs takes a tuple of them as its arguments, a dict as its keywords (a transformer's
        input_ids and attention_mask)."""
        module = self.module if through is None else through
        if isinstance(x, dict):
            return module(**x)
        if isinstance(x, tuple):
            return module(*x)
        return module(x)

    def _materialize(self) -> None:
        """Give a lazy module's parameters (``nn.LazyLinear``: no shape until a first forward
        pass) their shapes, by a forward pass of the first batch without gradients, in eval
        mode (batch norm's statistics untouched): the servers need every parameter's shape
        as the worker joins. Their values need no care: the job starts from rank 0's. Before,
        the worker stopped naming torch's UninitializedParameter."""
        lazy = torch.nn.parameter.UninitializedParameter
        if not any(isinstance(p, lazy) for p in self.module.parameters()):
            return
        x, _ = self.batches(0)
        x = self._on_device(x)
        self.module.eval()
        with torch.no_grad():
            self._forward(x)
        left = [n for n, p in self.module.named_parameters() if isinstance(p, lazy)]
        if left:
            raise ValueError(
                f"parameter {left[0]!r} has no shape yet after a forward pass of the first "
                "batch (a lazy module the batch does not reach): run one in the factory"
            )

    def _on_device(self, x: Any) -> Any:
        """A batch's input on the module's device: an array or a tensor, or a tuple or dict
        of them."""
        if isinstance(x, dict):
            return {k: self._on_device(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return tuple(self._on_device(v) for v in x)
        return torch.as_tensor(x).to(self.torch_device, non_blocking=True)

    def evaluate(self) -> float:
        self.module.eval()
        with torch.no_grad():
            return float(self._evaluate(self.module))


class BuiltinMlp(torch.nn.Module):
    """A built-in MLP of :mod:`.models` as a torch module (``--framework torch``): the same
    parameter names, shapes (weights stored input by output) and initial values as the numpy
    model, so the two frameworks train the same network from the same start."""

    def __init__(self, spec: models.ModelSpec, seed: int) -> None:
        super().__init__()
        self.depth = spec.layers
        self.residual = spec.residual
        for name, value in spec.init(seed).items():
            layer, _, kind = name.partition(".")
            if not hasattr(self, layer):
                self.add_module(layer, torch.nn.Module())
            getattr(self, layer).register_parameter(
                kind, torch.nn.Parameter(torch.from_numpy(value))
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for i in range(self.depth):
            layer = getattr(self, f"layer{i}")
            z = h @ layer.weight + layer.bias
            if i == self.depth - 1:
                h = z
            elif self.residual:
                # the input cut or zero-padded to the layer's width, as models.forward does
                width = z.shape[1]
                carried = torch.nn.functional.pad(h[:, :width], (0, max(width - h.shape[1], 0)))
                h = carried + self.residual * torch.tanh(z)
            else:
                h = torch.relu(z)
        return h


def builtin(name: str) -> Callable[[JobInfo], tuple[torch.nn.Module, Any, Any]]:
    """The factory of built-in model ``name`` in PyTorch: its MLP, data and batches."""

    def factory(job: JobInfo) -> tuple[torch.nn.Module, Any, Any]:
        spec = models.model(name)
        data = models.load(name, job.seed)

        def batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            x, y = models.batch_at(data, job.rank, job.workers, job.batch, step, job.seed)
            return torch.from_numpy(x), torch.from_numpy(y)

        x_test, y_test = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)

        def evaluate(model: torch.nn.Module) -> float:
            device = next(model.parameters()).device  # the worker's --device
            return float((model(x_test.to(device)).argmax(dim=1).cpu() == y_test).float().mean())

        return BuiltinMlp(spec, job.seed), batches, evaluate

    return factory
