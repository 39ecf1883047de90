"""A training loop of your own on tensorwire's parameter server, without the worker daemon.

Start a server first (or let this script start one for you):

    tensorwire-ps --bind tcp://127.0.0.1:5700 --workers 1 --steps 200 --optimizer adam --lr 0.01

then run ``python examples/custom_loop.py --servers tcp://127.0.0.1:5700``. The loop below owns
its batching and its backward pass; any framework that can hand gradients over as numpy arrays
(or DLPack, through ``np.from_dlpack``) fits in the same place. ``ps.params`` are the buffers the
server writes the fresh parameters into: the next forward pass reads them with no copy.
"""

from __future__ import annotations

import argparse
import subprocess

import numpy as np

from tensorwire.client import models
from tensorwire.client.launch import free_port, ps_command
from tensorwire.client.psclient import PSClient


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", help="server addresses; omitted: start a local server")
    parser.add_argument("--steps", type=int, default=200, help="steps, when starting a server")
    args = parser.parse_args(argv)
    server = None
    if args.servers is None:
        args.servers = f"tcp://127.0.0.1:{free_port()}"
        server = subprocess.Popen(
            ps_command(
                args.servers,
                *("--steps", str(args.steps), "--optimizer", "adam", "--lr", "0.01"),
                *("--no-progress", "--log-level", "WARNING"),
            )
        )
    spec = models.model("digits")
    data = models.load("digits")
    rng = np.random.default_rng(1)
    try:
        with PSClient(
            args.servers.split(","), rank=0, shapes=spec.shapes(), init=spec.init(0)
        ) as ps:
            while (step := ps.wait_params()) is not None:
                idx = rng.choice(len(data.x_train), 64, replace=False)  # our own batching
                loss, grads, correct = models.loss_and_grads(
                    spec, ps.pull(), data.x_train[idx], data.y_train[idx]
                )
                ps.push(grads, loss=loss, correct=correct, samples=len(idx))
                if step % 50 == 0:
                    print(f"step {step}: loss {loss:.4f}")
            acc = models.accuracy(spec, ps.params, data.x_test, data.y_test)
            print(f"final test accuracy {acc:.4f}")
    finally:
        if server is not None:
            server.wait(60)
    return 0 if acc >= 0.9 else 1


if __name__ == "__main__":
    raise SystemExit(main())
