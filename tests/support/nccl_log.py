"""A parser of nccl-tests logs (`all_reduce_perf …`'s stdout) as its users write one: every line that does not
start with `#` and holds a row's five leading columns is a result row, split on whitespace; `# Out of bounds
values` and `# Avg bus bandwidth` close a run. It knows nothing of commprof: tests/unit/test_nccl_text.py holds
it against a real nccl-tests log first, then reads `commprof bench --format nccl-tests`'s output with it, and
tests/test_bench_cli.py reads a real job's.

    runs = parse(text)           # [Run(rows=[Row(size=8, count=2, type='float', …)], avg_busbw=0.02, …)]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)(?=\s)")
"""size, count, type, redop, root: what every row starts with; NCCL's INFO lines (`host:pid:tid [0] NCCL INFO …`)
and MPI's chatter never do."""
OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)")
AVG_BUSBW = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
BODY_WIDTH = 32
"""The width of one mode's four columns; nccl-tests leaves it blank for a mode it did not measure."""


@dataclass
class Mode:
    """One mode's columns: time (us), algbw and busbw (GB/s), #wrong (None: N/A, unchecked)."""

    time_us: float
    algbw: float
    busbw: float
    wrong: int | None


@dataclass
class Row:
    size: int
    count: int
    type: str
    redop: str
    root: int
    out_of_place: Mode | None
    in_place: Mode | None


@dataclass
class Run:
    """One binary's run: its rows, then its footer."""

    rows: list[Row] = field(default_factory=list)
    out_of_bounds: int | None = None
    ok: bool | None = None
    avg_busbw: float | None = None


def _mode(fields: list[str]) -> Mode:
    time, algbw, busbw, wrong = fields
    return Mode(float(time), float(algbw), float(busbw), None if wrong == "N/A" else int(float(wrong)))


def parse(text: str) -> list[Run]:
    runs, run = [], Run()
    for line in text.splitlines():
        if line.startswith("#"):
            if m := OUT_OF_BOUNDS.match(line):
                run.out_of_bounds, run.ok = int(m.group(1)), m.group(2) == "OK"
            elif m := AVG_BUSBW.match(line):
                run.avg_busbw = float(m.group(1))
                runs.append(run)
                run = Run()
            continue
        m = ROW.match(line)
        if not m:
            continue
        rest = line[m.end():]
        fields = rest.split()
        if len(fields) == 8:
            oop, ip = _mode(fields[:4]), _mode(fields[4:])
        elif len(fields) == 4:  # one mode: blank out-of-place columns before it, or nothing after it
            gap = len(rest) - len(rest.lstrip())
            oop, ip = (None, _mode(fields)) if gap > BODY_WIDTH else (_mode(fields), None)
        else:
            raise ValueError(f"not an nccl-tests row: {line!r}")
        size, count, type_, redop, root = m.groups()
        run.rows.append(Row(int(size), int(count), type_, redop, int(root), oop, ip))
    return runs
