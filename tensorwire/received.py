"""The arrays over slots that users are handed: what :meth:`Receiver.wait` gives (a read-only
view of a landed slot) and what :meth:`Sender.buffer` lends (a writable one, to produce into).

A :class:`ReceivedArray` *is* the slot's memory, not a copy: it is valid until
:meth:`Receiver.release` hands the slot back, after which the next message may overwrite it at
any moment. Copy what must outlive the release (``np.array(view)``).

Each is a numpy array in every way but two. Arithmetic on it returns plain arrays (new memory, not
slots). And it exports itself through DLPack to older consumers too: DLPack before 1.0 cannot
mark memory read-only, so numpy refuses ``__dlpack__()`` without ``max_version`` for a read-only
array, which is how ``jax.dlpack.from_dlpack`` and older PyTorch ask. Such a consumer gets the
slot's memory without the mark, and must not write to it. A ``bfloat16`` or ``float8_*`` slot is
exported with its own DLPack type code (:mod:`tensorwire.dlpack`), which numpy's export lacks:
``torch.from_dlpack(view)`` is a ``torch.bfloat16`` tensor over the slot.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .dlpack import export, ml_code


class SlotArray(np.ndarray):  # type: ignore[type-arg,unused-ignore]
    """A numpy view of a slot: arithmetic gives plain arrays, DLPack reaches every consumer."""

    def __array_wrap__(
        self, obj: np.ndarray[Any, Any], context: Any = None, return_scalar: bool = False
    ) -> Any:
        # A ufunc's result is new memory: a plain array (a scalar where numpy would give one).
        # Written into this array (``out=``, into a lent buffer), it is this array, as numpy
        # gives back the ``out`` it was handed.
        if obj is self:
            return obj
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
        array: np.ndarray[Any, Any] = self
        if not self.flags.writeable and (max_version is None or max_version < (1, 0)):
            array = self.view(np.ndarray)  # a legacy consumer: the same memory, unmarked
            array.flags.writeable = True
        code = ml_code(self.dtype)
        if code is not None:
            return export(array, code, **kwargs)
        return np.ndarray.__dlpack__(array, **kwargs)


class ReceivedArray(SlotArray):
    """What :meth:`Receiver.wait` hands out: a read-only view of a landed slot."""


class LentArray(SlotArray):
    """What :meth:`Sender.buffer` lends for its block: a writable host array to produce the
    message into (over ``shm``, the receiver's slot)."""


def received(view: np.ndarray[Any, Any]) -> ReceivedArray:
    """``view`` (of a slot) as a read-only :class:`ReceivedArray`."""
    out = view.view(ReceivedArray)
    out.flags.writeable = False
    return out
