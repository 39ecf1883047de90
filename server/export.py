"""``tensorwire export``: a model's parameters put together from its parameter servers'
checkpoints, written as a worker's ``--save-params`` writes them.

Each server checkpoints its own shard (``ps-shardN.npz`` in its ``--checkpoint-dir``), in
chunks named by the job's plan. The parameters of a job are therefore in its servers'
checkpoints when no worker wrote them: the workers were stopped, or the one given
``--save-params`` was started again after the job ended (it then trains nothing, and says so),
or the job is still running and its last checkpoint is wanted. This module reads the
checkpoints, checks that they are the shards of one job, each once, and writes one ``.npz`` of
the parameters by name, in the model's order: the float32 values the servers keep (with
``--wire-dtype bfloat16`` the workers held them rounded to 16 bits; these are not).
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import sys
from typing import Any

import numpy as np

from tensorwire.job.argtypes import add_version
from tensorwire.job.files import output_file, write_arrays
from tensorwire.job.plan import plan

from . import checkpoint
from .checkpoint import Layout

Array = np.ndarray[Any, Any]


class ExportError(Exception):
    """What keeps the checkpoints given from making one model, in words."""


def build_parser(prog: str = "tensorwire export") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Write a model's parameters, by name, from its parameter servers' "
        "checkpoints (one ps-shardN.npz a server, in its --checkpoint-dir), as a worker's "
        "--save-params writes them.",
    )
    add_version(p)
    p.add_argument(
        "checkpoints",
        nargs="+",
        metavar="PATH",
        help="a server's checkpoint file, or a directory holding them (ps-shard*.npz): one of "
        "each shard of the job, from every server's --checkpoint-dir",
    )
    p.add_argument(
        "--out",
        required=True,
        type=output_file,
        metavar="FILE",
        help="the .npz file to write (.npz is added where the name lacks it)",
    )
    return p


def find(paths: list[str]) -> list[str]:
    """The checkpoint files ``paths`` name: files as given, and each directory's
    ``ps-shard*.npz``. ExportError for a path that is neither, or a directory without one."""
    found: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            inside = sorted(glob.glob(os.path.join(glob.escape(path), checkpoint.NAME_PATTERN)))
            if not inside:
                raise ExportError(
                    f"{path} holds no parameter-server checkpoint ({checkpoint.NAME_PATTERN})"
                )
            found += inside
        elif os.path.exists(path):
            found.append(path)
        else:
            raise ExportError(f"{path}: no such file or directory")
    return found


def one_job(layouts: list[Layout]) -> list[Layout]:
    """The shards of one job, in shard order: ExportError where checkpoints of another model or
    another sharding are mixed in, a shard is given twice, or one is missing."""
    first = layouts[0]
    for other in layouts[1:]:
        if (other.model, other.shards, other.split_bytes) != (
            first.model,
            first.shards,
            first.split_bytes,
        ):
            raise ExportError(
                f"{first.path} and {other.path} are checkpoints of different jobs ("
                + _describe(first)
                + "; "
                + _describe(other)
                + ")"
            )
    by_shard: dict[int, Layout] = {}
    for layout in layouts:
        seen = by_shard.get(layout.shard)
        if seen is not None and os.path.realpath(seen.path) != os.path.realpath(layout.path):
            raise ExportError(
                f"{seen.path} and {layout.path} are both shard {layout.shard}: give one of each"
            )
        by_shard[layout.shard] = layout
    missing = [s for s in range(first.shards) if s not in by_shard]
    if missing:
        names = ", ".join(f"ps-shard{s}.npz" for s in missing)
        raise ExportError(
            f"the job has {first.shards} shards and no checkpoint of "
            f"{'shard' if len(missing) == 1 else 'shards'} {', '.join(map(str, missing))} was "
            f"given ({names}: each server writes its own, in its --checkpoint-dir)"
        )
    return [by_shard[s] for s in range(first.shards)]


def _describe(layout: Layout) -> str:
    return (
        f"model {layout.model}, {layout.shards} shard{'s' if layout.shards != 1 else ''}, "
        f"split at {layout.split_bytes} bytes"
    )


def assemble(shards: list[Layout]) -> dict[str, Array]:
    """The parameters by name, in the model's order, from one job's ``shards``
    (:func:`one_job`): each chunk of the job's plan from the checkpoint of the shard that owns
    it. ExportError for a chunk missing or of another shape (a damaged file)."""
    specs = shards[0].specs
    params = {name: np.empty(shape, dtype) for name, (shape, dtype) in specs.items()}
    chunks = plan({n: shape for n, (shape, _) in specs.items()}, len(shards), shards[0].split_bytes)
    held = {layout.shard: checkpoint.params_in(layout.path) for layout in shards}
    for c in chunks:
        value = held[c.server].get(c.cid)
        if value is None or value.shape != c.shape:
            what = "lacks it" if value is None else f"holds it as {list(value.shape)}"
            raise ExportError(
                f"{shards[c.server].path}: chunk {c.cid} of parameter {c.param!r} "
                f"({list(c.shape)}) is not there as planned: the file {what}"
            )
        if params[c.param].ndim == 0:
            params[c.param][...] = value
        else:
            params[c.param][c.start : c.stop] = value
    return params


def main(argv: list[str] | None = None, prog: str = "tensorwire export") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        try:
            layouts = [checkpoint.layout_of(path) for path in find(args.checkpoints)]
        except checkpoint.DamagedCheckpointError as exc:  # a damaged file, or no checkpoint
            raise ExportError(exc.reason) from None
        shards = one_job(layouts)
        params = assemble(shards)
    except ExportError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    steps = sorted({layout.step for layout in shards})
    if len(steps) > 1:
        # Normal under asp and ssp (each server counts steps on its own); under bsp, a server
        # that checkpointed last before the others (one that failed): the values mix steps.
        each = ", ".join(f"shard {layout.shard} at step {layout.step}" for layout in shards)
        print(f"{prog}: the shards were checkpointed at different steps: {each}", file=sys.stderr)
    try:
        written = write_arrays(args.out, params)
    except OSError as exc:
        print(f"{prog}: error: cannot write --out {args.out}: {exc.strerror}", file=sys.stderr)
        return 1
    values = sum(math.prod(v.shape) for v in params.values())
    at = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]} to {steps[-1]}"
    print(
        f"wrote {len(params)} parameters ({values:,} values) of {at}, from "
        f"{len(shards)} shard{'s' if len(shards) != 1 else ''}, to {written}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
