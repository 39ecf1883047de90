"""What a worker trains: a *task* that a factory makes, in numpy or PyTorch.

``tensorwire-worker --model SPEC`` names the factory: ``digits``, ``large`` or ``many`` (the
built-in MLPs of :mod:`.models`, in numpy, or in PyTorch with ``--framework torch``),
``package.module:factory``, or ``path/to/file.py:factory``. A factory is
called with a :class:`JobInfo` (this worker's rank, the number of workers, the batch size, the
seed) and returns either a :class:`Task` or a triple ``(model, batches, evaluate)``, or for a
torch module a quadruple ``(model, batches, evaluate, loss)``:

* ``model``: a ``torch.nn.Module``, or an object with ``initial_params()`` and
  ``loss_and_grads(params, x, y) -> (loss, grads, correct)`` in numpy (``grads[name]`` None for
  a parameter the step did not use: left alone, as PyTorch leaves one whose ``grad`` is None);
* ``batches(step) -> (x, y)``: this worker's batch at a step (a function of the step, so a resumed
  job sees the same batches; called for every step of the job, so it goes round the data, and
  an empty batch stops the worker); for a torch module of several inputs, ``x`` may be a tuple
  of them (its arguments) or a dict (its keywords);
* ``evaluate(model_or_params) -> accuracy`` on held-out data (a torch module is given on the
  worker's ``--device``: move the data there), or any score where higher is better;
* ``loss(output, y) -> scalar tensor`` (torch only): what the module is trained on, such as
  ``torch.nn.functional.mse_loss`` for a regression; cross-entropy on its output's class scores
  when left out (``torch_task.cross_entropy``).

The servers never see any of it: the worker sends them the parameters' specs and (rank 0) their
initial values, and from then on the model reads its parameters from the buffers the servers write.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

import tensorwire as tw

from . import models

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class JobInfo:
    """What a factory is told about the worker it builds for."""

    rank: int
    workers: int
    batch: int
    seed: int


class BatchError(Exception):
    """A factory's ``batches(step)`` gave what no step can train on (an empty batch)."""


def check_batch(step: int, samples: int) -> None:
    """BatchError where step ``step``'s batch held no sample: a step that trains on nothing, and
    whose loss (a mean over nothing) and gradients are NaN for a PyTorch model, pushed to the
    servers and averaged into every worker's parameters. A factory that slices its data by the
    step without going round it gives one once the job's steps outrun the data; before, the
    job went on without a word (an MLP on the digits ended at a test accuracy of 0)."""
    if samples == 0:
        raise BatchError(
            f"batches({step}) gave an empty batch: the factory's data ran out? batches(step) is "
            "called for every step of the job (tensorwire-ps --steps), so it must go round "
            "the data (an index modulo its length, as models.batch_at does)"
        )


@dataclass
class StepResult:
    loss: float
    #: float32, by parameter name (views are fine: read before return); None for a parameter
    #: the step did not use (PSClient.push)
    grads: Mapping[str, Array | None]
    correct: int
    samples: int


@runtime_checkable
class Task(Protocol):
    def initial_params(self) -> dict[str, Array]:
        """The parameters' initial values (float32), in the model's order."""

    def bind(self, params: Mapping[str, Array]) -> None:
        """From now on the model reads its parameters from ``params`` (the buffers the servers
        write, or float32 copies of them)."""

    def step(self, step: int) -> StepResult:
        """Forward and backward on this worker's batch of ``step``."""

    def evaluate(self) -> float:
        """Accuracy on held-out data with the current parameters."""

    # A task may also have ``state() -> {name: array}``: what it keeps of its own besides the
    # parameters, which ``--save-params`` writes beside them (a PyTorch module's buffers); and
    # ``fixed() -> str | None``: a digest of what every worker must hold the same besides the
    # parameters (a PyTorch module's frozen ones), which the servers compare as workers join.


class NumpyTask:
    """A numpy model: ``initial_params()`` and ``loss_and_grads(params, x, y)``."""

    device = "cpu"  # where its parameters' buffers live
    framework = "numpy"

    def __init__(
        self, model: Any, batches: Callable[[int], tuple[Any, Any]], evaluate: Callable[..., float]
    ) -> None:
        self.model, self.batches, self._evaluate = model, batches, evaluate
        self.params: Mapping[str, Array] = {}

    def initial_params(self) -> dict[str, Array]:
        return {k: np.asarray(v, np.float32) for k, v in self.model.initial_params().items()}

    def bind(self, params: Mapping[str, Array]) -> None:
        self.params = params

    def step(self, step: int) -> StepResult:
        x, y = self.batches(step)
        loss, grads, correct = self.model.loss_and_grads(self.params, x, y)
        return StepResult(float(loss), grads, int(correct), len(y))

    def evaluate(self) -> float:
        return float(self._evaluate(self.params))


class _Mlp:
    """The built-in numpy MLPs as a NumpyTask's model."""

    def __init__(self, spec: models.ModelSpec, seed: int) -> None:
        self.spec, self.seed = spec, seed

    def initial_params(self) -> dict[str, Array]:
        return self.spec.init(self.seed)

    def loss_and_grads(self, params: Mapping[str, Array], x: Array, y: Array) -> Any:
        return models.loss_and_grads(self.spec, dict(params), x, y)


