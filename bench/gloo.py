"""The ``gloo`` reference: what a PyTorch user writes to move CPU tensors between processes
without tensorwire, torch.distributed's point-to-point ``send`` and ``recv`` over the gloo
backend (its C++ TCP transport).

Measured with ``tensorwire bench --gloo`` where torch is installed, on host memory. The runner is
rank 0 of a two-rank process group and hosts its rendezvous store; the peer is rank 1. A
``recv`` fills a tensor the receiving side allocated once, as a message fills a tensorwire slot.
Two rows, the clock stopping when the peer has received the last message:

* ``gloo``: ``send`` and ``recv`` one after the other, each waited for (``dist.send`` and
  ``dist.recv``: a send returns once its tensor may be reused, as ``Sender.write`` does);
* ``gloo-isend``: ``isend`` and ``irecv`` pipelined, the sender with up to ``window`` sends in
  flight and the receiver with ``window`` receive buffers posted in turn, ``window`` being the
  slots a tensorwire receiver gives a tensor of that size (``auto_depth``): the best a hand-written
  loop gets from gloo, with the memory tensorwire uses.

The round trip is a ``send`` and a ``recv`` of the reply.
"""

from __future__ import annotations

import datetime
from collections import deque
from typing import Any

import numpy as np

#: rank 0: the runner; rank 1: the peer
RUNNER, PEER = 0, 1
#: the rendezvous and every transfer's bound
TIMEOUT = datetime.timedelta(seconds=120)


def available(device: str) -> str | None:
    """None where the reference can run on ``device``, else why not."""
    if device != "cpu":
        return "gloo's send and recv are measured on host memory only (--device cpu)"
    try:
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed (pip install 'tensorwire[torch]')"
    if not dist.is_available() or not dist.is_gloo_available():
        return "this torch has no gloo backend"
    return None


class Gloo:
    """One end of the two-rank gloo process group, its pairs on ``host`` (this end's address
    towards the other). Rank 0 opens the rendezvous store first (:meth:`open_store`) and passes
    it; rank 1 reaches it at ``store_host:port``. Each end's constructor returns once both
    have joined."""

    def __init__(
        self, rank: int, host: str, port: int, *, store: Any = None, store_host: str = ""
    ) -> None:
        import torch
        import torch.distributed as dist

        self._torch = torch
        if store is None:
            store = dist.TCPStore(store_host, port, 2, False, timeout=TIMEOUT)
        self._store = store
        group = dist.ProcessGroupGloo
        try:
            # gloo's pairs listen on the address the peer reaches us at; its default device
            # takes the host name's address, which may be a loopback one (127.0.1.1) another
            # host cannot reach. The options are torch's own, underscored (torch builds its
            # groups with them); where a torch lacks them, the default device serves.
            options = group._Options()
            options._devices = [group.create_device(hostname=host)]
            options._timeout = TIMEOUT
            self._group = group(store, rank, 2, options)
        except AttributeError:
            self._group = group(store, rank, 2, TIMEOUT)
        self._other = PEER if rank == RUNNER else RUNNER
        self._tensors: dict[tuple[int, int], Any] = {}

    @staticmethod
    def open_store(host: str) -> Any:
        """Rank 0's rendezvous store, on a port the kernel chose (its ``port``)."""
        import torch.distributed as dist

        return dist.TCPStore(host, 0, 2, True, timeout=TIMEOUT, wait_for_workers=False)

    def _tensor(self, array: np.ndarray[Any, Any]) -> Any:
        """``array`` as a torch tensor over the same memory (made once per array)."""
        key = (array.__array_interface__["data"][0], array.nbytes)
        tensor = self._tensors.get(key)
        if tensor is None:
            tensor = self._tensors[key] = self._torch.from_numpy(array)
        return tensor

    def send(self, array: np.ndarray[Any, Any], count: int = 1) -> None:
        tensors = [self._tensor(array)]
        for _ in range(count):
            self._group.send(tensors, self._other, 0).wait()

    def recv(self, array: np.ndarray[Any, Any], count: int = 1) -> None:
        tensors = [self._tensor(array)]
        for _ in range(count):
            self._group.recv(tensors, self._other, 0).wait()

    def send_pipelined(self, array: np.ndarray[Any, Any], count: int, window: int) -> None:
        """``count`` sends of ``array``, up to ``window`` of them in flight."""
        tensors = [self._tensor(array)]
        flight: deque[Any] = deque()
        for _ in range(count):
            if len(flight) == window:
                flight.popleft().wait()
            flight.append(self._group.send(tensors, self._other, 0))
        while flight:
            flight.popleft().wait()

    def recv_pipelined(self, arrays: list[np.ndarray[Any, Any]], count: int) -> None:
        """``count`` receives, into ``arrays`` in turn, one posted in each at all times (gloo
        matches a pair's receives in the order they were posted)."""
        tensors = [[self._tensor(a)] for a in arrays]
        posted = deque(
            self._group.recv(tensors[i], self._other, 0) for i in range(min(len(arrays), count))
        )
        for i in range(count):
            posted.popleft().wait()
            if i + len(arrays) < count:  # the buffer is read: post it again
                posted.append(self._group.recv(tensors[i % len(arrays)], self._other, 0))

    def echo(self, array: np.ndarray[Any, Any], count: int) -> None:
        """The round trip's far end: each ping received into ``array`` and sent back."""
        tensors = [self._tensor(array)]
        for _ in range(count):
            self._group.recv(tensors, self._other, 0).wait()
            self._group.send(tensors, self._other, 0).wait()

    def close(self) -> None:
        self._tensors.clear()
        self._group = None
        self._store = None
