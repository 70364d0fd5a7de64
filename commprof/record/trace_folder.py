"""The folder a rank traces into: the user's `--trace DIR`, or, for the commands whose findings read every
rank's op spans (run, profile), a private folder of the rank's own that goes at the job's end — so that
every run has findings, traced or not, at the trace's cost (benchmarks/trace_overhead.py: 0.33 % of a DDP
iteration). Under commprof's launcher the private folder lies in the job folder, which the launcher removes
even when the rank ends badly; without one (torchrun, a bare mpiexec) it is a temporary folder of its own.

    commprof run --strategy ddp --nproc 2          # findings from a private trace
    commprof run --strategy ddp --nproc 2 --trace t/   # the same findings; t/ kept

Exercised by: `pytest tests/test_findings.py`.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass

from commprof import job


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
    return TraceFolder(tempfile.mkdtemp(prefix=f"commprof-trace-rank{rank}-"), False)

