"""Checkpoints of a parameter-server shard: parameters and optimizer state, written atomically.

The file is written beside its final name and renamed over it, so a crash mid-write leaves the
previous checkpoint intact (and its partial file, which the next checkpoint written removes).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from tensorwire.job import files

Array = np.ndarray[Any, Any]


def unusable(directory: str) -> str | None:
    """Why checkpoints cannot be written in ``directory`` (created if missing), or None. Checked
    when the daemon starts, not at its first checkpoint."""
    return files.unwritable_directory(directory)


def path_for(directory: str, shard: int) -> str:
    return os.path.join(directory, f"ps-shard{shard}.npz")


def save(
    path: str,
    step: int,
    params: dict[str, Array],
    state: dict[str, dict[str, Any]],
    fingerprint: str,
    specs: dict[str, tuple[tuple[int, ...], str]],
) -> None:
    arrays: dict[str, Any] = {
        "__step__": np.int64(step),
        "__fingerprint__": np.array(fingerprint),
        # the parameters' specs the job was started with: a resumed server knows them at once
        "__specs__": np.array(json.dumps([[n, list(sh), dt] for n, (sh, dt) in specs.items()])),
    }
    for key, value in params.items():
        arrays[f"p:{key}"] = value
    for key, slots in state.items():
        for slot, value in slots.items():
            arrays[f"s:{key}:{slot}"] = value
    files.write_whole(path, lambda f: np.savez(f, **arrays))


def specs_in(path: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """The parameters' specs a checkpoint was written for."""
    with np.load(path, allow_pickle=False) as data:
        listed = json.loads(str(data["__specs__"]))
    return {str(n): (tuple(int(d) for d in shape), str(dt)) for n, shape, dt in listed}


def load(path: str, fingerprint: str) -> tuple[int, dict[str, Array], dict[str, dict[str, Any]]]:
    """Return ``(step, params, optimizer state)``; refuses a checkpoint of another setup."""
    with np.load(path, allow_pickle=False) as data:
        found = str(data["__fingerprint__"])
        if found != fingerprint:
            raise ValueError(
                f"checkpoint {path} was written for {found!r}, not for this setup {fingerprint!r}"
            )
        step = int(data["__step__"])
        params: dict[str, Array] = {}
        state: dict[str, dict[str, Any]] = {}
        for name in data.files:
            if name.startswith("p:"):
                params[name[2:]] = data[name].copy()
            elif name.startswith("s:"):
                key, slot = name[2:].rsplit(":", 1)
                state.setdefault(key, {})[slot] = data[name].copy()
    return step, params, state
