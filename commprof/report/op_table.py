"""The time each op took, per op and group, as `nsys stats` and NCCL's Inspector give it: a row per (op, group)
with its count, its payload bytes and the min / median / p99 / max of its issue-to-completion time (µs), over
rank 0's own ops in the measured iterations. `commprof profile` prints it after the volume table, whose counts
and bytes it repeats over the whole measured span, and saves the rows in its --json as "op_times"
(commprof/profile/results.py reads them from rank 0's trace). Rank 0's own ops only, at any world size: the
table stays a few rows at 16,384 ranks, and every rank's ops are in its own trace file (--trace DIR).

    commprof profile --nproc 2 --json p.json -- tests/scripts/ddp_train.py --steps 8

Pure: plain data in (op tuples, rows), rows and a Rich table out. Exercised by: `pytest tests/unit/test_op_table.py`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import numpy as np
from rich.table import Table

from commprof.base.units import format_bytes
from commprof.report.fit import Narrowing

QUANTILE = 99
"""The upper percentile shown beside the max: one op in a hundred took longer."""


def op_time_rows(ops: Iterable[tuple[str, str, int, float]], *, rank: int = 0) -> list[dict]:
    """(op name, group label, payload bytes, issue-to-completion µs) of every op -> one row per (op, group), in
    the volume table's order (by its key: the op's name, then "name (group)"): count, payload bytes (all of its
    ops'), and the min, median, p99 and max of their times (numpy's, the p99 interpolated linearly)."""
    by: dict[tuple[str, str], list] = defaultdict(lambda: [0, []])
    for name, group, nbytes, us in ops:
        got = by[name, group]
        got[0] += nbytes
        got[1].append(us)
    rows = []
    for (name, group), (nbytes, times) in sorted(by.items(), key=lambda kv: key(*kv[0])):
        t = np.asarray(times, dtype=float)
        rows.append({"op": name, "group": group, "rank": rank, "count": len(times), "payload_bytes": int(nbytes),
                     "min_us": float(t.min()), "median_us": float(np.median(t)),
                     "p99_us": float(np.percentile(t, QUANTILE)), "max_us": float(t.max())})
    return rows


def key(name: str, group: str) -> str:
    """How the volume table names an op of a group: its name alone on the whole world (record/volume.py)."""
    return name if group == "world" else f"{name} ({group})"


def op_table(rows: list[dict], *, iterations: int | None = None) -> Narrowing:
    """The rows as a table; `iterations`: the measured iterations they span, for the caption."""
    table = Table(title="time per op (rank 0; issue to completion, µs)", title_justify="left")
    for label in ("op", "count", "payload", "min µs", "median µs", f"p{QUANTILE} µs", "max µs"):
        table.add_column(label, justify="left" if label == "op" else "right")
    for r in rows:
        table.add_row(key(r["op"], r["group"]), str(r["count"]), format_bytes(r["payload_bytes"]),
                      *(_us(r[k]) for k in ("min_us", "median_us", "p99_us", "max_us")))
    span = f"its {iterations} measured iterations" if iterations is not None else "its measured iterations"
    ranks = {r["rank"] for r in rows}
    who = f"rank {ranks.pop()}'s" if len(ranks) == 1 else "rank 0's"
    table.caption = (f"{who} own ops over {span} (rank 0 alone at any world size; each rank's are in its own "
                     "trace file: --trace DIR)")
    table.caption_justify = "left"
    return Narrowing(table, ("min µs", "payload"))


def _us(value: float) -> str:
    """µs to a width that stays readable from 3 µs to 30 s: one decimal below 1,000, none above."""
    return f"{value:.1f}" if value < 1000 else f"{value:,.0f}"
