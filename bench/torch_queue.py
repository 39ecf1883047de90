"""The ``torch-queue`` reference: what a PyTorch user does today to hand GPU tensors to another
process on the same host, without tensorwire.

Measured with ``--device cuda`` where torch sees the GPU. The runner puts a CUDA tensor into a
``torch.multiprocessing`` queue (torch shares its storage through a CUDA IPC handle, per message);
a consumer process copies it into a buffer of its own on the same GPU, synchronises, and
acknowledges through a second queue; the runner waits for the acknowledgement before it sends
the next one, as it must before it may change the tensor it shared. A message is then where a
tensorwire message is when its slot completes: in the consumer's own GPU memory.
"""

from __future__ import annotations

import time
from typing import Any

#: How long the runner waits for the consumer's start or one acknowledgement.
ACK_TIMEOUT = 120.0


def _consume(device: str, sizes: list[int], requests: Any, acks: Any) -> None:
    """The consumer process: a buffer per size; copy each tensor in, synchronise, acknowledge."""
    import torch

    buffers = {s: torch.empty(s, dtype=torch.uint8, device=device) for s in sizes}
    sync = torch.cuda.synchronize if device.startswith("cuda") else lambda _device: None
    sync(device)
    acks.put("ready")
    while True:
        tensor = requests.get()
        if tensor is None:
            return
        buffers[tensor.numel()].copy_(tensor)
        sync(device)
        del tensor  # the producer's storage is released before it hears back
        acks.put(1)


class TorchQueue:
    """A consumer process fed through ``torch.multiprocessing`` queues; ``measure`` times
    ``count`` acknowledged messages of ``size`` bytes."""

    def __init__(self, device: str, sizes: list[int]) -> None:
        import torch
        import torch.multiprocessing as tmp

        self._torch = torch
        self._device = device
        ctx = tmp.get_context("spawn")
        self._requests = ctx.Queue()
        self._acks = ctx.Queue()
        self._proc = ctx.Process(
            target=_consume,
            args=(device, sizes, self._requests, self._acks),
            name="tensorwire-bench-torch-queue",
            daemon=True,
        )
        self._proc.start()
        self.src = {s: torch.zeros(s, dtype=torch.uint8, device=device) for s in sizes}
        try:
            if self._acks.get(timeout=ACK_TIMEOUT) != "ready":
                raise RuntimeError("the torch-queue consumer did not start")
        except BaseException:
            self.close()
            raise

    def measure(self, size: int, count: int) -> float:
        tensor, requests, acks = self.src[size], self._requests, self._acks
        if self._device.startswith("cuda"):
            self._torch.cuda.synchronize(self._device)
        t0 = time.perf_counter()
        for _ in range(count):
            requests.put(tensor)
            acks.get(timeout=ACK_TIMEOUT)
        return time.perf_counter() - t0

    def close(self) -> None:
        if self._proc.is_alive():
            self._requests.put(None)
            self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(10)
        for q in (self._requests, self._acks):
            q.close()
            q.join_thread()


def available(device: str) -> str | None:
    """None where torch can run the reference on ``device``, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        return f"torch sees no {device}"
    return None
