"""How many threads a worker's PyTorch compute takes: ``tensorwire-worker --threads``.

PyTorch's intra-op pool takes one thread per core of the machine, whatever else runs there (and
OpenMP's idle threads spin a while before they sleep). Several processes that compute on one
host then take the cores from each other: on the project's 2-core VM, two PyTorch workers and a
server of the ``many`` model (200 small tensors) computed a step in 366 ms with torch's default
and in 14.7 ms with one thread each, and ``large`` in 21.1 against 16.5 (BENCHMARKS.md,
"Threads of a PyTorch worker"). A container limited to a few cores by its cgroup (a Kubernetes
``limits.cpu``) still gets one thread per core of the node. torchrun sets ``OMP_NUM_THREADS=1``
for the same reason when it starts several processes a node.

``auto`` (the default) gives each worker the host's usable cores (its CPU affinity, within its
cgroup's CPU quota) divided among the workers that compute on the host: ``LOCAL_WORLD_SIZE``
(torchrun) or ``SLURM_NTASKS_PER_NODE`` (srun) where the launcher says, else the tensorwire
workers running on the host as this one joins its job (of any job: they all take cores). Where
``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is set, the user chose, and torch's own choice from it
stands. A number sets it. numpy models are left alone (their compute takes one thread here).
Another count of threads sums some of a step's products in another order: where two runs must
match bit for bit (a job resumed against one that ran straight), give them ``--threads``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

#: variables through which the user sets torch's threads already (torch reads them as it starts)
THREADS_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: variables through which a launcher says how many processes it starts on this host
LOCAL_VARS = ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE")
#: how a worker daemon's command line names it: ``python -m tensorwire.client.worker``,
#: ``tensorwire-worker``, ``tensorwire worker``
_MODULE = "tensorwire.client.worker"


def parse(value: str) -> str:
    """``--threads``: ``auto`` or a count of at least 1 (ValueError otherwise)."""
    if value == "auto":
        return value
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number of threads or 'auto'") from None
    if count < 1:
        raise ValueError(f"{count}: a step needs at least one thread ('auto' chooses)")
    return str(count)


def cgroup_cpus(
    cgroup_file: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> float | None:
    """The CPUs this process's cgroup may use (its CPU quota over its period, the smallest of
    its own and its ancestors'), or None where no quota is set or none can be read. cgroup v2
    (``cpu.max``) and v1 (``cpu.cfs_quota_us``)."""
    try:
        lines = Path(cgroup_file).read_text().splitlines()
    except OSError:
        return None
    found: list[float] = []
    for line in lines:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":  # v2: one hierarchy
            found += _quotas(Path(root), path, "cpu.max")
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's hierarchy
            for mount in (controllers, "cpu", "cpu,cpuacct"):
                found += _quotas(Path(root) / mount, path, "cpu.cfs_quota_us")
    return min(found) if found else None


def _quotas(mount: Path, path: str, name: str) -> list[float]:
    """The quotas set in ``mount``'s directory of ``path`` and its ancestors (inside a
    container's cgroup namespace the path may be the mount's root itself)."""
    out = []
    seen = set()
    for candidate in (path, "/"):
        directory = mount / candidate.lstrip("/")
        while directory not in seen:
            seen.add(directory)
            quota = _quota_in(directory, name)
            if quota is not None:
                out.append(quota)
            if directory == mount or directory.parent == directory:
                break
            directory = directory.parent
    return out


def _quota_in(directory: Path, name: str) -> float | None:
    try:
        if name == "cpu.max":  # "max 100000" or "200000 100000"
            quota, _, period = (directory / name).read_text().strip().partition(" ")
        else:
            quota = (directory / name).read_text().strip()
            period = (directory / "cpu.cfs_period_us").read_text().strip()
        if quota in ("max", "-1"):
            return None
        return int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def usable_cores() -> int:
    """The cores this process may run on: its affinity, within its cgroup's quota."""
    cores = len(os.sched_getaffinity(0))
    quota = cgroup_cpus()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return cores


def is_worker(argv: list[str]) -> bool:
    """Whether a command line runs a tensorwire worker daemon."""
    names = [os.path.basename(a) for a in argv[:3]]
    return (
        _MODULE in argv[:4]
        or "tensorwire-worker" in names
        or any(a == "tensorwire" and b == "worker" for a, b in zip(names, argv[1:4], strict=False))
    )


def workers_on_host(proc: str = "/proc") -> int:
    """The tensorwire worker daemons running on this host (this one among them), as far as
    this process can see them (a container sees its own)."""
    count = 0
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if is_worker([a.decode(errors="replace") for a in raw.split(b"\0") if a]):
            count += 1
    return count


def choose(setting: str, environ: Mapping[str, str]) -> tuple[int | None, str]:
    """The threads a worker's torch compute takes for ``--threads`` ``setting``, or None to
    leave torch's own choice; and why, for the log."""
    if setting != "auto":
        return int(setting), "--threads"
    chosen = [var for var in THREADS_VARS if environ.get(var)]
    if chosen:
        return None, f"{chosen[0]}={environ[chosen[0]]} is set"
    cores = usable_cores()
    for var in LOCAL_VARS:
        try:
            local = int(environ.get(var, ""))
        except ValueError:
            continue
        if local > 0:
            return max(1, cores // local), f"{cores} usable cores, {var}={local}"
    local = max(1, workers_on_host())
    return max(1, cores // local), f"{cores} usable cores, {local} tensorwire worker(s) here"
