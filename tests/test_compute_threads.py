"""``tensorwire-worker --threads``: the threads a PyTorch model computes with
(:mod:`tensorwire.client.threads`), from cgroup quotas, launchers' variables and the worker
daemons running on the host. (A job's workers logging their choice: ``test_torch.py -k
trains_as_the_numpy_one``.)"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tensorwire.client import threads


def test_threads_auto_divides_the_usable_cores(tmp_path: Path) -> None:
    """--threads auto: the cores a cgroup's quota leaves (v2's cpu.max, v1's cfs quota, the
    smallest of a cgroup's and its ancestors'), divided among the workers a launcher names or
    the worker daemons running here; torch's own choice where OMP_NUM_THREADS says."""
    v2 = tmp_path / "v2"
    (v2 / "kubepods" / "pod1").mkdir(parents=True)
    (v2 / "kubepods" / "cpu.max").write_text("400000 100000\n")
    (v2 / "kubepods" / "pod1" / "cpu.max").write_text("150000 100000\n")
    (tmp_path / "self-v2").write_text("0::/kubepods/pod1\n")
    assert threads.cgroup_cpus(str(tmp_path / "self-v2"), str(v2)) == 1.5
    (v2 / "kubepods" / "pod1" / "cpu.max").write_text("max 100000\n")  # the parent's holds
    assert threads.cgroup_cpus(str(tmp_path / "self-v2"), str(v2)) == 4.0
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "docker" / "abc").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "self-v1").write_text("4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n")
    assert threads.cgroup_cpus(str(tmp_path / "self-v1"), str(v1)) == 2.0
    (v1 / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us").write_text("-1\n")
    assert threads.cgroup_cpus(str(tmp_path / "self-v1"), str(v1)) is None
    assert threads.cgroup_cpus(str(tmp_path / "missing"), str(v1)) is None
    for argv, worker in (
        (["/venv/bin/python", "-m", "tensorwire.client.worker", "--rank", "0"], True),
        (["/venv/bin/python", "/venv/bin/tensorwire-worker", "--rank", "1"], True),
        (["/venv/bin/tensorwire", "worker", "--servers", "tcp://h:1"], True),
        (["python", "-m", "tensorwire", "worker"], True),
        (["python", "-m", "tensorwire", "ps"], False),
        (["python", "-m", "tensorwire.server.daemon"], False),
    ):
        assert threads.is_worker(argv) is worker, argv
    cores = threads.usable_cores()
    assert threads.choose("auto", {"OMP_NUM_THREADS": "3"}) == (None, "OMP_NUM_THREADS=3 is set")
    assert threads.choose("auto", {"LOCAL_WORLD_SIZE": "2"})[0] == max(1, cores // 2)
    assert threads.choose("auto", {"SLURM_NTASKS_PER_NODE": "64"})[0] == 1
    assert threads.choose("5", {"OMP_NUM_THREADS": "3"}) == (5, "--threads")
    # none said: this host's worker daemons, none here but a test's (at least one counted)
    count, why = threads.choose("auto", {})
    assert count == max(1, cores // max(1, threads.workers_on_host())) and "usable cores" in why
    for bad, says in (("0", "at least one thread"), ("-2", "at least one"), ("x", "not a number")):
        with pytest.raises(ValueError, match=says):
            threads.parse(bad)


def _cpu_cgroup() -> tuple[Path, str] | None:
    """Where this host lets a new cgroup get a CPU quota: (its parent directory, the quota
    file's name), cgroup v1's cpu controller or v2 with cpu delegated; None otherwise."""
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists():
        return v1, "cpu.cfs_quota_us"
    v2 = Path("/sys/fs/cgroup")
    try:
        if "cpu" in (v2 / "cgroup.subtree_control").read_text().split():
            return v2, "cpu.max"
    except OSError:
        pass
    return None


@pytest.mark.skipif(
    os.geteuid() != 0 or _cpu_cgroup() is None, reason="needs root and a cgroup cpu controller"
)
def test_a_process_in_a_cgroup_of_one_cpu_takes_one_thread() -> None:
    """A real cgroup of this host with a quota of one CPU (as a container's `cpus: 1` or a
    pod's limits.cpu: 1): a process in it finds one usable core whatever its affinity, and
    --threads auto gives it one thread; the cgroup is removed after."""
    found = _cpu_cgroup()
    assert found is not None
    parent, quota_file = found
    group = parent / f"tensorwire-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / quota_file).write_text("100000" if quota_file != "cpu.max" else "100000 100000")
        code = (
            "import os, sys; "
            f"open({str(group / 'cgroup.procs')!r}, 'w').write(str(os.getpid())); "
            "from tensorwire.client import threads; "
            "print(threads.cgroup_cpus(), threads.usable_cores(), "
            "threads.choose('auto', {'LOCAL_WORLD_SIZE': '1'})[0])"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["1.0", "1", "1"], out.stdout
    finally:
        group.rmdir()  # (its one process has exited)
