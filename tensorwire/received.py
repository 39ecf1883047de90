"""What :meth:`Receiver.wait` hands out: a read-only numpy view of a slot.

A :class:`ReceivedArray` *is* the slot's memory, not a copy: it is valid until
:meth:`Receiver.release` hands the slot back, after which the next message may overwrite it at
any moment. Copy what must outlive the release (``np.array(view)``).

It is a numpy array in every way but two. Arithmetic on it returns plain arrays (new memory, not
slots). And it exports itself through DLPack to older consumers too: DLPack before 1.0 cannot
mark memory read-only, so numpy refuses ``__dlpack__()`` without ``max_version`` for a read-only
array, which is how ``jax.dlpack.from_dlpack`` and older PyTorch ask. Such a consumer gets the
slot's memory without the mark, and must not write to it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ReceivedArray(np.ndarray):  # type: ignore[type-arg,unused-ignore]
    def __array_wrap__(
        self, obj: np.ndarray[Any, Any], context: Any = None, return_scalar: bool = False
    ) -> Any:
        # A ufunc's result is new memory: a plain array (a scalar where numpy would give one).
        if return_scalar:
            return obj[()]
        return obj if type(obj) is np.ndarray else obj.view(np.ndarray)

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> Any:
        kwargs: dict[str, Any] = {"stream": stream}
        if max_version is not None:  # numpy < 2.1 takes only stream
            kwargs["max_version"] = max_version
        if dl_device is not None:
            kwargs["dl_device"] = dl_device
        if copy is not None:
            kwargs["copy"] = copy
        if self.flags.writeable or (max_version is not None and max_version >= (1, 0)):
            return np.ndarray.__dlpack__(self, **kwargs)
        alias = self.view(np.ndarray)  # a legacy consumer: the same memory, unmarked
        alias.flags.writeable = True
        return np.ndarray.__dlpack__(alias, **kwargs)


def received(view: np.ndarray[Any, Any]) -> ReceivedArray:
    """``view`` (of a slot) as a read-only :class:`ReceivedArray`."""
    out = view.view(ReceivedArray)
    out.flags.writeable = False
    return out
