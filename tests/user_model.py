"""A user's model factory, as ``tensorwire-worker --model tests.user_model:make`` imports it: a
numpy softmax regression on the digits, written against tensorwire.client.tasks only."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorwire.client import models
from tensorwire.client.tasks import JobInfo


class Softmax:
    def initial_params(self) -> dict[str, Any]:
        return {"w": np.zeros((64, 10), np.float32), "b": np.zeros(10, np.float32)}

    def loss_and_grads(self, params: Any, x: Any, y: Any) -> tuple[float, dict[str, Any], int]:
        logits = x @ params["w"] + params["b"]
        logits = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
        correct = int((p.argmax(axis=1) == y).sum())
        p[np.arange(len(y)), y] -= 1.0
        p /= len(y)
        return loss, {"w": (x.T @ p).astype(np.float32), "b": p.sum(axis=0)}, correct


def make(job: JobInfo) -> tuple[Softmax, Any, Any]:
    data = models.load("digits", job.seed)

    def batches(step: int) -> Any:
        return models.batch_at(data, job.rank, job.workers, job.batch, step, job.seed)

    def evaluate(params: Any) -> float:
        logits = data.x_test @ params["w"] + params["b"]
        return float((logits.argmax(axis=1) == data.y_test).mean())

    return Softmax(), batches, evaluate


def make_failing_evaluation(job: JobInfo) -> tuple[Softmax, Any, Any]:
    """``make``, whose evaluation raises (as a model on a GPU evaluated on host data does)."""
    model, batches, _ = make(job)

    def evaluate(params: Any) -> float:
        raise RuntimeError("Expected all tensors to be on the same device")

    return model, batches, evaluate


def make_running_out(job: JobInfo) -> tuple[Softmax, Any, Any]:
    """``make``, whose batches slice the data by the step without going round it: empty once
    the steps pass the end of the training set (1437 rows: step 23 with two workers of 32)."""
    model, _, evaluate = make(job)
    data = models.load("digits", job.seed)

    def batches(step: int) -> Any:
        lo = (step * job.workers + job.rank) * job.batch
        return data.x_train[lo : lo + job.batch], data.y_train[lo : lo + job.batch]

    return model, batches, evaluate
