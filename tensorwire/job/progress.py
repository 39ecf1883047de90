"""Progress for the daemons: a rich bar on a terminal, plain log lines everywhere else."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    def __init__(self, label: str, total: int, enabled: bool = True, every: int = 10) -> None:
        self.label = label
        self.total = total
        self.every = max(1, every)
        self.t0: float | None = None  # the rate counts from the first update
        self._bar: Any = None
        self._task: Any = None
        if enabled and sys.stderr.isatty():
            try:
                from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
                from rich.progress import Progress as Bar
            except ImportError:
                pass
            else:
                self._bar = Bar(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    TextColumn("{task.completed}/{task.total}"),
                    TextColumn("{task.fields[info]}"),
                    TimeElapsedColumn(),
                    transient=False,
                )
                self._task = self._bar.add_task(label, total=total, info="")
                self._bar.start()
        self.enabled = enabled

    def update(self, done: int, **info: float | None) -> None:
        now = time.monotonic()
        if self.t0 is None:
            self.t0, self.first = now, done
        rate = (done - self.first) / max(now - self.t0, 1e-9)
        text = " ".join(f"{k} {v:.4g}" for k, v in info.items() if v is not None)
        text = f"{text} {rate:.1f} steps/s"
        if self._bar is not None:
            self._bar.update(self._task, completed=done, info=text)
        elif self.enabled and (done % self.every == 0 or done == self.total):
            print(f"{self.label}: step {done}/{self.total} {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
