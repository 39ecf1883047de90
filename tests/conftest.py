"""Shared fixtures: the transports under test, child processes, and a leak check on every test."""

from __future__ import annotations

import gc
import importlib
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tensorwire import cuda, extras, metrics
from tensorwire.bench.common import UNSHARE
from tensorwire.client import launch
from tensorwire.process import first_child
from tensorwire.rdma import installed as rdma_installed
from tensorwire.receiver import Receiver

# `make fuzz`: the wire decoders under a long hypothesis run, outside CI.
settings.register_profile("fuzz", max_examples=200_000, deadline=None)

TRANSPORTS = ["shm", "tcp", "nixl", "grpc", "grpc-stream"]
#: the transports that promise no copy and no allocation per message on the receiving side
ZERO_COPY = ["shm", "tcp", "nixl"]
SPAWN = mp.get_context("spawn")
# Every daemon and peer the tests start shares this machine's cores with the others, as a job's
# processes do under `tensorwire demo` and in the image: one BLAS thread each (the launcher's and
# docker/Dockerfile's setting), not a thread per core each. Measured on this 2-core machine, a
# two-server job test took 14.2 s of CPU in 9.5 s with OpenBLAS's default, 8.8 s in 6.6 s so.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# Spawning starts multiprocessing's resource tracker once per session and keeps a pipe to it open;
# start it now so the per-test descriptor check does not count it.
resource_tracker.ensure_running()


def _start_grpc_runtime() -> object:
    """grpcio keeps process-wide pollers (an epoll and an eventfd) while any of its objects lives,
    and tears them down when the last one goes. Start them here and keep one idle channel for the
    whole session, so the per-test descriptor check sees only descriptors of our own."""
    from concurrent import futures

    # tensorwire's gRPC module first, as in a user's process: its GRPC_VERBOSITY default holds
    # only if set before grpc's first import; imported here first, grpc's C core logged every
    # GOAWAY of a receiver closing under a grpc sender at INFO, into the suite's output.
    importlib.import_module("tensorwire.transports.grpc")
    import grpc

    pool = futures.ThreadPoolExecutor(1)
    server = grpc.server(pool)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=30)
    channel.close()
    server.stop(None).wait()
    pool.shutdown()
    return grpc.insecure_channel("127.0.0.1:9")  # never used: it only keeps grpc initialised


GRPC_INSTALLED = extras.installed(extras.GRPC)
NO_GRPC = "grpcio is not installed (the grpc extra): the gRPC baseline is not tested"
_GRPC_RUNTIME = _start_grpc_runtime() if GRPC_INSTALLED else None


def _start_ucx_runtime() -> None:
    """UCX initialises process-wide state (and a few descriptors) with the first NIXL agent and
    keeps it: create and drop one agent now, so the per-test check counts only our own. The
    nixl transport's module is loaded too: a receiver imports it when the first nixl sender
    attaches, and a test that measures per-message allocations would count that one-time
    import (as it did when its file ran alone)."""
    import tensorwire.transports.nixl  # noqa: F401
    from tensorwire.rdma import NixlOptions, create_agent

    agent = create_agent("tensorwire-tests-warm-up", NixlOptions(), loopback=True)
    del agent


def optional_module(name: str) -> Any:
    """The module ``name``, or None where it is not installed. Call it at a test module's top,
    as the module is collected, not inside a test: torch 2.3 (the `torch` extra's floor) keeps
    the traceback of an ImportError its import caught (torch.cuda's of pynvml), and with it
    every frame that was importing it: a test's own, whose receiver memory would then outlive
    it (no_leaks)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def needed(module: Any, name: str) -> Any:
    """``module`` (from :func:`optional_module`), or skip the test saying ``name`` is missing."""
    if module is None:
        pytest.skip(f"needs {name}, which is not installed")
    return module


NIXL_INSTALLED = rdma_installed()
#: why the nixl tests are skipped where NIXL is absent (`make test` installs it, so CI runs them)
NO_NIXL = "NIXL is not installed (`make rdma` installs it): the nixl transport is not tested"
if NIXL_INSTALLED:
    _start_ucx_runtime()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests of an optional transport whose library is not installed (marked ``nixl``, or run
    with transport "nixl"; likewise "grpc"/"grpc-stream") are skipped with the reason;
    everything else still runs."""
    missing = []
    if not NIXL_INSTALLED:
        missing.append((("nixl",), "nixl", NO_NIXL))
    if not GRPC_INSTALLED:
        missing.append((("grpc", "grpc-stream"), "grpc", NO_GRPC))
    for item in items:
        params = getattr(item, "callspec", None)
        values = list(params.params.values()) if params is not None else []
        for transports, marker, reason in missing:
            uses = any(isinstance(v, str) and v in transports for v in values)
            if uses or item.get_closest_marker(marker) is not None:
                item.add_marker(pytest.mark.skip(reason=reason))


