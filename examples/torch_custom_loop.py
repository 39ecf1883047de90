"""A training loop of your own, in PyTorch, against the parameter servers (``PSClient``).

    python examples/torch_custom_loop.py            # starts a local server, trains, reports

The module's parameters are bound to the buffers the servers write (``bind_module``: no copy);
each step waits for fresh parameters, runs forward and backward, and pushes ``param.grad``.
"""

from __future__ import annotations

import argparse
import subprocess

import torch
import torch.nn.functional as F

from tensorwire.client import models
from tensorwire.client.launch import ps_command
from tensorwire.client.psclient import PSClient
from tensorwire.client.torch_task import (
    bind_module,
    frozen_digest,
    module_grads,
    trainable_parameters,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--servers", default="tcp://127.0.0.1:5711")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--no-server", action="store_true", help="the servers are already up")
    args = parser.parse_args()
    server = None
    if not args.no_server:
        server = subprocess.Popen(
            ps_command(
                args.servers,
                *("--steps", str(args.steps), "--optimizer", "momentum", "--lr", "0.05"),
                *("--no-progress", "--log-level", "WARNING"),
            )
        )
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    data = models.load("digits")
    x_test, y_test = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
    params = trainable_parameters(model)  # what the servers train (a frozen one stays here)
    try:
        with PSClient(
            args.servers.split(","),
            rank=0,
            shapes={n: tuple(p.shape) for n, p in params.items()},
            init={n: p.detach().numpy() for n, p in params.items()},
            fixed=frozen_digest(model),  # (frozen parameters: every worker's must be the same)
        ) as ps:
            bind_module(model, ps.params)
            while (step := ps.wait_params()) is not None:
                x, y = models.batch_at(data, 0, 1, 64, step)
                x_t, y_t = torch.from_numpy(x), torch.from_numpy(y)
                model.zero_grad()
                loss = F.cross_entropy(model(x_t), y_t)
                loss.backward()
                ps.push(module_grads(model), loss=float(loss), samples=len(y))
                if step % 100 == 0:
                    print(f"step {step}: loss {float(loss):.4f}")
            with torch.no_grad():
                acc = float((model(x_test).argmax(dim=1) == y_test).float().mean())
            print(f"final test accuracy {acc:.4f}")
    finally:
        if server is not None:
            server.wait(60)
    return 0 if acc >= 0.9 else 1


if __name__ == "__main__":
    raise SystemExit(main())
