"""GPU tensors: device registration, any array in, and every transport over GPU memory.

The first part runs everywhere: what a host without a GPU (or without cupy) says when GPU memory
is asked for, that host paths never import cupy, and how GPU regions travel in the address book.
The second part is marked ``gpu`` and needs a CUDA device (``make test-gpu``); elsewhere each of
its tests is skipped with the reason. Sender processes are real, with arrays from numpy, cupy and
torch CUDA tensors, and the receiver checks every byte that landed.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorwire as tw
from tensorwire import cuda, cuda_stores
from tensorwire.bench.torch_queue import available as torch_queue_available
from tensorwire.layout import RingLayout
from tensorwire.memory import CUDA, IPC_HANDLE_BYTES, RegionInfo
from tensorwire.transports.shm import DEFERRED_COMPLETION_BYTES

from .conftest import NIXL_INSTALLED, Children, DLPackProducer, needed, optional_module
from .peers import (
    make_array,
    on_source,
    run_gpu_receiver,
    run_hiding,
    send_from_a_torch_side_stream,
    send_gpu_from_threads,
    send_plan_from,
    send_rewritten_gpu_source,
    send_uniform_gpu,
)

ROOT = Path(__file__).resolve().parent.parent
TORCH = optional_module("torch")  # (imported here, not in a test: conftest.optional_module)

# -- on any host ------------------------------------------------------------------------------


def test_device_names_are_parsed_and_bad_ones_refused() -> None:
    assert cuda.parse_device(None) is None
    assert cuda.parse_device("cpu") is None
    assert cuda.parse_device(" CPU ") is None
    for bad in ("gpu", "cuda:", "cuda:x", "cuda:-1", "tpu:0", "cuda:0:1", -1, True, 1.0):
        with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or 'cuda:N'"):
            cuda.parse_device(bad)
    if not cuda.available():  # a device index is cuda:N, as torch takes it: none here
        for index in (0, 3):
            # with cupy installed, that no such device is here; without it (`make test-floors`
            # installs no GPU extra), how to install it
            with pytest.raises(
                (tw.TransportError, tw.MissingDependencyError),
                match=f"cuda:{index} was asked for|GPU tensors need cupy, which is not installed",
            ):
                cuda.parse_device(index)


@pytest.mark.skipif(cuda.available(), reason="checks what a host without a CUDA device says")
def test_gpu_registration_without_a_device_is_refused_and_changes_nothing() -> None:
    with tw.Receiver() as rx:
        rx.register("host", (4,), "float32")
        before = rx._table.address_book_regions()
        for device in ("cuda", "cuda:0", "cuda:3"):
            with pytest.raises((tw.TransportError, tw.MissingDependencyError)) as info:
                rx.register("gpu", (4,), "float32", device=device)
            assert "CUDA device" in str(info.value) or "cupy" in str(info.value)
        with pytest.raises(tw.TensorWireError):
            rx.register_parts("parts", (4, 2), "float32", [2, 2], device="cuda")
        assert list(rx.specs) == ["host"]
        assert rx._table.address_book_regions() == before
        # the receiver still works for host tensors
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            tx.write("host", np.arange(4, dtype=np.float32))
            assert rx.wait("host", timeout=10).tolist() == [0, 1, 2, 3]
            rx.release("host")


def test_without_cupy_gpu_memory_names_the_extra_and_host_tensors_work() -> None:
    lines = run_hiding(
        ("cupy",),
        """
        import numpy as np
        with tw.Receiver() as rx:
            try:
                rx.register("gpu", (4,), "float32", device="cuda")
            except tw.MissingDependencyError as exc:
                print("refused:", exc)
            rx.register("t", (4,), "float32")
            with tw.Sender.connect(rx.address, transport="tcp", timeout=10) as tx:
                tx.write("t", np.ones(4, dtype=np.float32))
                print("landed:", rx.wait("t", timeout=10).sum())
                rx.release("t")
        from tensorwire import cuda
        print("devices:", cuda.device_count())
        """,
    )
    assert lines[0].startswith("refused: GPU tensors need cupy") and "tensorwire[gpu]" in lines[0]
    assert lines[1:] == ["landed: 4.0", "devices: 0"]


def test_host_paths_never_import_cupy_or_torch() -> None:
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        import tensorwire as tw
        with tw.Receiver() as rx:
            rx.register("a", (64,), "float32")
            rx.register("b", (None, 4), "bfloat16", max_bytes=1024)
            for transport in ("shm", "tcp"):
                with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
                    tx.write("a", np.ones(64, dtype=np.float32))
                    with tx.buffer("b", shape=(3, 4)) as out:
                        out[...] = 1
                    rx.wait("a", timeout=10); rx.release("a")
                    rx.wait("b", timeout=10); rx.release("b")
        print(sorted(m for m in ("cupy", "torch") if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_gpu_regions_travel_in_the_address_book_and_bad_ones_are_refused() -> None:
    host = RegionInfo("tensorwire.1.2.3.abc", 8192)
    assert host.to_wire() == ["tensorwire.1.2.3.abc", 8192]
    assert RegionInfo.from_wire(host.to_wire()) == host
    assert RegionInfo.from_wire(["", 4096]) == RegionInfo(None, 4096)
    handle = bytes(range(IPC_HANDLE_BYTES))
    gpu = RegionInfo(None, 1 << 20, CUDA, 1, handle, 0x7F00_0000_0000)
    assert RegionInfo.from_wire(gpu.to_wire()) == gpu and gpu.on_device
    for bad in (
        ["", 1 << 20, "cuda", 0, b"short", 0],  # not an IPC handle
        ["", 1 << 20, "tpu", 0, handle, 0],  # unknown kind
        ["", 1 << 20, "cuda", -1, handle, 0],  # negative device
        ["", 0],  # empty region
        ["", 1 << 20, "cuda"],  # truncated
        "nonsense",
    ):
        with pytest.raises(tw.LocalProtocolError):
            RegionInfo.from_wire(bad)


def test_a_ring_with_payloads_in_another_region_is_bounds_checked() -> None:
    layout = RingLayout(0, 4096, (4224, 4288), (0, 4096), 4096, payload_region=1)
    wire = layout.to_wire()
    assert wire[-1] == 1 and RingLayout.from_wire(wire, [8192, 8192]) == layout
    # The payloads are checked against their own region, the words against theirs.
    with pytest.raises(tw.LocalProtocolError, match="out of bounds"):
        RingLayout.from_wire(wire, [8192, 4096])
    with pytest.raises(tw.LocalProtocolError, match="unknown region 1"):
        RingLayout.from_wire(wire, [8192])
    with pytest.raises(tw.LocalProtocolError, match="malformed"):
        RingLayout.from_wire([*wire, 7], [8192, 8192])
    # A host ring (no payload region) is what it always was on the wire.
    host = RingLayout(0, 4096, (4224,), (8192,), 64)
    assert len(host.to_wire()) == 5 and RingLayout.from_wire(host.to_wire(), [16384]) == host


class _CudaLooking:
    """An object that says, through DLPack, that its memory is on cuda:1."""

    def __dlpack_device__(self) -> tuple[int, int]:
        return (cuda.DLPACK_CUDA, 1)


def test_where_an_array_lives_is_told_without_importing_cupy() -> None:
    assert cuda.array_device(np.zeros(3)) is None
    assert cuda.array_device([1, 2, 3]) is None
    assert cuda.array_device(_CudaLooking()) == 1
    torch = needed(TORCH, "PyTorch")
    assert cuda.array_device(torch.zeros(3)) is None


@pytest.mark.skipif(cuda.available(), reason="checks what a host without a CUDA device says")
def test_no_cuda_context_is_claimed_on_a_host_without_a_device() -> None:
    assert cuda.hold_context() is False  # and nothing raised


@pytest.mark.skipif(cuda.available(), reason="checks what a host without a CUDA device says")
def test_a_gpu_array_on_a_host_without_a_gpu_is_refused_before_a_byte_moves() -> None:
    with tw.Receiver() as rx:
        rx.register("t", (3,), "float32")
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            with pytest.raises(tw.TensorWireError):
                tx.write("t", _CudaLooking())
            assert rx.pending("t") == 0


@pytest.mark.skipif(cuda.available(), reason="checks what a host without a CUDA device says")
def test_bench_on_a_gpu_needs_one() -> None:
    for device, says in (("cuda", "CUDA device"), ("tpu", "device must be")):
        out = subprocess.run(
            [sys.executable, "-m", "tensorwire.bench", "--device", device, "--repeat", "1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2 and f"--device {device}:" in out.stderr, out.stderr
        assert says in out.stderr or "cupy" in out.stderr


def test_mps_is_told_by_its_daemon_s_process(tmp_path: Any) -> None:
    """``mps_running`` (in ``tensorwire info`` and the bench's JSON) looks for NVIDIA's MPS
    daemon among this host's processes: a process of that name makes it say yes."""
    before = cuda.mps_running()  # a GPU machine may run a real one
    daemon = tmp_path / "nvidia-cuda-mps-control"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", daemon)
    proc = subprocess.Popen([str(daemon), "30"])
    try:
        for _ in range(100):  # bounded: the process is named as it starts
            if cuda.mps_running():
                break
            time.sleep(0.02)
        assert cuda.mps_running()
    finally:
        proc.kill()
        proc.wait(10)
    assert cuda.mps_running() is before


def test_info_reports_gpu_support() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tensorwire", "info"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("gpu tensors:"))
    if cuda._cupy_or_none() is None:
        assert "cupy not installed" in line
    elif cuda.available():
        assert "cuda:0:" in out.stdout
        # whether the GPU can make shm's completion stores here, and whether they are asked for
        stores = next(x for x in out.stdout.splitlines() if x.startswith("gpu-made completion"))
        asked = os.environ.get(cuda_stores.ENV, "1") != "0"
        expected = "work on cuda:0, on" if asked else "work on cuda:0, off"
        assert expected in stores or "unavailable on cuda:0:" in stores
    else:
        assert "no usable CUDA device" in line or "no CUDA device" in out.stdout


# -- on a GPU ---------------------------------------------------------------------------------

NO_GPU = "no CUDA device here (cupy and a GPU are needed: `make test-gpu` on a GPU machine)"
requires_gpu = pytest.mark.skipif(not cuda.available(), reason=NO_GPU)
SOURCES = ["numpy", "cupy", "torch"]
GPU_DTYPES = ["bool", "int8", "int32", "int64", "uint8", "float16", "float32", "float64"]
GPU_DTYPES += ["complex64", "bfloat16", "float8_e4m3fn"]


def _cupy() -> Any:
    import cupy

    return cupy


def _bytes(view: Any) -> bytes:
    """A received GPU view's bytes (through uint8, which every dtype cupy holds can be)."""
    cp = _cupy()
    assert isinstance(view, cp.ndarray), type(view)
    return bytes(cp.asnumpy(view.reshape(-1).view(cp.uint8)).tobytes())


def _needs(source: str) -> None:
    if source == "torch":
        torch = needed(TORCH, "PyTorch")
        if not torch.cuda.is_available():
            pytest.skip("this torch build has no CUDA")


def _gpu(test: Any) -> Any:
    """Mark a test ``gpu`` and skip it, with the reason, where there is no CUDA device."""
    return pytest.mark.gpu(requires_gpu(test))


@_gpu
def test_a_device_index_or_a_cupy_device_names_a_gpu() -> None:
    """``device=0`` (as ``torch.device(0)`` takes it) and ``cupy.cuda.Device(0)`` register on
    cuda:0, as ``"cuda:0"`` does."""
    import cupy

    assert cuda.parse_device(0) == 0 and cuda.parse_device(cupy.cuda.Device(0)) == 0
    sent = cupy.arange(4, dtype=cupy.float32)
    with tw.Receiver() as rx:
        rx.register("by_index", (4,), "float32", device=0)
        rx.register("by_cupy", (4,), "float32", device=cupy.cuda.Device(0))
        with tw.Sender.connect(rx.address, transport="shm", timeout=30) as tx:
            for name in ("by_index", "by_cupy"):
                tx.write(name, sent)
                view = rx.wait(name, timeout=30)
                assert isinstance(view, cupy.ndarray) and view.device.id == 0
                assert bool(cupy.array_equal(view, sent))
                rx.release(name)


@_gpu
@pytest.mark.parametrize("source", SOURCES)
def test_gpu_tensors_land_byte_exact_from_every_source(
    transport: str, source: str, children: Children
) -> None:
    _needs(source)
    shape = (3, 5, 7)
    with tw.Receiver() as rx:
        for dt in GPU_DTYPES:
            rx.register(dt, shape, dt, device="cuda:0")
        rx.register("big", (2048, 4096), "float32", device="cuda")  # 32 MiB
        # tcp stages GPU payloads through host memory 1 MiB at a time at both ends: a size
        # that leaves a part of a chunk at the end
        rx.register("odd", (1_300_001,), "float32", device="cuda")
        plan = [(dt, dt, shape, i) for i, dt in enumerate(GPU_DTYPES)]
        plan.append(("big", "float32", (2048, 4096), 99))
        plan.append(("odd", "float32", (1_300_001,), 98))
        proc = children.start(send_plan_from, rx.address, transport, plan, source)
        for name, dt, shp, seed in plan:
            got = rx.wait(name, timeout=60)
            assert (
                got.device.id == 0
                and got.shape == shp
                and got.dtype == np.dtype(make_array(dt, (1,), 0).dtype)
            )
            assert _bytes(got) == make_array(dt, shp, seed).tobytes(), name
            rx.release(name)
        children.join_ok(proc)


@_gpu
def test_dynamic_shapes_parts_and_host_slots_from_gpu_arrays(transport: str) -> None:
    cp = _cupy()
    with tw.Receiver() as rx:
        rx.register("dyn", (None, 16), "float32", max_bytes=64 * 16 * 4, device="cuda")
        rx.register_parts("whole", (6, 4), "int32", [2, 4], device="cuda:0")
        rx.register("host", (8,), "float64")  # a host slot, written from GPU memory
        with tw.Sender.connect(rx.address, transport=transport, timeout=30) as tx:
            for rows in (1, 64, 0, 17):
                tx.write("dyn", cp.full((rows, 16), rows, dtype=cp.float32))
                got = rx.wait("dyn", timeout=30)
                assert got.shape == (rows, 16) and bool((got == rows).all())
                rx.release("dyn")
            tx.write("whole@0", cp.zeros((2, 4), dtype=cp.int32))
            tx.write("whole@1", np.ones((4, 4), dtype=np.int32))
            for part in ("whole@0", "whole@1"):
                rx.wait(part, timeout=30)
            whole = rx.array("whole")
            assert isinstance(whole, cp.ndarray) and cp.asnumpy(whole).sum() == 16
            for part in ("whole@0", "whole@1"):
                rx.release(part)
            tx.write("host", cp.arange(8, dtype=cp.float64))
            got = rx.wait("host", timeout=30)
            assert isinstance(got, np.ndarray) and got.tolist() == list(range(8))
            rx.release("host")


@_gpu
def test_wrong_shapes_are_refused_and_credits_hold(transport: str) -> None:
    cp = _cupy()
    with tw.Receiver(ring=2) as rx:
        rx.register("t", (4, 4), "float32", device="cuda")
        with tw.Sender.connect(rx.address, transport=transport, timeout=30) as tx:
            for bad in (cp.zeros((4, 5), cp.float32), cp.zeros((4, 4), cp.float64)):
                with pytest.raises(tw.SpecMismatchError):
                    tx.write("t", bad)
            with pytest.raises(tw.SpecMismatchError, match="not C-contiguous"):
                tx.write("t", cp.zeros((4, 8), cp.float32)[:, ::2])
            assert rx.pending("t") == 0
            tx.write("t", cp.full((4, 4), 1, cp.float32))
            tx.write("t", cp.full((4, 4), 2, cp.float32))
            with pytest.raises(tw.WireTimeoutError):  # both slots hold unreleased messages
                tx.write("t", cp.full((4, 4), 3, cp.float32), timeout=0.3)
            for k in (1, 2):
                assert float(rx.wait("t", timeout=30)[0, 0]) == k
                rx.release("t")


@_gpu
def test_produce_in_place_with_buffer(transport: str) -> None:
    cp = _cupy()
    with tw.Receiver() as rx:
        rx.register("t", (256,), "float32", device="cuda")
        with tw.Sender.connect(rx.address, transport=transport, timeout=30) as tx:
            for k in range(3):
                with tx.buffer("t") as out:
                    assert isinstance(out, cp.ndarray) and out.device.id == 0
                    cp.multiply(cp.arange(256, dtype=cp.float32), k, out=out)
                got = rx.wait("t", timeout=30)
                assert cp.asnumpy(got).tolist() == [float(i * k) for i in range(256)]
                rx.release("t")


def _each_message_all_its_number(rx: tw.Receiver, name: str, count: int) -> None:
    """Messages 1..``count`` of ``name`` arrive, message k holding k in every element."""
    _each_message_from(rx, name, list(range(1, count + 1)))


@_gpu
@pytest.mark.parametrize(
    ("stores", "nbytes"),
    [(False, DEFERRED_COMPLETION_BYTES), (True, 1 << 20), (True, DEFERRED_COMPLETION_BYTES)],
    ids=["completion-thread", "gpu-stores-1MiB", "gpu-stores-32MiB"],
)
def test_gpu_writes_complete_behind_their_copies_in_order(
    children: Children, monkeypatch: pytest.MonkeyPatch, stores: bool, nbytes: int
) -> None:
    """GPU sources over shm whose write returns once the copy is queued: a large one completed
    by the channel's completion thread once its copy has landed, or any size with the GPU
    making the completion store behind the copy (the default; ``=0`` turns it off). Each
    message carries the value its source had when written, though the sender refills that
    source right after (stream order); messages from host memory in between wait their turn;
    those produced in place complete too; the sender's close completes what is in flight. With
    GPU-made stores the ring says so, so they were really used."""
    # inherited by the sender's process
    monkeypatch.setenv(cuda_stores.ENV, "1" if stores else "0")
    count = 30
    with tw.Receiver(ring=3) as rx:
        rx.register("t", (nbytes // 4,), "float32", device="cuda")
        proc = children.start(send_rewritten_gpu_source, rx.address, "t", count)
        _each_message_all_its_number(rx, "t", count + 2)
        children.join_ok(proc)
        assert rx._table.by_name["t"].ring.device_stores() == stores


@_gpu
@pytest.mark.parametrize("transport", ["shm", "tcp", "nixl"])
def test_gpu_writes_from_several_threads_each_land_whole_and_in_order(
    children: Children, transport: str
) -> None:
    """Four threads of one sender, each streaming GPU messages of its own tensor (4 KiB, two
    of 1 MiB, and 32 MiB, whose shm writes complete behind their copies): every message of
    every tensor arrives whole and in its order, the receiver taking them in turn."""
    if transport == "nixl" and not NIXL_INSTALLED:
        pytest.skip("NIXL is not installed")
    sizes = {"a": 1 << 10, "b": 1 << 18, "c": 1 << 18, "d": DEFERRED_COMPLETION_BYTES // 4}
    count = 40
    with tw.Receiver(ring=2) as rx:
        for name, elements in sizes.items():
            rx.register(name, (elements,), "float32", device="cuda")
        proc = children.start(send_gpu_from_threads, rx.address, transport, list(sizes), count)
        for k in range(1, count + 1):
            for name in sizes:
                _each_message_from(rx, name, [k])
        children.join_ok(proc)


@_gpu
def test_the_fast_route_of_gpu_arrays_hands_on_what_it_does_not_take() -> None:
    """Once a first cupy write has set up ``Sender.write``'s fast route of a GPU tensor over
    shm, the cases that route does not take reach the general path with its answers: a source
    on another stream (its copy ordered behind that stream's work, its completion behind the
    earlier ones), a host array, a full ring (waited for, then refused at the timeout with
    nothing written), a non-contiguous array and a wrong dtype (refused, nothing written).
    Every message lands holding the value it was written with, in order."""
    cp = _cupy()
    n = 1 << 18  # 1 MiB of float32
    with tw.Receiver() as rx:
        rx.register("t", (n,), "float32", device="cuda", ring=2)
        with tw.Sender.connect(rx.address, transport="shm", timeout=10) as tx:
            src = cp.empty(n, dtype=cp.float32)
            src.fill(1)
            tx.write("t", src)
            _each_message_from(rx, "t", [1])
            if rx._table.by_name["t"].ring.device_stores():  # the route needs GPU-made stores
                assert tx._fast["t"][3] is cp.ndarray, "no fast route of cupy arrays was set up"
            side = cp.cuda.Stream(non_blocking=True)
            with side:  # the side stream does not wait for the default one, nor it for it
                other = cp.empty(n, dtype=cp.float32)
                other.fill(2)
                tx.write("t", other)
                other.fill(-1)  # queued behind the copy of 2 on the side stream
            src.fill(3)
            tx.write("t", src)  # back on the default stream
            _each_message_from(rx, "t", [2, 3])
            tx.write("t", np.full(n, 4, np.float32))
            src.fill(5)
            tx.write("t", src)
            with pytest.raises(tw.WireTimeoutError, match="no free slot"):
                tx.write("t", src, timeout=0.2)
            assert rx.pending("t") == 2
            with pytest.raises(tw.SpecMismatchError, match="C-contiguous"):
                tx.write("t", cp.zeros((n, 2), dtype=cp.float32)[:, 0])
            with pytest.raises(tw.SpecMismatchError, match="float64"):
                tx.write("t", cp.zeros(n, dtype=cp.float64))
            _each_message_from(rx, "t", [4, 5])
            src.fill(6)
            tx.write("t", src)
            _each_message_from(rx, "t", [6])
            assert rx.pending("t") == 0


def _each_message_from(rx: tw.Receiver, name: str, values: list[int]) -> None:
    """The next messages of ``name`` hold ``values`` in every element, in order."""
    for k in values:
        got = rx.wait(name, timeout=60)
        assert float(got.min()) == float(got.max()) == k, f"message {k}"
        rx.release(name)


@_gpu
def test_the_cycle_probe_times_the_cuda_calls_of_a_message(tmp_path: Any) -> None:
    """``python -m tensorwire.bench.cycle --device cuda --calls``: each CUDA call of a GPU
    message timed on its own, printed and written as JSON."""
    path = tmp_path / "calls.json"
    probe = [sys.executable, "-m", "tensorwire.bench.cycle", "--device", "cuda", "--calls"]
    out = subprocess.run(
        [*probe, "--count", "300", "--size", "1M", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    calls = {"memcpyAsync", "writeValue64", "device", "current stream", "timer"}
    figures = json.loads(path.read_text())["median_us"]
    assert set(figures) == calls and all(us > 0 for us in figures.values()), figures
    assert "medians of 300 calls each, 1 MiB copies on cuda" in out.stdout, out.stdout


def _gpu_put_protocols(output: str) -> list[str]:
    """The protocol rows of each table UCX_PROTO_INFO printed for a put from GPU memory to GPU
    memory (a title row, then Range/Description/Config framed by three separator lines)."""
    lines = output.splitlines()
    tables = []
    for at, line in enumerate(lines):
        if "ucp_put" in line and "from cuda" in line and " to cuda" in line:
            rows, separators = [], 0
            for row in lines[at + 1 : at + 20]:  # a table has a handful of rows
                separators += "+--" in row
                if separators == 3:
                    break
                if separators == 2 and "+--" not in row:
                    rows.append(row)
            tables.append("\n".join(rows))
    return tables


@_gpu
def test_a_cuda_context_is_made_current_without_changing_the_thread_s_device() -> None:
    """What a NIXL agent needs when it starts (see the test below), on a thread that has
    touched no GPU: the thread's current device's context, the device left as it was."""
    import threading

    cp = _cupy()
    seen: list[Any] = []

    def on_a_fresh_thread() -> None:
        before = cp.cuda.runtime.getDevice()
        held = cuda.hold_context()
        seen.extend([held, cp.cuda.driver.ctxGetCurrent(), before, cp.cuda.runtime.getDevice()])

    thread = threading.Thread(target=on_a_fresh_thread)
    thread.start()
    thread.join(60)
    held, context, before, after = seen
    assert held is True and context != 0 and before == after, seen


@_gpu
@pytest.mark.nixl
@pytest.mark.parametrize("host_first", [False, True], ids=["known-at-connect", "registered-later"])
def test_nixl_moves_gpu_memory_through_cuda_ipc_however_late_the_sender_touched_cuda(
    host_first: bool,
) -> None:
    """A sender that had no CUDA context when it connected (UCX then chose "software emulation"
    over tcp for GPU-to-GPU writes: 0.5 GB/s at 16 MiB on an H100, against 239 through
    cuda_ipc) writes a GPU tensor through ``cuda_ipc``: the receiver's GPU tensor known when it
    connects, or registered after it wrote a host tensor. Told by the protocol UCX reports for
    the put (UCX_PROTO_INFO), and the bytes checked."""
    code = (
        "from tests.peers import send_gpu_after_connecting; "
        f"send_gpu_after_connecting({{address!r}}, {host_first})"
    )
    with tw.Receiver() as rx:
        if host_first:
            rx.register("h", (1024,), "float32")
        else:
            rx.register("g", (1 << 20,), "float32", device="cuda")
        proc = subprocess.Popen(
            [sys.executable, "-c", code.format(address=rx.address)],
            env={**os.environ, "UCX_PROTO_INFO": "y"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        try:
            if host_first:
                assert (rx.wait("h", timeout=60) == 1).all()
                rx.release("h")
                rx.register("g", (1 << 20,), "float32", device="cuda")
            for k in range(1, 4):
                assert bool((rx.wait("g", timeout=60) == k).all()), k
                rx.release("g")
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, out[-4000:]
    tables = _gpu_put_protocols(out)
    assert tables, f"UCX reported no protocol for a GPU-to-GPU put:\n{out[-4000:]}"
    assert not any("software emulation" in t for t in tables), tables
    assert any("cuda_ipc" in t for t in tables), tables


@_gpu
def test_a_torch_side_stream_orders_the_copy_behind_and_before_its_kernels(
    children: Children,
) -> None:
    """A torch user writing from a stream of its own (``with torch.cuda.stream(s)``) and
    rewriting the source on it right after ``write`` returns: the copy goes on that stream
    (torch's streams do not wait for the default one), so every message holds the value of its
    write, never the -1 written after it."""
    _needs("torch")
    count = 40
    with tw.Receiver(ring=3) as rx:
        rx.register("t", (1 << 21,), "float32", device="cuda")  # 8 MiB
        proc = children.start(send_from_a_torch_side_stream, rx.address, "t", count)
        _each_message_all_its_number(rx, "t", count)
        children.join_ok(proc)


@_gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("source", ["torch", "foreign"])
def test_torch_reads_the_slot_without_a_copy(dtype: str, source: str) -> None:
    """Written by torch, or by a DLPack producer that is neither torch nor cupy (a JAX array on
    a GPU, to tensorwire), over a torch tensor's capsules. cupy 14.2 refuses to export float8
    ("dtype is not supported for dlpack export", an H200 on 2026-12-04): the slot's array
    exports it as tensorwire does on the host."""
    torch = needed(TORCH, "PyTorch")
    _needs("torch")
    with tw.Receiver() as rx:
        rx.register("t", (1024,), dtype, device="cuda")
        with tw.Sender.connect(rx.address, transport="shm", timeout=30) as tx:
            sent = torch.randn(1024, device="cuda").to(getattr(torch, dtype))
            tx.write("t", sent if source == "torch" else DLPackProducer(sent))
            view = rx.wait("t", timeout=30)
            tensor = torch.from_dlpack(view)
            assert tensor.data_ptr() == view.data.ptr and tensor.device.type == "cuda"
            assert tensor.dtype == sent.dtype
            assert torch.equal(tensor.view(torch.uint8), sent.view(torch.uint8))
            rx.release("t")


@_gpu
@pytest.mark.parametrize("via", ["shm-synchronised", "shm-gpu-stores", "tcp"])
def test_a_sender_killed_mid_gpu_write_never_completes_a_slot(
    children: Children, via: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """shm: the kill lands inside a CUDA IPC copy often (with the GPU making the completion
    stores, inside one of the copies queued ahead of theirs); tcp: inside a payload staged
    through host memory a chunk at a time at both ends."""
    cp = _cupy()
    if via.startswith("shm-"):  # inherited by the sender's process
        monkeypatch.setenv(cuda_stores.ENV, "1" if via == "shm-gpu-stores" else "0")
        via = "shm"
    shape = (4096, 4096)  # 64 MiB
    with tw.Receiver(ring=2) as rx:
        rx.register("t", shape, "float32", device="cuda")
        parent, child = children.pipe()
        proc = children.start(send_uniform_gpu, rx.address, via, "t", child)
        assert parent.recv() == "go"
        seen = 0
        for _ in range(20):  # bounded: each message is checked whole
            got = rx.wait("t", timeout=60)
            first = float(got[0, 0])
            assert bool((got == first).all()), "a torn message was handed out"
            seen += 1
            rx.release("t")
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        while True:  # whatever landed before the kill is whole
            try:
                got = rx.wait("t", timeout=0.5)
            except (tw.PeerLostError, tw.WireTimeoutError):
                break
            assert bool((got == got[0, 0]).all())
            rx.release("t")
        assert seen == 20 and cp.cuda.runtime.getDeviceCount() > 0  # the context is sound


@_gpu
def test_a_dead_receiver_is_a_peer_lost_error_not_a_cuda_crash(
    transport: str, children: Children
) -> None:
    cp = _cupy()
    parent, child = children.pipe()
    proc = children.start(run_gpu_receiver, child, "t", (1024,))
    assert parent.poll(60)
    address = parent.recv()
    with tw.Sender.connect(address, transport=transport, timeout=10, heartbeat=0.2) as tx:
        tx.write("t", cp.ones(1024, cp.float32))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        with pytest.raises(tw.PeerLostError):
            for _ in range(50):  # bounded: the loss is seen within a heartbeat or two
                tx.write("t", cp.ones(1024, cp.float32), timeout=1)
    cp.cuda.Device(0).synchronize()  # the sender's CUDA context survived


@_gpu
def test_closing_a_receiver_gives_its_gpu_memory_back() -> None:
    cp = _cupy()
    size = 512 << 20
    gc.collect()
    free_before, _ = cp.cuda.runtime.memGetInfo()
    rx = tw.Receiver()
    rx.register("big", (size // 4,), "float32", device="cuda")
    free_during, _ = cp.cuda.runtime.memGetInfo()
    assert free_before - free_during >= size
    rx.close()
    gc.collect()
    free_after, _ = cp.cuda.runtime.memGetInfo()
    assert free_before - free_after < 64 << 20, (free_before, free_after)


@_gpu
def test_sources_convert_without_a_copy() -> None:
    cp = _cupy()
    array = make_array("float32", (4, 4), 1)
    for source in SOURCES[1:]:
        _needs(source)
        obj = on_source(array, source)
        assert cuda.array_device(obj) == 0
        spec = tw.TensorSpec.create("t", (4, 4), "float32")
        checked = spec.check_array(obj)
        assert isinstance(checked, cp.ndarray)
        pointer = obj.data_ptr() if source == "torch" else obj.data.ptr
        assert checked.data.ptr == pointer


@_gpu
def test_bench_on_a_gpu_measures_each_transport_beside_its_limit(tmp_path: Any) -> None:
    """GPU tensors at both ends: shm against a device-to-device copy, nixl against NIXL's own
    VRAM-to-VRAM WRITE, every transport against a pinned host-to-device copy."""
    transports = ["shm", "tcp", *(["nixl"] if NIXL_INSTALLED else [])]
    path = tmp_path / "gpu.json"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tensorwire.bench",
            "--device",
            "cuda",
            "--sizes",
            "64K,3M",
            "--transports",
            ",".join(transports),
            "--repeat",
            "1",
            "--round-trips",
            "20",
            "--no-progress",
            "--json",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(path.read_text())
    assert isinstance(result["config"]["mps"], bool)  # whether NVIDIA's MPS daemon ran
    # whether shm's completion stores could be made by the GPU (the environment's say)
    assert result["config"]["gpu_stream_stores"] is cuda_stores.enabled()
    rows = {(r["method"], r["size"]): r for r in result["throughput"]}
    raw = ["raw-nixl"] if NIXL_INSTALLED else []
    torch_queue = torch_queue_available("cuda") is None
    for size in (65536, 3 << 20):
        assert {m for m, s in rows if s == size} >= {*transports, "d2d", "h2d-pinned", *raw}
        assert rows[("shm", size)]["limit"] == "d2d"
        if raw:
            nixl, limit = rows[("nixl", size)], rows[("raw-nixl", size)]
            assert nixl["limit"] == "raw-nixl" and limit["gbps"] > 0
            assert nixl["x_limit"] == pytest.approx(nixl["gbps"] / limit["gbps"])
        if torch_queue:  # what a PyTorch user does without tensorwire, measured beside it
            queue = rows[("torch-queue", size)]
            assert queue["gbps"] > 0
            assert rows[("shm", size)]["x_torch_queue"] == pytest.approx(
                rows[("shm", size)]["gbps"] / queue["gbps"]
            )
    if not torch_queue:
        assert any("torch-queue skipped" in note for note in result["notes"])
    lat = {r["method"] for r in result["latency"]}
    assert lat >= {*transports, *raw}


# -- completion stores made by the GPU (on unless TENSORWIRE_GPU_STREAM_STORES=0) -----------------


@pytest.mark.skipif(cuda.available(), reason="checks what a host without a CUDA device says")
def test_gpu_made_completion_stores_are_declined_where_the_driver_is_missing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On by default, and on a host without the CUDA driver declined with the reason (the
    writer then synchronises its copies), and nothing is written."""
    monkeypatch.delenv(cuda_stores.ENV, raising=False)
    assert cuda_stores.enabled()
    word = np.zeros(1, np.uint64)
    with caplog.at_level("INFO", logger="tensorwire.cuda_stores"):
        assert cuda_stores.open_stores(0, word.ctypes.data) is None
    assert "GPU-made completion stores unavailable" in caplog.text
    assert "libcuda" in caplog.text and word[0] == 0
    monkeypatch.setenv(cuda_stores.ENV, "0")
    assert not cuda_stores.enabled()


@_gpu
@pytest.mark.parametrize(
    "contract",
    [
        test_dynamic_shapes_parts_and_host_slots_from_gpu_arrays,
        test_wrong_shapes_are_refused_and_credits_hold,
        test_produce_in_place_with_buffer,
    ],
    ids=["dynamic-parts-host", "wrong-shapes-credits", "buffer"],
)
def test_synchronised_gpu_writes_keep_the_contracts(
    monkeypatch: pytest.MonkeyPatch, contract: Any
) -> None:
    """The contracts of the tests above (which run with the GPU making shm's completion stores,
    the default), over shm with the stores turned off: each GPU write synchronised, or completed
    by the channel's thread."""
    monkeypatch.setenv(cuda_stores.ENV, "0")
    contract("shm")
