"""Copying one large host array with several threads at once: ``Sender(copy_threads=N)``.

Owns a sender's pool of copy threads and the rule for when splitting a copy pays. A large ``shm``
write is one copy into the receiver's slot. Where one thread does not reach the machine's memory
bandwidth, parts copied by several threads at once move more, and numpy lets go
of the GIL while it copies, so the parts do run at once. Handing a part to a thread costs tens of
microseconds, so no part is smaller than :data:`MIN_PART_BYTES`: on the 2-core VM of
BENCHMARKS.md (``python -m tensorwire.bench.copy_threads``) two threads copied 1 MiB at 0.25x and
4 MiB at 0.7x the rate of one, 16 MiB at 1.1-1.7x and 64 MiB at 1.0-1.2x over several runs. Off
by default: it pays only where a core is free for it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from .checks import check_count

#: No part of a split copy is smaller than this.
MIN_PART_BYTES = 8 << 20


def check_copy_threads(threads: object) -> int:
    """``copy_threads`` as given to a sender: a whole number, at least 1."""
    return check_count("copy_threads", threads, 1)


class SplitCopier:
    """Copies with up to ``threads`` threads: the caller's own and ``threads - 1`` others,
    started once and kept until :meth:`close`."""

    def __init__(self, threads: int, name: str) -> None:
        self.threads = check_copy_threads(threads)
        self._pool = ThreadPoolExecutor(threads - 1, thread_name_prefix=f"{name}-copy")

    def copy(self, dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
        """``dst[:] = src`` (both flat ``uint8``, of one length), split in equal parts of at
        least :data:`MIN_PART_BYTES`. Returns once every part has landed."""
        parts = min(self.threads, src.nbytes // MIN_PART_BYTES)
        if parts < 2:
            np.copyto(dst, src)
            return
        step = -(-src.nbytes // parts)
        others = [
            self._pool.submit(
                np.copyto, dst[k * step : (k + 1) * step], src[k * step : (k + 1) * step]
            )
            for k in range(1, parts)
        ]
        try:
            np.copyto(dst[:step], src[:step])
        finally:
            wait(others)  # every part has stopped writing before the caller publishes or raises
        for part in others:
            part.result()

    def close(self) -> None:
        """Stop the threads (after any copy in progress). Idempotent."""
        self._pool.shutdown(wait=True)