#: Test modules whose tests all run in one pytest-xdist process under `--dist loadgroup` (each
#: also says so with its `xdist_group` marker): test_ray.py, whose cluster is one per process
#: that runs its tests, and whose tests look in /tmp for what a job left.
ONE_PROCESS_MODULES = frozenset({"tests/test_ray.py"})


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` that keeps each of ONE_PROCESS_MODULES in one process. pytest-xdist
    3.8 groups the tests of an `xdist_group` by a suffix it adds to their ids, which pytest 9.2
    (which makes the id from the test's path) no longer takes: every group was lost, and
    test_ray.py's tests ran in three processes, each with a Ray cluster of its own (a fresh
    clone's suite: one test found another's job directory in /tmp). The scheduler groups by the
    module instead, and still by a suffix where one comes through."""
    if config.getoption("dist", None) != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ModuleGroups(LoadGroupScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_PROCESS_MODULES else super()._split_scope(nodeid)

    return ModuleGroups(config, log)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every test's leak check below runs a full garbage collection, to finalise what the test
    left in reference cycles. With the test modules' imports loaded (torch, Ray, grpcio,
    hypothesis: about 260 000 objects) one took 0.3-0.6 s, over 550 tests a quarter of the
    suite. What exists once collection is over lives for the session: frozen (moved out of the
    collector's generations), later collections look only at what the tests create."""
    gc.collect()
    gc.freeze()


#: `TENSORWIRE_TEST_CPU=FILE make test`: each test's CPU seconds (its own process's and those of
#: the children it waited for: daemons, peers, `bench` runs) appended to FILE, one line each, as
#: "cpu wall start worker nodeid" (start: the machine's monotonic clock, which every process
#: shares; worker: the pytest-xdist process). On two cores the suite's four processes keep both
#: busy most of the run, so its time is mostly what its tests compute: `--durations` shows where
#: it waits, this where it works, and when each process was idle.
CPU_LOG = os.environ.get("TENSORWIRE_TEST_CPU")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if not CPU_LOG:
        yield
        return
    import resource

    def cpu() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    cpu0, wall0 = cpu(), time.monotonic()
    yield
    used, took = cpu() - cpu0, time.monotonic() - wall0
    worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
    with open(CPU_LOG, "a") as log:  # one short append per line: the processes' lines whole
        log.write(f"{used:.2f} {took:.2f} {wall0:.2f} {worker} {item.nodeid}\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The versions the suite ran with, at its end, where a CI log's tail shows them: CI
    installs the newest releases the project admits afresh each run, and one can change what
    the suite meets (ml_dtypes 0.7.0, 2026-12-01: its import held the GIL 0.6-0.9 s, and 30
    tests failed on senders dropped before their first write)."""
    from tensorwire.cli import _libraries

    terminalreporter.write_line(f"ran with Python {sys.version.split()[0]}, {_libraries()}")


def _start_cuda_runtime() -> None:
    """Where there is a GPU: create the CUDA context (cupy's, and torch's on the same device)
    now, with a stream and pinned memory, so that the per-test check does not count the driver's
    descriptors that live as long as the context."""
    import cupy

    with cupy.cuda.Device(0):
        cupy.zeros(1).sum()
        cupy.cuda.Stream(non_blocking=True).synchronize()
        cupy.cuda.alloc_pinned_memory(1)
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda:0").sum().item()


if cuda.available():
    _start_cuda_runtime()


def _start_zmq_runtime() -> None:
    """Every control socket shares the process's one ZeroMQ context, which lives as long as the
    process (its I/O thread and descriptors): start it now, as tensorwire would on first use."""
    import zmq

    zmq.Context.instance().socket(zmq.DEALER).close()


_start_zmq_runtime()


def shm_entries() -> set[str]:
    return {
        n
        for n in os.listdir("/dev/shm")
        if n.startswith(f"tensorwire.{os.getuid()}.{os.getpid()}.")
    }


def hold_region_creation(
    monkeypatch: pytest.MonkeyPatch, when: Callable[[int], bool]
) -> tuple[threading.Event, threading.Event]:
    """The real ``Region.create`` held midway, once: the first region made whose size ``when``
    accepts sets the first event returned (it is being allocated) and waits for the second
    (go on) before it is made. What a slow allocation looks like to the rest of a receiver."""
    from tensorwire.region import Region

    allocating, go_on = threading.Event(), threading.Event()
    create = Region.create

    def held_create(size: int, *, shared: bool = True) -> Region:
        if not allocating.is_set() and when(size):
            allocating.set()
            assert go_on.wait(30)
        return create(size, shared=shared)

    monkeypatch.setattr(Region, "create", held_create)
    return allocating, go_on


def open_fds() -> set[int]:
    """This process's descriptors, less those of the NVIDIA driver (a CUDA context opens them
    as it needs them and keeps them for its lifetime: they are not ours to close)."""
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/nvidia"):
                continue
        except OSError:
            continue  # closed meanwhile (listdir's own descriptor)
        fds.add(int(fd))
    return fds


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Every test must leave no thread, shared-memory segment of ours or descriptor behind."""
    threads = set(threading.enumerate())
    segments = shm_entries()
    fds = open_fds()
    yield
    gc.collect()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        extra_threads = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
        extra_fds = open_fds() - fds
        if not extra_threads and not extra_fds:
            break
        if os.environ.get("TW_DEBUG_LEAKS"):
            print("waiting for", extra_threads, {fd: _describe_fd(fd) for fd in extra_fds})
        time.sleep(0.05)
        gc.collect()
    assert not extra_threads, f"threads left behind: {extra_threads}"
    assert shm_entries() - segments == set(), "shared-memory segments left behind"
    leaked = {fd: _describe_fd(fd) for fd in open_fds() - fds}
    assert not leaked, f"file descriptors left behind: {leaked}"


def _describe_fd(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Children:
    """Spawned child processes that are always reaped, even when the test fails."""

    def __init__(self) -> None:
        self.procs: list[Any] = []

    def start(self, target: Any, *args: Any) -> Any:
        proc = SPAWN.Process(target=target, args=args, daemon=True)
        proc.start()
        self.procs.append(proc)
        return proc

    def pipe(self) -> tuple[Any, Any]:
        return SPAWN.Pipe()

    def join_ok(self, proc: Any, timeout: float = 60.0) -> None:
        proc.join(timeout)
        assert proc.exitcode == 0, f"child {proc.name} exited with {proc.exitcode}"

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
            proc.join(10)
            proc.close()


def freeze(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP process ``pid`` and return once every thread of it is stopped. A stop is not
    done when kill() returns: it begins once one of the process's threads runs to take the
    signal, and on a busy host (the suite in two processes, 2 cores) its other threads go on
    meanwhile: a receiver answered a claim sent after the kill 0.6-0.9 ms later, 3 of 15 times,
    so a write meant to meet a frozen receiver did not."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            return  # reaped: nothing of it runs
        states = []
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    # the state follows the command name, which may hold spaces and ')'
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # the thread ended
        if all(state in "TtZX" for state in states):  # stopped, or exited
            return
        assert time.monotonic() < deadline, f"process {pid} not stopped in {timeout} s: {states}"
        time.sleep(0.001)


#: pid namespaces can be made here (root, and util-linux's unshare(1))
needs_pid_namespaces = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None,
    reason="needs root, unshare(1) and setpriv(1) to make pid namespaces",
)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) here")


def peer_count(rx: Receiver) -> float:
    """How many senders ``rx`` has now (its ``peers`` gauge)."""
    return next(v for name, _, v in rx.metric_gauges() if name == "peers")


def bad_inputs() -> dict[str, float]:
    """This process's ``tensorwire_bad_input_total``, by reason."""
    bad = {m.name: m for m in metrics.snapshot()}["tensorwire_bad_input_total"]
    return {key[0]: float(v) for key, v in bad.samples}  # type: ignore[arg-type]


def as_nobody() -> list[str]:
    """The command prefix that runs a process as the user nobody (util-linux's setpriv), for a
    check of what a user without root's rights meets; the test is skipped, saying why, where
    that cannot be: not root, no setpriv, or a Python nobody cannot run (a pyenv Python whose
    libpython only root can read)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and util-linux's setpriv (to run as another user)")
    nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    probe = subprocess.run(
        [*nobody, sys.executable, "-c", "import tensorwire"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"this Python cannot run as nobody here: {probe.stderr.strip()[-200:]}")
    return nobody


def in_pid_namespace(argv: list[str], **kwargs: Any) -> subprocess.Popen[str]:
    """``python *argv`` as pid 1 of a pid and mount namespace of its own (with its own /proc),
    sharing this host's /dev/shm and network, as two containers with ``--ipc=host`` do: its host
    identity (tensorwire.process.host_identity) differs from ours. Killing the returned process
    (unshare) kills it too."""
    cmd = [*UNSHARE, sys.executable, *argv]
    return subprocess.Popen(cmd, text=True, **kwargs)


def namespaced_pid(proc: subprocess.Popen[str], timeout: float = 10.0) -> int:
    """The pid, in our namespace, of the process that :func:`in_pid_namespace` started."""
    kid = first_child(proc.pid, timeout, lambda: proc.poll() is None)
    assert kid is not None, f"unshare started no process (exit code {proc.poll()})"
    return kid


@pytest.fixture
def children() -> Iterator[Children]:
    kids = Children()
    try:
        yield kids
    finally:
        kids.cleanup()


def _confine_free_ports() -> None:
    """Give this pytest-xdist worker a range of ports of its own (``TENSORWIRE_FREE_PORTS``),
    which the processes its tests start inherit: a demo or a benchmark launched by one worker
    then never draws a port that the other worker has just handed out to a daemon of its own
    (a fresh clone's CI run met a metrics scrape answered by another job's ZeroMQ socket)."""
    workers = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), 1)
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").lstrip("gw") or 0)
    low, high, _ = launch.port_range()
    span = (high - low) // workers
    first = low + (worker % workers) * span
    os.environ[launch.PORT_RANGE_VARIABLE] = f"{first}-{first + span - 1}"


_confine_free_ports()


def free_port() -> int:
    """client.launch.free_port (a loopback port beneath the ephemeral range, free now), from
    this pytest-xdist worker's own range."""
    return launch.free_port()


@pytest.fixture
def job(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Start parameter-server jobs (tests/jobs.py); every process is reaped at the end."""
    from .jobs import Job

    started: list[Job] = []

    def make(**kw: Any) -> Job:
        j = Job(tmp_path / f"job{len(started)}", **kw)
        started.append(j)
        return j

    for i in range(8):
        (tmp_path / f"job{i}").mkdir()
    yield make
    for j in started:
        j.kill()


class DLPackProducer:
    """A DLPack producer that is not torch (as a JAX or TensorFlow array is, to tensorwire):
    the protocol alone, over a torch tensor's capsules."""

    def __init__(self, tensor: Any, legacy: bool = False) -> None:
        self.tensor, self.legacy = tensor, legacy

    def __dlpack__(self, **kwargs: Any) -> Any:
        if self.legacy:  # a producer from before DLPack 1.0 takes no keywords
            if kwargs.keys() - {"stream"}:
                raise TypeError("__dlpack__() got an unexpected keyword argument")
            return self.tensor.__dlpack__()
        return self.tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self.tensor.__dlpack_device__()
