"""Where a parameter-server shard keeps its arrays: host memory (numpy) or one GPU (cupy).

With ``--device cuda[:N]`` the shard's parameters, the sums of the workers' gradients and the
optimizer's state live in that GPU's memory, and the gradient slots the workers write into are
registered there too (``tw.Receiver.register(..., device=...)``): a gradient lands in GPU memory
(through a CUDA IPC handle, NIXL VRAM or pinned staging, as the transport does it), is summed and
applied by GPU kernels, and the fresh parameters leave from GPU memory. Nothing crosses to the host
on the step's path; checkpoints do (they are host files, and portable between devices).

cupy mirrors numpy's API, so the optimizer and the shard call the same functions on either
module (:attr:`Placement.xp`); only moving values in and out of a device is spelled here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorwire import cuda as tw_cuda

Array = Any  # numpy.ndarray on the host, cupy.ndarray on a GPU


class Placement:
    """One device's array module and the moves between it and host memory.

    ``device`` is ``cpu``, ``cuda`` (the current GPU) or ``cuda:N``. Raises ``ValueError`` for
    another name, :class:`tensorwire.MissingDependencyError` without cupy, and
    :class:`tensorwire.TransportError` for a GPU this host does not have.
    """

    def __init__(self, device: str = "cpu") -> None:
        index = tw_cuda.parse_device(device)
        #: as tensorwire names it: ``cpu`` or ``cuda:N``
        self.name = tw_cuda.describe_device(index)
        self.index = index
        if index is None:
            self.xp: Any = np
        else:
            self.xp = tw_cuda.require_device(index)
            # The shard's allocations and kernels go to this GPU: a daemon uses one device.
            self.xp.cuda.Device(index).use()

    @property
    def on_gpu(self) -> bool:
        return self.index is not None

    def zeros(self, shape: tuple[int, ...], dtype: Any = np.float32) -> Array:
        return self.xp.zeros(shape, dtype)

    def to_host(self, array: Array) -> np.ndarray[Any, Any]:
        """``array`` in host memory (a checkpoint's value): itself if it is there already."""
        if isinstance(array, np.ndarray):
            return array
        return self.xp.asnumpy(array)

    def from_host(self, value: np.ndarray[Any, Any]) -> Array:
        """``value`` (read from a checkpoint) as an array on this device."""
        return self.xp.asarray(value)
