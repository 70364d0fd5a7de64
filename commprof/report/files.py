"""JSON and CSV reports, written atomically: a temp file in the same folder, fsync, then rename, so a
killed run leaves either the previous complete file or the new one, never half a file.

Exercised by: `pytest tests/test_bench_cli.py -k json`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path

CSV_COLUMNS = ("collective", "algo", "backend", "world_size", "dtype", "redop", "root", "inplace", "nbytes", "count",
               "time_us", "algbw_GBps", "busbw_GBps", "wrong", "time_us_min_rank", "time_us_max_rank",
               "slowest_rank", "p50_us", "p99_us", "min_us", "max_us", "model_us")


def write_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, env: dict, results: list[dict]) -> None:
    write_atomic(path, json.dumps({"env": env, "results": results}, indent=1) + "\n")


def write_csv(path: str | Path, results: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(results)
    write_atomic(path, buf.getvalue())
