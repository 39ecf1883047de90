"""Checkpoints of a parameter-server shard: parameters and optimizer state, written atomically.

The file is written beside its final name and renamed over it, so a crash mid-write leaves the
previous checkpoint intact (and its partial file, which the next checkpoint written removes).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorwire.job import files
from tensorwire.job.plan import Specs, specs_digest

Array = np.ndarray[Any, Any]

#: what reading a damaged file raises, from zipfile, zlib, numpy and json (numpy takes random
#: bytes for a pickle and says to allow pickles, which no checkpoint needs)
_DAMAGE = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, KeyError, OSError, TypeError)


class CheckpointMismatchError(ValueError):
    """A readable checkpoint of another setup (another model, optimizer or shard)."""


class DamagedCheckpointError(ValueError):
    """A file that cannot be read as a checkpoint; ``reason`` says so without the daemon's
    advice (restore it, or move it away to start afresh)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason}; restore a good copy, or move it away to start afresh")
        self.reason = reason


@contextlib.contextmanager
def _reading(path: str) -> Iterator[None]:
    """Turn what a damaged file raises into one ValueError that names the file and what to do
    (a truncated file was zipfile's BadZipFile, an empty one an EOFError: tracebacks)."""
    try:
        yield
    except CheckpointMismatchError:
        raise
    except _DAMAGE as exc:
        what = f"{type(exc).__name__}: {exc}"
        if "allow_pickle" in str(exc):  # numpy's reading of bytes that are no .npz archive
            what = "not a numpy .npz archive"
        raise DamagedCheckpointError(
            f"checkpoint {path} is damaged or no checkpoint ({what})"
        ) from exc


def unusable(directory: str) -> str | None:
    """Why checkpoints cannot be written in ``directory`` (created if missing), or None. Checked
    when the daemon starts, not at its first checkpoint."""
    return files.unwritable_directory(directory)


#: how a shard's checkpoint is named in its --checkpoint-dir
NAME_PATTERN = "ps-shard*.npz"


def path_for(directory: str, shard: int) -> str:
    return os.path.join(directory, f"ps-shard{shard}.npz")


def fingerprint(specs: Specs, shards: int, shard: int, split_bytes: int, optimizer: str) -> str:
    """What a checkpoint was written for: the model (its specs' digest), how the job shards and
    splits it, which shard, and the optimizer whose state it holds. A server resumes only from a
    checkpoint of its own (:func:`load`)."""
    return f"{specs_digest(specs)}/shards={shards}/shard={shard}/split={split_bytes}/{optimizer}"


_FINGERPRINT = re.compile(r"^([0-9a-f]+)/shards=(\d+)/shard=(\d+)/split=(\d+)/(.+)$")


@dataclass(frozen=True)
class Layout:
    """What a checkpoint says of itself, without its arrays' values (:func:`layout_of`)."""

    path: str
    step: int
    model: str  # the specs' digest: one model, one digest
    shards: int
    shard: int
    split_bytes: int
    optimizer: str
    specs: Specs
    #: (asp, ssp) the workers that had done all their steps, by rank, with their steps (none
    #: in a checkpoint written before it said): a resumed server does not wait for them
    finished: dict[int, int]
    #: the workers that had left on their own while the job trained on (plan.LEAVE_ALONE), by
    #: rank, with the job's step then: a resumed server does not wait for them (none in a
    #: checkpoint written before it said)
    left: dict[int, int]
    #: the workers lost (killed, frozen past --step-timeout, their machine gone) that had not
    #: joined again, by rank, with their steps: a resumed server does not wait for them either
    lost: dict[int, int]
    #: the digest of what every worker holds fixed (their frozen parameters), or None: none,
    #: or a checkpoint written before it said (the first worker to join gives it then)
    fixed: str | None = None


def layout_of(path: str) -> Layout:
    """Read what ``path`` was written for (ValueError if it is damaged, or not a checkpoint of a
    parameter server)."""
    with _reading(path), np.load(path, allow_pickle=False) as data:
        found = _FINGERPRINT.match(str(data["__fingerprint__"]))
        if found is None:
            raise ValueError("its fingerprint is not one a parameter server writes")
        listed = json.loads(str(data["__specs__"]))
        specs = {str(n): (tuple(int(d) for d in shape), str(dt)) for n, shape, dt in listed}
        done, left, lost = (
            json.loads(str(data[key])) if key in data.files else []
            for key in ("__finished__", "__left__", "__lost__")
        )
        return Layout(
            path=path,
            step=int(data["__step__"]),
            model=found.group(1),
            shards=int(found.group(2)),
            shard=int(found.group(3)),
            split_bytes=int(found.group(4)),
            optimizer=found.group(5),
            specs=specs,
            finished={int(rank): int(step) for rank, step in done},
            left={int(rank): int(step) for rank, step in left},
            lost={int(rank): int(step) for rank, step in lost},
            fixed=str(data["__fixed__"]) if "__fixed__" in data.files else None,
        )


def params_in(path: str) -> dict[str, Array]:
    """The parameter chunks a checkpoint holds, by chunk id (ValueError if it is damaged)."""
    with _reading(path), np.load(path, allow_pickle=False) as data:
        return {name[2:]: data[name] for name in data.files if name.startswith("p:")}


def save(
    path: str,
    step: int,
    params: dict[str, Array],
    state: dict[str, dict[str, Any]],
    fingerprint: str,
    specs: dict[str, tuple[tuple[int, ...], str]],
    finished: dict[int, int] | None = None,
    left: dict[int, int] | None = None,
    lost: dict[int, int] | None = None,
    *,
    fixed: str | None = None,
) -> None:
    """``finished``: (asp, ssp) the workers that did all their steps, by rank, with the step
    each reached; ``left``: those that left on their own, with the step they left at;
    ``lost``: those lost and not joined again. A resumed server waits for none of them to
    join (``Layout.finished``, ``Layout.left``, ``Layout.lost``)."""
    arrays: dict[str, Any] = {
        "__step__": np.int64(step),
        "__fingerprint__": np.array(fingerprint),
        # the parameters' specs the job was started with: a resumed server knows them at once
        "__specs__": np.array(json.dumps([[n, list(sh), dt] for n, (sh, dt) in specs.items()])),
        "__finished__": np.array(json.dumps(sorted((finished or {}).items()))),
        "__left__": np.array(json.dumps(sorted((left or {}).items()))),
        "__lost__": np.array(json.dumps(sorted((lost or {}).items()))),
    }
    if fixed is not None:  # (what every worker holds fixed: ParameterServer.fixed)
        arrays["__fixed__"] = np.array(fixed)
    for key, value in params.items():
        arrays[f"p:{key}"] = value
    for key, slots in state.items():
        for slot, value in slots.items():
            arrays[f"s:{key}:{slot}"] = value
    files.write_whole(path, lambda f: np.savez(f, **arrays))


def load(path: str, fingerprint: str) -> tuple[int, dict[str, Array], dict[str, dict[str, Any]]]:
    """Return ``(step, params, optimizer state)``; refuses a checkpoint of another setup
    (CheckpointMismatchError) or a damaged one (ValueError)."""
    with _reading(path), np.load(path, allow_pickle=False) as data:
        found = str(data["__fingerprint__"])
        if found != fingerprint:
            raise CheckpointMismatchError(
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
