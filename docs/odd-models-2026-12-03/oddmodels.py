"""Odd torch models as worker factories."""

from __future__ import annotations

import os

import torch
from torch import nn

from tensorwire.client import models


def _wrap(module, job):
    torch.set_num_threads(1)
    data = models.load("digits", job.seed)

    def batches(step):
        x, y = models.batch_at(data, job.rank, job.workers, job.batch, step, job.seed)
        return torch.from_numpy(x), torch.from_numpy(y)

    def evaluate(model):
        with torch.no_grad():
            return float(
                (model(torch.from_numpy(data.x_test)).argmax(1) == torch.from_numpy(data.y_test))
                .float()
                .mean()
            )

    return module, batches, evaluate


def frozen(job):
    torch.manual_seed(job.seed)
    m = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    for p in m[0].parameters():
        p.requires_grad_(False)
    return _wrap(m, job)


class Scalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 10)
        self.temp = nn.Parameter(torch.tensor(1.0))

    def forward(self, x):
        return self.lin(x) * self.temp


def scalar(job):
    torch.manual_seed(job.seed)
    return _wrap(Scalar(), job)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 64, bias=False)
        self.b = nn.Linear(64, 64, bias=False)
        self.b.weight = self.a.weight
        self.out = nn.Linear(64, 10)

    def forward(self, x):
        return self.out(torch.relu(self.b(torch.relu(self.a(x)))))


def tied(job):
    torch.manual_seed(job.seed)
    return _wrap(Tied(), job)


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 10)
        self.spare = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


def unused(job):
    torch.manual_seed(job.seed)
    return _wrap(Unused(), job)


def allfrozen(job):
    torch.manual_seed(job.seed)
    m = nn.Linear(64, 10)
    m.requires_grad_(False)
    return _wrap(m, job)


class NoParams(nn.Module):
    def forward(self, x):
        return x[:, :10]


def noparams(job):
    return _wrap(NoParams(), job)


class Empty(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 10)
        self.none = nn.Parameter(torch.zeros(0, 3))

    def forward(self, x):
        return self.lin(x)


def empty(job):
    torch.manual_seed(job.seed)
    return _wrap(Empty(), job)


class Many(nn.Module):
    def __init__(self, n=500):
        super().__init__()
        self.inp = nn.Linear(64, 16)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(n))
        self.out = nn.Linear(16, 10)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        for layer in self.layers[:2]:
            h = h + 0.01 * layer(h)
        return self.out(h)


def many(job):
    torch.manual_seed(job.seed)
    return _wrap(Many(), job)


def byrank(job):
    torch.manual_seed(job.seed)
    w = 32 if job.rank == 0 else 33
    return _wrap(nn.Sequential(nn.Linear(64, w), nn.ReLU(), nn.Linear(w, 10)), job)


def byrank_names(job):
    torch.manual_seed(job.seed)
    m = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    if job.rank == 1:
        m = nn.Sequential(nn.Identity(), m[0], m[1], m[2])
    return _wrap(m, job)


def switch(job):
    """The model of rank 1 differs when SWITCH is set (a worker restarted with a new image)."""
    torch.manual_seed(job.seed)
    w = 33 if os.environ.get("SWITCH") else 32
    return _wrap(nn.Sequential(nn.Linear(64, w), nn.ReLU(), nn.Linear(w, 10)), job)
