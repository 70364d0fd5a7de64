"""Progress of a training loop on rank 0's terminal: iteration k of n, the last ms/iteration and the time left,
as bench's sweep shows its points. Drawn on stderr between iterations, at most REFRESH_S apart (no thread of its
own, so nothing draws while an iteration is timed), and gone when the loop ends; nothing at all when stderr is
not a terminal (a log file, a pipe, CI) or on the other ranks.

Exercised by: `pytest tests/test_fit.py -k progress` (a run under a pseudo-terminal).
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

REFRESH_S = 0.5
"""The least time between two draws: a draw costs the training loop a little CPU."""


class StepProgress:
    """`advance(ms)` after each iteration; a context manager around the loop."""

    def __init__(self, what: str, total: int | None, *, show: bool) -> None:
        console = Console(stderr=True)
        self.progress = None
        self.last = 0.0
        if not (show and console.is_terminal):
            return
        columns = ([TextColumn(what), BarColumn(), MofNCompleteColumn()] if total
                   else [TextColumn(what + " {task.completed}")])
        columns += [TextColumn("{task.fields[rate]}")] + ([TimeRemainingColumn()] if total else [])
        self.progress = Progress(*columns, console=console, transient=True, auto_refresh=False,
                                 redirect_stdout=False, redirect_stderr=False)
        self.task = self.progress.add_task(what, total=total, rate="")

    def __enter__(self) -> StepProgress:
        if self.progress is not None:
            self.progress.start()
        return self

    def advance(self, wall_ms: float | None = None) -> None:
        if self.progress is None:
            return
        rate = "" if wall_ms is None else f"{wall_ms:.1f} ms/iteration"
        self.progress.update(self.task, advance=1, rate=rate)
        now = time.monotonic()
        if now - self.last >= REFRESH_S:
            self.progress.refresh()
            self.last = now

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()
