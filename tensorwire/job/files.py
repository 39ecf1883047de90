"""The files the daemons write: checked when they start, written whole or not at all.

A daemon writes its checkpoints, its end-of-job summary (``--metrics``) and a worker its final
parameters (``--save-params``) long after it started. A path that cannot be written is refused
at the start, not found out after the whole job; and each file is written beside its name and
renamed over it, so that a crash, a full disk or a reader never sees half of it (a failed write
removes its partial file, which would otherwise keep a full disk full); the file, then its
directory's entry, are synced before the write returns. A writer killed
mid-write leaves its partial file; the next whole write of that path removes it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import glob
import json
import math
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

from .argtypes import path


def unwritable_directory(directory: str, *, create: bool = True) -> str | None:
    """Why files cannot be written in ``directory`` (created if missing, where ``create``),
    or None."""
    if create:
        try:
            os.makedirs(directory, exist_ok=True)
        except FileExistsError:
            return "exists and is not a directory"
        except OSError as exc:
            return f"cannot be created: {exc.strerror}"
    elif not os.path.exists(directory):
        return "does not exist"
    if not os.path.isdir(directory):
        return "is not a directory"
    # A file of a name no other process can take, gone once closed: a name made of the pid was
    # the same for every container's daemon (each is pid 1), and two of them that shared the
    # directory removed each other's, which failed one's check (`bench chaos --hosts separate`).
    try:
        with tempfile.TemporaryFile(dir=directory, prefix=".tensorwire-probe-"):
            pass
    except OSError as exc:
        return f"is not writable: {exc.strerror}"
    return None


def unwritable_file(path: str) -> str | None:
    """Why the file ``path`` cannot be written, or None. Its directory must exist: one made for
    a mistyped path would hide the mistake."""
    if os.path.isdir(path):
        return "is a directory"
    directory = os.path.dirname(os.path.abspath(path))
    why = unwritable_directory(directory, create=False)
    return None if why is None else f"cannot be written: its directory {directory} {why}"


def output_file(text: str) -> str:
    """An argparse type: a file the daemon writes at its end, checked now (an empty name too:
    :func:`argtypes.path`)."""
    why = unwritable_file(path(text))
    if why is not None:
        raise argparse.ArgumentTypeError(f"{text!r} {why}")
    return text


# A partial file this old whose writer holds no lock on it is abandoned: its writer died. The
# age covers the instant between a writer creating its file and locking it.
ABANDONED_AFTER = 60.0


def json_text(value: Any) -> str:
    """``value`` as strict JSON, indented: a NaN or infinite number (a loss that diverged, a
    ratio of nothing) as null. Python's ``json`` writes them as ``NaN`` and ``Infinity``, which
    JSON has not: ``jq`` and every other strict reader refused the whole file."""
    return json.dumps(_finite(value), indent=2, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_whole(path: str, write: Callable[[IO[bytes]], object]) -> None:
    """Write ``path`` through ``write`` into a file beside it, synced, then renamed over it,
    and the rename synced (:func:`sync_directory`). OSError (a full disk, a volume gone) leaves
    no partial file and ``path`` as it was, but for one from the directory's sync, which comes
    with the new file in place, its name perhaps not yet durable. Partial files of ``path``
    left by writers that died are removed after."""
    # Beside it under a name of its own: one made of the pid alone was the same for every
    # container's daemon (each is pid 1), and two writing one path interleaved in one file.
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(tmp, "xb") as f:
            # Held until the rename: it tells the sweep below, in any process, that this file
            # is being written; the kernel lets go of it when its writer dies.
            fcntl.flock(f, fcntl.LOCK_EX)
            write(f)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    sync_directory(os.path.dirname(os.path.abspath(path)))
    remove_abandoned(path)


def sync_directory(directory: str) -> None:
    """Make the names in ``directory`` durable: a rename is an entry of its directory, which
    the file's own fsync does not write, so after a crash of the machine a checkpoint already
    reported written could read as the one before it. A file system that cannot sync a
    directory (EINVAL: some network and FUSE ones) is left as it is; any other error is the
    write's."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def npz_name(path: str) -> str:
    """``path`` with ``.npz`` added where it lacks it, as ``np.savez`` names its file."""
    return path if path.endswith(".npz") else path + ".npz"


def write_arrays(path: str, arrays: Mapping[str, Any]) -> str:
    """Write ``arrays`` by their names to :func:`npz_name` of ``path`` as a numpy ``.npz``
    archive, whole (:func:`write_whole`). Returns the path written; OSError as
    :func:`write_whole`."""
    import numpy as np

    path = npz_name(path)
    write_whole(path, lambda f: np.savez(f, **arrays))
    return path


def remove_abandoned(path: str) -> list[str]:
    """Remove the partial files of ``path`` whose writers died (SIGKILLed, or their machine
    gone, mid-write): unlocked and older than ``ABANDONED_AFTER``. Returns their names. Their
    names are unique, so nothing else would ever reuse and so remove them."""
    removed = []
    for candidate in glob.glob(glob.escape(path) + ".tmp-*"):
        try:
            fd = os.open(candidate, os.O_RDONLY)
        except OSError:
            continue  # renamed into place or removed meanwhile
        try:
            if time.time() - os.fstat(fd).st_mtime < ABANDONED_AFTER:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its writer lives (or the file system has no locks: keep it)
            # Still the file under that name (not one renamed over it since it was opened).
            if os.stat(candidate).st_ino == os.fstat(fd).st_ino:
                os.unlink(candidate)
                removed.append(candidate)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed
