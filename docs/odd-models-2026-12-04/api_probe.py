"""What a library user's first calls of Receiver and Sender meet: a sender connected as a socket
is (``tx = Sender(); tx.connect(address)``), arrays of other kinds and dtypes, a tensor
registered after the sender connected, calls out of order. Prints one line per call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import tensorwire as tw


def attempt(what: str, call: Callable[[], Any]) -> None:
    try:
        print(what, "->", repr(call())[:150])
    except Exception as exc:  # (each outcome is what is probed)
        print(what, "!!", type(exc).__name__, str(exc)[:300])


rx = tw.Receiver()
attempt("register with a torch dtype", lambda: rx.register("w", (4,), torch.float32))
attempt("register twice", lambda: rx.register("w", (4,), "float32"))
attempt("register a bad dtype", lambda: rx.register("b", (4,), "float33"))
attempt("wait for an unknown tensor", lambda: rx.wait("nope", timeout=0))
attempt("release before a wait", lambda: rx.release("w"))
tx = tw.Sender(timeout=5)
attempt("connect on a sender", lambda: tx.connect(rx.address))
attempt("write a torch Parameter", lambda: tx.write("w", torch.nn.Parameter(torch.ones(4))))
attempt("wait", lambda: rx.wait("w", timeout=2).tolist())
attempt("release", lambda: rx.release("w"))
attempt("write a list", lambda: tx.write("w", [1, 2, 3, 4]))
attempt("write float64", lambda: tx.write("w", np.ones(4)))
attempt("write non-contiguous", lambda: tx.write("w", torch.ones(8)[::2]))
attempt("register after connecting", lambda: rx.register("late", (2,), "int32"))
attempt("write it", lambda: tx.write("late", np.array([1, 2], np.int32)))
attempt("wait for it", lambda: rx.wait("late", timeout=2).tolist())
tx.close()
rx.close()
attempt("wait after close", lambda: rx.wait("w", timeout=0))
