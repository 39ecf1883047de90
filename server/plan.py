"""The parameter-server protocol: how parameters are sharded and what every tensor is called.

Both ends derive everything from here. A server registers, for each worker, one gradient tensor per
parameter chunk it owns; a worker registers each parameter with :meth:`Receiver.register_parts`,
one part per chunk, so the servers' writes land side by side in the model's own parameter storage.
A worker learns the plan from the servers' address books (the gradient tensors they publish), so a
worker can never disagree with the servers about it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

ITEM = 4  # float32 parameters

# status word flags, written by a server to a worker with every parameter update
STATUS_RUN = 0
STATUS_STOP = 1
STATUS_FIELDS = 4  # [step, flags, applied updates, reserved]
META_FIELDS = 5  # [step, loss, correct, batch size, test accuracy or -1]


@dataclass(frozen=True)
class Chunk:
    param: str
    part: int
    start: int
    stop: int
    shape: tuple[int, ...]
    server: int

    @property
    def cid(self) -> str:
        return f"{self.param}@{self.part}"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEM


def plan(shapes: dict[str, tuple[int, ...]], servers: int, split_bytes: int) -> list[Chunk]:
    """Split tensors above ``split_bytes`` along their first axis and balance chunks by bytes."""
    if servers < 1:
        raise ValueError("at least one server is needed")
    pieces: list[tuple[str, int, int, int, tuple[int, ...]]] = []
    for name, shape in shapes.items():
        rows = shape[0] if shape else 1
        nbytes = math.prod(shape) * ITEM
        k = max(1, min(rows, math.ceil(nbytes / split_bytes))) if shape else 1
        bounds = [round(i * rows / k) for i in range(k + 1)]
        for part in range(k):
            lo, hi = bounds[part], bounds[part + 1]
            pieces.append((name, part, lo, hi, (hi - lo, *shape[1:]) if shape else ()))
    load = [0] * servers
    owner: dict[tuple[str, int], int] = {}
    for name, part, _, _, shape in sorted(pieces, key=lambda p: (-math.prod(p[4]), p[0], p[1])):
        s = min(range(servers), key=lambda i: (load[i], i))
        owner[(name, part)] = s
        load[s] += math.prod(shape) * ITEM
    return [Chunk(n, p, lo, hi, shp, owner[(n, p)]) for n, p, lo, hi, shp in pieces]


def grad_name(rank: int, cid: str) -> str:
    return f"grad/{rank}/{cid}"


_GRAD = re.compile(r"^grad/(\d+)/(.+)@(\d+)$")


def parse_grad_name(name: str) -> tuple[int, str, int] | None:
    m = _GRAD.match(name)
    return (int(m.group(1)), m.group(2), int(m.group(3))) if m else None


def meta_name(rank: int) -> str:
    return f"meta/{rank}"


def join_name(rank: int) -> str:
    return f"join/{rank}"


def status_name(server: int) -> str:
    return f"status/{server}"
