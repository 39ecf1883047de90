"""`tensorwire export`: a model's parameters from its servers' checkpoints, as a worker's
--save-params writes them, from real jobs' checkpoints; and what it refuses, in one line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .jobs import Job, ok

PY = sys.executable


def _export(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "tensorwire", "export", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _trained(tmp: Path, *, servers: int, workers: int, ps: list[str]) -> Job:
    """A job run to its end in ``tmp`` (made here), every daemon exiting 0; reaped whatever
    happened."""
    tmp.mkdir(exist_ok=True)
    j = Job(tmp, servers=servers, workers=workers, ps=ps)
    try:
        ok(j)
    finally:
        j.kill()
    return j


def _arrays(path: Path) -> dict[str, Any]:
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def test_export_writes_what_the_workers_saved_and_refuses_what_is_not_one_job(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    # Two servers, each parameter above 4 KiB split in chunks that both of them own.
    j = _trained(
        tmp_path,
        servers=2,
        workers=2,
        ps=["--steps", "30", "--checkpoint-dir", str(ckpt), "--split-bytes", "4096"],
    )
    saved = j.params(0)
    out = _export(ckpt, "--out", tmp_path / "model")  # .npz added, as --save-params does
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        f"wrote 4 parameters (9,610 values) of step 30, from 2 shards, to {tmp_path}/model.npz"
    )
    got = _arrays(tmp_path / "model.npz")
    assert list(got) == list(saved)  # the model's order
    for name, value in saved.items():  # bit for bit: the float32 values the servers keep
        assert got[name].dtype == value.dtype and np.array_equal(got[name], value), name

    # The files given one by one, in any order, a file given twice: the same.
    files = [ckpt / "ps-shard1.npz", ckpt / "ps-shard0.npz", ckpt / "ps-shard1.npz"]
    again = _export(*files, "--out", tmp_path / "again.npz")
    assert again.returncode == 0, again.stderr
    assert all(np.array_equal(v, saved[k]) for k, v in _arrays(tmp_path / "again.npz").items())

    # Another job's checkpoint (one server, so another sharding), a shard missing, a shard
    # twice, a damaged file, a directory without one: one line each, exit 1, nothing written.
    other = tmp_path / "other"
    _trained(other, servers=1, workers=1, ps=["--steps", "3", "--checkpoint-dir", str(other)])
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(ckpt / "ps-shard0.npz", copy / "ps-shard0.npz")
    damaged = tmp_path / "damaged" / "ps-shard1.npz"
    damaged.parent.mkdir()
    damaged.write_bytes((ckpt / "ps-shard1.npz").read_bytes()[:500])
    (tmp_path / "empty").mkdir()
    for given, says in (
        (
            [ckpt / "ps-shard0.npz", other / "ps-shard0.npz"],
            f"{ckpt}/ps-shard0.npz and {other}/ps-shard0.npz are checkpoints of different jobs",
        ),
        (
            [ckpt / "ps-shard0.npz"],
            "the job has 2 shards and no checkpoint of shard 1 was given (ps-shard1.npz: each "
            "server writes its own, in its --checkpoint-dir)",
        ),
        ([ckpt, copy], f"{ckpt}/ps-shard0.npz and {copy}/ps-shard0.npz are both shard 0"),
        (
            [ckpt / "ps-shard0.npz", damaged],
            f"checkpoint {damaged} is damaged or no checkpoint (BadZipFile",
        ),
        ([tmp_path / "empty"], "holds no parameter-server checkpoint (ps-shard*.npz)"),
    ):
        refused = _export(*given, "--out", tmp_path / "refused.npz")
        assert refused.returncode == 1, refused.stderr
        line = refused.stderr.strip()
        assert "\n" not in line and line.startswith("tensorwire export: error: "), line
        assert says in line, line
    assert not (tmp_path / "refused.npz").exists()
    # --out where nothing can be written: refused before anything is read (usage error)
    unwritable = _export(ckpt, "--out", tmp_path / "no-such-dir" / "m.npz")
    assert unwritable.returncode == 2 and "--out" in unwritable.stderr


def test_export_says_when_the_shards_were_checkpointed_at_different_steps(tmp_path: Path) -> None:
    """Under asp and ssp each server counts its steps; under bsp a server that failed has an
    older checkpoint than the others. The parameters are written, and the steps said."""
    ckpt = tmp_path / "ckpt"
    every = ["--checkpoint-every", "10"]
    _trained(
        tmp_path, servers=2, workers=1, ps=["--steps", "40", "--checkpoint-dir", str(ckpt), *every]
    )
    # a job of the same model and sharding that ended at step 20
    older = tmp_path / "older"
    _trained(
        older, servers=2, workers=1, ps=["--steps", "20", "--checkpoint-dir", str(older), *every]
    )
    mixed = _export(ckpt / "ps-shard0.npz", older / "ps-shard1.npz", "--out", tmp_path / "m.npz")
    assert mixed.returncode == 0, mixed.stderr
    assert mixed.stderr.strip() == (
        "tensorwire export: the shards were checkpointed at different steps: shard 0 at step "
        "40, shard 1 at step 20"
    )
    assert "of steps 20 to 40, from 2 shards" in mixed.stdout
