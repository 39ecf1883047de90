"""The ``raw-nixl`` reference: NIXL driven by hand, the limit of the ``nixl`` transport.

Each end is a NIXL agent with the UCX backend (created as the transport creates its own: no
progress thread, the same UCX settings) and one registered buffer, in host memory (``DRAM``: a
mapping of /dev/shm or private memory, as the transport's receivers have) or,
with ``--device cuda``, in GPU memory (``VRAM``: UCX moves it GPU to GPU, as the transport does
for GPU tensors); the ends exchange their metadata and buffer addresses once. Throughput:
``count`` WRITEs of the runner's buffer into the peer's, each awaited to completion (as a
one-sided write of the transport is), then one notification that the peer polls for. Round
trip: a WRITE carrying a notification, and the same back from the peer once it has seen it: what
``nixl`` does per message without tensorwire's headers, credits, spec checks or threads. Only
NIXL's public API; no tensorwire data path.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import time
from typing import Any

import numpy as np

from tensorwire import NixlOptions, TensorWireError, rdma
from tensorwire import cuda as tw_cuda

#: the notification that ends a throughput measurement, and the ping of a round trip
END, PING = b"end", b"p"


def _shared_mapping(nbytes: int) -> mmap.mmap:
    """``nbytes`` of /dev/shm, mapped; the file is unlinked at once, so nothing is left behind
    however the process ends."""
    fd, path = tempfile.mkstemp(prefix="tensorwire-bench-raw-nixl-", dir="/dev/shm")
    try:
        os.unlink(path)
        os.ftruncate(fd, nbytes)
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


class RawNixl:
    """One end: an agent, its registered buffer and, once connected, the other end's."""

    def __init__(
        self, role: str, nbytes: int, loopback: bool, device: str = "cpu", shared: bool = False
    ) -> None:
        self.name = f"tensorwire-bench-raw-{role}-{os.getpid()}"
        self.agent: Any = rdma.create_agent(self.name, NixlOptions(), loopback)
        # Real bytes, as the transport's writes carry: a buffer never written reads as the
        # kernel's zero page, which stays in the cache, and made raw NIXL look faster than
        # memcpy from 16 MiB up (BENCHMARKS.md, "Receiver memory").
        host = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8)
        index = tw_cuda.parse_device(device)
        # ``shared``: host memory of the kind a receiver's slots are in by default, a mapping
        # of /dev/shm, whose pages are not huge where tmpfs has none; the private buffer above
        # is on huge pages where the kernel gives them. Raw NIXL is measured into the kind of
        # memory the transport's receiver has (--receiver-memory), so that their ratio is what
        # tensorwire costs, not what a page size does.
        self._shared: mmap.mmap | None = None
        if shared and index is None:
            self._shared = _shared_mapping(nbytes)
            mapped = np.frombuffer(self._shared, np.uint8, nbytes)
            mapped[:] = host
            host = mapped
        self.buffer: Any = host
        self.memory, self.device = "DRAM", 0
        if index is not None:
            cp = tw_cuda.cupy()
            with cp.cuda.Device(index):
                self.buffer = cp.asarray(host)
            self.memory, self.device = "VRAM", index
        self.address = tw_cuda.data_pointer(self.buffer)
        self._descs = self.agent.register_memory(
            [(self.address, nbytes, self.device, "")], self.memory
        )
        self.remote = ""
        self.remote_address = 0
        self.remote_memory, self.remote_device = "DRAM", 0
        self._requests: dict[tuple[int, bytes], Any] = {}

    def details(self) -> dict[str, Any]:
        return {
            "metadata": self.agent.get_agent_metadata(),
            "address": self.address,
            "memory": self.memory,
            "device": self.device,
        }

    def connect(self, details: dict[str, Any]) -> None:
        name = self.agent.add_remote_agent(details["metadata"])
        self.remote = name.decode() if isinstance(name, bytes) else str(name)
        self.remote_address = int(details["address"])
        self.remote_memory = str(details.get("memory", "DRAM"))
        self.remote_device = int(details.get("device", 0))
        self.agent.make_connection(self.remote)

    def _request(self, size: int, notification: bytes) -> Any:
        request = self._requests.get((size, notification))
        if request is None:
            local = self.agent.get_xfer_descs([(self.address, size, self.device)], self.memory)
            far = self.agent.get_xfer_descs(
                [(self.remote_address, size, self.remote_device)], self.remote_memory
            )
            request = self.agent.initialize_xfer("WRITE", local, far, self.remote, notification)
            self._requests[size, notification] = request
        return request

    def write(self, size: int, notification: bytes = b"", timeout: float = 60.0) -> None:
        """One WRITE of ``size`` bytes into the other end's buffer, awaited to completion."""
        request = self._request(size, notification)
        state = self.agent.transfer(request)
        give_up = time.monotonic() + timeout
        spins = 0
        while state == "PROC":
            state = self.agent.check_xfer_state(request)
            spins += 1
            if spins % 1024 == 0 and time.monotonic() > give_up:
                raise TensorWireError(f"raw NIXL write of {size} bytes did not complete")
        if state != "DONE":
            raise TensorWireError(f"raw NIXL write of {size} bytes failed ({state})")

    def notify(self, message: bytes) -> None:
        self.agent.send_notif(self.remote, message)

    def await_notification(self, message: bytes, timeout: float = 120.0) -> None:
        """Poll (which is also what makes this agent progress) until ``message`` arrives."""
        give_up = time.monotonic() + timeout
        while True:
            for messages in self.agent.get_new_notifs().values():
                if message in messages:
                    return
            if time.monotonic() > give_up:
                raise TensorWireError(f"no raw NIXL notification {message!r} in {timeout:g} s")

    # -- the two measurements, each end's half -------------------------------------------------

    def send(self, size: int, count: int) -> None:
        for _ in range(count):
            self.write(size)
        self.notify(END)

    def sink(self) -> None:
        self.await_notification(END)

    def ping(self, size: int) -> None:
        self.write(size, PING)
        self.await_notification(PING)

    def echo(self, size: int, count: int) -> None:
        for _ in range(count):
            self.await_notification(PING)
            self.write(size, PING)

    def close(self) -> None:
        for request in self._requests.values():
            request.release()
        self._requests.clear()
        if self.remote:
            self.agent.remove_remote_agent(self.remote)
            self.remote = ""
        self.agent.deregister_memory(self._descs)
        if self._shared is not None:
            self.buffer = None  # the last view of the mapping: it cannot close while one lives
            self._shared.close()
            self._shared = None
