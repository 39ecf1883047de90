"""The argparse types of the daemons' and CLIs' numbers (seconds, amounts, fractions, counts)
and paths, and the ``--version`` every command has.

Each refuses what would pass a bare ``float``/``int`` and misbehave later (NaN, infinity, a
negative count), with a one-line usage error. A module of its own, light to import, so that
``tensorwire ping`` (a health check run every few seconds) need not load the daemons' config.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from ..checks import MAX_SECONDS


def _number(text: str, what: str, ok: Callable[[float], bool], wanted: str) -> float:
    """``text`` as a finite number for which ``ok`` holds, else an argparse error saying what
    was ``wanted`` (NaN compares false with every bound, so a check of the bound alone passed
    it, and an infinite timeout never ends)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"{text!r}: give {wanted}")
    return value


def _seconds(text: str, zero: bool, wanted: str) -> float:
    """``text`` as seconds, more than 0 (0 too, where ``zero``) and at most the library's
    :data:`~tensorwire.checks.MAX_SECONDS` (past it, refused once the daemon ran)."""
    return _number(
        text,
        "a number of seconds",
        lambda v: (v >= 0 if zero else v > 0) and v <= MAX_SECONDS,
        f"{wanted} (at most {MAX_SECONDS:g})",
    )


def positive_seconds(text: str) -> float:
    """An argparse type: a positive number of seconds (a zero or negative interval or timeout
    would heartbeat without pause, or drop every peer at once)."""
    return _seconds(text, False, "a positive number of seconds")


def zero_or_more_seconds(text: str) -> float:
    """An argparse type: 0 or a positive number of seconds (a pause that may be none)."""
    return _seconds(text, True, "0 or more seconds")


def seconds_or_forever(text: str) -> float:
    """An argparse type: 0 or more seconds, or ``forever`` (``inf``): how long a daemon keeps
    answering once its work is done (``tensorwire-ps --linger``)."""
    if text.strip().lower() in ("forever", "inf", "infinity"):
        return math.inf
    return _seconds(text, True, "0 or more seconds, or forever")


def positive_number(text: str) -> float:
    """An argparse type: a positive number (a learning rate)."""
    return _number(text, "a number", lambda v: v > 0, "a positive number")


def below_one(text: str) -> float:
    """An argparse type: a number from 0 up to, not including, 1 (a momentum: at 1 and above
    the velocity never decays)."""
    return _number(text, "a number", lambda v: 0 <= v < 1, "a number from 0 to below 1")


def amount(text: str) -> float:
    """An argparse type: 0 or a positive number (CPUs or GPUs a process asks for)."""
    return _number(text, "a number", lambda v: v >= 0, "0 or a positive number")


def fraction(text: str) -> float:
    """An argparse type: a number from 0 to 1 (an accuracy, a share)."""
    return _number(text, "a number", lambda v: 0 <= v <= 1, "a number from 0 to 1")


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number no smaller than ``minimum`` (a count, a step, a size).
    A negative one would otherwise pass the parser and misbehave later: ``--checkpoint-every
    -1`` checkpointed every step, ``--batch 0`` divided by zero."""

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least {minimum}")
        return value

    return whole


def path(text: str) -> str:
    """An argparse type: a path, refused when empty or blank. An empty one is what a template
    or script passes for a variable left unset (``--curve-keys "$KEYS"``), and taken as the
    flag left out it quietly turned off what the flag asks for: encryption, the secret's file,
    a summary written at the end."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is empty: give a path, or leave the flag out (a variable left unset?)"
        )
    return text


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: the command's name and which tensorwire this is (every command has it;
    given to ``ray-job``, the daemons' own was handed to them, which exited without the
    summaries the job waits for)."""
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
