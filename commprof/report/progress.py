"""Progress of a training loop on rank 0's terminal: iteration k of n, the last ms/iteration and the time left (a
profiled script's iterations, whose count only the script knows: iteration k and the time so far), as bench's
sweep shows its points. A script's own prints to the same terminal go above the line. Drawn on stderr between
iterations, at most REFRESH_S apart (no thread of its own, so nothing draws while an iteration is timed), and
gone when the loop ends; nothing at all when stderr is not a terminal (a log file, a pipe, CI) or on the other
ranks.

Exercised by: `pytest tests/test_fit.py -k progress` (a run under a pseudo-terminal).
"""

from __future__ import annotations

import os
import sys
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

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
        # a script decides how many iterations it runs: without a total, the time so far in place of the time left
        columns += [TextColumn("{task.fields[rate]}"), TimeRemainingColumn() if total else TimeElapsedColumn(),
                    TextColumn("{task.fields[live]}")]
        # where stdout is the same terminal (a script's own prints), its lines go above the progress line, not
        # onto it; stdout elsewhere (a file, a pipe) is left as it is
        shared = _same_terminal(sys.stdout, sys.stderr)
        self.progress = Progress(*columns, console=console, transient=True, auto_refresh=False,
                                 redirect_stdout=shared, redirect_stderr=shared)
        self.task = self.progress.add_task(what, total=total, rate="", live="")

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

    def say(self, text) -> None:
        """A line of the job's own beside the progress (a live job's last window: live/monitor.py), drawn now:
        it comes from a thread of its own, once a window, maybe after the loop's last draw. `text` may be a
        call `text(width, iteration=, total=, eta_s=)` that makes the whole row in the terminal's width (the
        live line: who costs the step first, then the iteration and the time left, then the rest)."""
        if self.progress is None:
            return
        if callable(text):
            self.progress.columns = (_Whole(text, self.progress.console),)
        else:
            self.progress.update(self.task, live=text)
        self.progress.refresh()

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()


class _Whole(ProgressColumn):
    """The row as one text that `compose` fits to the console's width, given the loop's iteration and ETA."""

    def __init__(self, compose, console: Console) -> None:
        super().__init__()
        self.compose, self.console = compose, console

    def render(self, task) -> Text:
        eta = task.time_remaining if task.total else None
        return Text(self.compose(self.console.width, iteration=int(task.completed), total=task.total, eta_s=eta),
                    no_wrap=True, overflow="crop")


def _same_terminal(a, b) -> bool:
    """Whether streams `a` and `b` write to one terminal."""
    try:
        return a.isatty() and b.isatty() and os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))
    except (AttributeError, OSError, ValueError):
        return False
