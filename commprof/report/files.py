"""JSON and CSV reports, written atomically: a temp file in the same folder, fsync, then rename, so a
killed run leaves either the previous complete file or the new one, never half a file.

Exercised by: `pytest tests/test_bench_cli.py tests/test_failures.py`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

CSV_COLUMNS = ("collective", "algo", "backend", "world_size", "group_size", "groups", "dtype", "redop", "root",
               "inplace", "nbytes", "count", "time_us", "algbw_GBps", "busbw_GBps", "wrong", "time_us_min_rank", "time_us_max_rank",
               "slowest_rank", "p50_us", "p99_us", "min_us", "max_us", "model_us")


def write_atomic(path: str | Path, text: str, *, sync: bool = True) -> None:
    """Replace `path` by `text` in one rename. `sync` False skips the fsync: still whole after a killed
    process, only not after a crash of the machine — for the snapshots rewritten while a run goes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, env: dict, results: list[dict], *, complete: bool = True,
               reason: str | None = None, sync: bool = True) -> None:
    """The bench's results so far; `complete` False (with the reason) while or because the sweep stopped early."""
    doc = {"complete": complete, **({"reason": reason} if reason else {}), "env": env, "results": results}
    write_atomic(path, json.dumps(doc, indent=1) + "\n", sync=sync)


def mark_incomplete(path: str | Path, reason: str) -> None:
    """After a failed job: a JSON that is not marked complete says why it stopped (made if absent)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        doc = {}
    if not isinstance(doc, dict) or doc.get("complete") is True:
        return
    doc = {"complete": False, "reason": reason, **{k: v for k, v in doc.items() if k not in ("complete", "reason")}}
    write_atomic(path, json.dumps(doc, indent=1) + "\n")


def write_csv(path: str | Path, results: list[dict], *, sync: bool = True) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(results)
    write_atomic(path, buf.getvalue(), sync=sync)


@dataclass(frozen=True)
class Outputs:
    """Where a job writes, and the command line it was started with: part of every command's config."""

    argv: tuple[str, ...] = ()
    """The arguments after `commprof`: the launcher starts every rank with them, the env block records them."""
    json: str | None = None
    """--json: env and results as JSON, rewritten as they arrive and marked complete at the end."""
    csv: str | None = None
    """--csv: results as CSV (bench)."""
    trace: str | None = None
    """--trace: the folder of the per-rank Chrome traces and the merged trace.json."""
    debug_dump: str | None = None
    """--debug-dump: the folder of each rank's flight record after a failure."""

    def dump_folder(self) -> str | None:
        """Where a failing rank writes its flight record: --debug-dump, else the --json file's folder."""
        if self.debug_dump:
            return self.debug_dump
        return str(Path(self.json).resolve().parent) if self.json else None