def builtin(name: str) -> Callable[[JobInfo], NumpyTask]:
    """The factory of a built-in model (``digits``, ``large``)."""

    def factory(job: JobInfo) -> NumpyTask:
        spec = models.model(name)
        data = models.load(name, job.seed)
        # a batch larger than this worker's shard, refused before it joins the servers (before,
        # a traceback at its first step, the job formed and left waiting for it)
        models.batch_at(data, job.rank, job.workers, job.batch, 0, job.seed)
        return NumpyTask(
            _Mlp(spec, job.seed),
            lambda step: models.batch_at(data, job.rank, job.workers, job.batch, step, job.seed),
            lambda params: models.accuracy(spec, dict(params), data.x_test, data.y_test),
        )

    return factory


#: ``--framework``: ``auto`` takes what the factory builds; the others also insist on it
FRAMEWORKS = ("auto", "numpy", "torch")


def load_factory(spec: str, framework: str = "auto") -> Callable[[JobInfo], Any]:
    """The factory ``spec`` names (see the module's docstring); a built-in model in PyTorch for
    ``framework="torch"``. ValueError says what is wrong."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"--framework {framework!r}: use one of {', '.join(FRAMEWORKS)}")
    if spec in models.MODELS:
        if framework != "torch":
            return builtin(spec)
        try:
            from .torch_task import builtin as torch_builtin
        except ImportError as exc:
            raise ValueError(
                f"--framework torch needs PyTorch ({exc}): pip install 'tensorwire[torch]'"
            ) from None
        return torch_builtin(spec)
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        raise ValueError(
            f"--model {spec!r}: give a built-in model ({', '.join(sorted(models.MODELS))}), "
            "package.module:factory or path/to/file.py:factory"
        )
    try:
        if where.endswith(".py"):
            path = os.path.abspath(where)
            name = f"tensorwire_user_{abs(hash(path))}"
            loader = importlib.util.spec_from_file_location(name, path)
            if loader is None or loader.loader is None:
                raise ImportError(f"cannot load {where}")
            module = importlib.util.module_from_spec(loader)
            sys.modules[name] = module
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except (ImportError, OSError) as exc:
        raise ValueError(f"--model {spec!r}: cannot import {where}: {exc}") from None
    except Exception as exc:  # the user's module failed as it ran: one line, with where
        raise ValueError(
            f"--model {spec!r}: cannot import {where}: {_failure(exc, first_frame=False)}"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"--model {spec!r}: {where} has no callable {attr!r}")
    return factory


def build(factory: Callable[[JobInfo], Any], spec: str, job: JobInfo) -> Any:
    """``factory(job)``; ValueError in one line, naming where the user's code failed, for
    anything it raises (a missing optional dependency passes as it is)."""
    try:
        return factory(job)
    except tw.MissingDependencyError:
        raise
    except Exception as exc:
        raise ValueError(f"model factory {spec!r} failed: {_failure(exc)}") from None


def _failure(exc: BaseException, first_frame: bool = True) -> str:
    """``exc`` in one line, with the file and line of the user's code it came from. A call
    that failed before the factory ran (its traceback no deeper than the caller's own frame)
    is a factory that does not take the job."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SyntaxError):
        return text  # its text names the file and line
    frames = traceback.extract_tb(exc.__traceback__)
    if first_frame and len(frames) <= 1:
        return (
            f"{text} (a factory is called as factory(job), with a tensorwire.client.tasks.JobInfo)"
        )
    if not frames:
        return text
    return f"{text} (at {frames[-1].filename}:{frames[-1].lineno})"


_CPU_ONLY = (
    "numpy models train on the CPU; a GPU needs a torch module (or a ready-made task built on "
    "the GPU, with a 'device' attribute naming it)"
)


def as_task(made: Any, device: str = "cpu") -> Task:
    """What a factory returned, as a :class:`Task` training on ``device`` (``cpu``, ``cuda``,
    ``cuda:N``: a torch module is moved there; numpy models and ready-made tasks train on the
    CPU, and ValueError says so when a GPU is asked of them)."""
    if isinstance(made, Task):
        task_device = getattr(made, "device", "cpu")
        if device != "cpu" and task_device == "cpu":
            raise ValueError(f"device {device!r}: {_CPU_ONLY}")
        return made
    if not (isinstance(made, tuple) and len(made) in (3, 4)):
        raise TypeError(
            "a model factory returns a Task, (model, batches, evaluate) or, for a torch "
            f"module, (model, batches, evaluate, loss); got {_described(made)}"
        )
    model, batches, evaluate, *loss = made
    if _is_torch_module(model):
        from .torch_task import TorchTask

        return TorchTask(model, batches, evaluate, device, loss=loss[0] if loss else None)
    if loss:
        raise TypeError(
            "a numpy model computes its loss in its loss_and_grads: return (model, batches, "
            "evaluate)"
        )
    if device != "cpu":
        raise ValueError(f"device {device!r}: {_CPU_ONLY}")
    return NumpyTask(model, batches, evaluate)


def _described(made: Any) -> str:
    """What a factory returned, for an error: a tuple's length, else its type."""
    if isinstance(made, tuple):
        return f"a tuple of {len(made)}"
    return type(made).__name__


def check_framework(task: Task, framework: str) -> None:
    """ValueError unless ``task`` is in ``framework`` (``auto``: any; a ready-made task that
    does not say which framework it is in passes)."""
    theirs = getattr(task, "framework", None)
    if framework != "auto" and theirs is not None and theirs != framework:
        raise ValueError(f"--framework {framework}: the model factory built a {theirs} model")


def _is_torch_module(model: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)
