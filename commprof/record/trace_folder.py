"""The folder a rank traces into: the user's `--trace DIR`, or, for the commands whose findings read every
rank's op spans (run, profile), a private folder of the rank's own that goes at the job's end — so that
every run has findings, traced or not, at the trace's cost (benchmarks/trace_overhead.py: 0.33 % of a DDP
iteration). Under commprof's launcher the private folder lies in the job folder, which the launcher removes
even when the rank ends badly; without one (torchrun, a bare mpiexec) it is a temporary folder named for the
rank's pid, removed at the end, on a failure the rank reports, and — after a rank killed outright — by the
next rank that makes one, as the folders of processes that are gone.

    commprof run --strategy ddp --nproc 2          # findings from a private trace
    commprof run --strategy ddp --nproc 2 --trace t/   # the same findings; t/ kept

Exercised by: `pytest tests/test_findings.py`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from commprof.base import job

PREFIX = "commprof-trace-"
"""A private temporary folder's name: PREFIX, the pid of the rank that made it, '-', random letters."""


@dataclass(frozen=True)
class TraceFolder:
    """Where this rank's trace goes, and whether the user asked for it."""

    path: str
    asked: bool
    """True for --trace's folder: kept, and its merged file announced; False for a private one."""

    def discard(self) -> None:
        """A private folder goes; the user's stays."""
        if not self.asked:
            shutil.rmtree(self.path, ignore_errors=True)


def for_rank(asked: str | None, rank: int, *, findings: bool) -> TraceFolder | None:
    """--trace's folder; else a private one when the command has findings to make; else None (no trace)."""
    if asked:
        return TraceFolder(asked, True)
    if not findings:
        return None
    where = job.folder()
    if where is not None and where.is_dir():
        path = where / f"trace-rank{rank}"
        path.mkdir(exist_ok=True)
        return TraceFolder(str(path), False)
    _sweep()
    return TraceFolder(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"), False)


def _sweep() -> None:
    """Remove the private folders whose rank is gone (killed before it could remove its own)."""
    for stale in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
        pid = stale.name[len(PREFIX):].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except OSError:  # another user's process: alive
            continue

