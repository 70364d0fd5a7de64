"""The one screen after a bench sweep: per collective (and algorithm, dtype, layout of ranks, root under -r all),
the latency at the
smallest size, the peak bus bandwidth and the size that reached it, the half-peak size n½ (the smallest size at
which busbw reaches half its peak: below it latency rules, above it bandwidth), the #wrong total, and the rank
that was slowest when one stands out. Plain data first (`summarize`), then its table.

Exercised by: `commprof bench --nproc 2 -e 1M` and
`pytest tests/unit/test_bench_summary.py tests/unit/test_table_widths.py`.
"""

from __future__ import annotations

import re
import statistics

from rich.table import Table

from commprof.report.bench_table import collective_label, ranks_key, ranks_label, several_roots
from commprof.report.fit import Fitting

STANDS_OUT = 0.10
"""A rank stands out as the slowest when it is the slowest in at least two thirds of the rows and its mean time
there is at least this much over the median of the other ranks'."""
NARROW_DROP = ("type", "ranks", "latency size (B)", "slowest rank", "collective", "n½ (B)")
"""What a narrow terminal leaves out of the summary, first to last (fit.fit_rows): the type and the ranks where
every row has the same (said once: "all rows: float32, 2 ranks"), the figures least looked at, the collective
where every row is the same one. A column whose rows differ stays: each row is told from the others."""
LABELS = {"type": str, "ranks": lambda n: f"{n} rank{'' if n == '1' else 's'}" if n.isdigit() else n,
          "collective": str}


def summarize(records: list[dict]) -> list[dict]:
    """One row per collective × algorithm × dtype × layout × root, from the out-of-place records (in-place where
    a collective has no out-of-place mode), in measurement order."""
    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        key = (rec["collective"], rec.get("algo", "library"), rec["dtype"], rec["redop"], ranks_key(rec),
               rec.get("root"))
        groups.setdefault(key, []).append(rec)
    roots = several_roots(records)
    rows = []
    for (collective, algo, dtype, redop, ranks, root), recs in groups.items():
        mode = [r for r in recs if not r["inplace"]] or recs
        timed = [r for r in mode if r["time_us"] is not None]
        if not timed:
            continue
        smallest = min(timed, key=lambda r: r["nbytes"])
        sized = [r for r in timed if r["nbytes"]]
        peak = max(sized, key=lambda r: r["busbw_GBps"]) if sized else None
        half = (min((r for r in sized if r["busbw_GBps"] >= peak["busbw_GBps"] / 2), key=lambda r: r["nbytes"])
                if peak is not None and peak["busbw_GBps"] > 0 else None)
        rows.append({
            "collective": collective, "algo": algo, "dtype": dtype, "redop": redop, "ranks": ranks_label(ranks),
            "root": root, "name": collective_label(collective, algo, root if collective in roots else None),
            "latency_us": smallest["time_us"], "latency_nbytes": smallest["nbytes"],
            "peak_busbw_GBps": peak["busbw_GBps"] if peak else None, "peak_nbytes": peak["nbytes"] if peak else None,
            "half_peak_nbytes": half["nbytes"] if half else None,
            "wrong": sum(r["wrong"] or 0 for r in recs), "slowest": slowest(mode),
        })
    return rows


def slowest(records: list[dict]) -> dict | None:
    """{"rank", "rows", "of", "over_pct"} for the rank that stands out as the slowest (STANDS_OUT), else None."""
    counted = [r for r in records if r.get("per_rank") and len(r["per_rank"]) > 1]
    if not counted:
        return None
    ranks = [r["slowest_rank"] for r in counted]
    rank = max(set(ranks), key=ranks.count)
    mine = [r for r in counted if r["slowest_rank"] == rank]
    if 3 * len(mine) < 2 * len(counted):
        return None
    over = []
    for r in mine:
        others = [p["mean_us"] for p in r["per_rank"] if p["rank"] != rank]
        base = statistics.median(others)
        theirs = next(p["mean_us"] for p in r["per_rank"] if p["rank"] == rank)
        if base > 0:
            over.append(theirs / base - 1)
    if not over or statistics.mean(over) < STANDS_OUT:
        return None
    return {"rank": rank, "rows": len(mine), "of": len(counted), "over_pct": 100 * statistics.mean(over)}


def summary_table(rows: list[dict]) -> Fitting:
    """A line a row: the name (collective/algorithm, root under -r all), the ranks (a count, under a header that
    says ranks), the type, then the figures."""
    table = Table(title="summary", title_justify="left", header_style="bold", caption_justify="left",
                  caption="out-of-place rows where the collective has them, else in-place; n½: the smallest size "
                          "at which busbw reaches half its peak")
    for name in ("collective", "ranks", "type", "latency (us)", "latency size (B)", "peak busbw (GB/s)",
                 "peak size (B)", "n½ (B)", "#wrong", "slowest rank"):
        table.add_column(name, justify="left" if name in ("collective", "ranks", "type", "slowest rank") else "right")
    ops = {row["redop"] for row in rows if row["redop"]}
    for row in rows:
        name = row["name"]
        # under -o all (or -o sum,max) each reduction has its rows: the op beside the dtype tells them apart
        kind = f"{row['dtype']} {row['redop']}" if len(ops) > 1 and row["redop"] else row["dtype"]
        peak = row["peak_busbw_GBps"]
        s = row["slowest"]
        late = "" if s is None else f"{s['rank']} (+{s['over_pct']:.0f} % in {s['rows']} of {s['of']} sizes)"
        table.add_row(name, _ranks(row["ranks"]), kind, f"{row['latency_us']:.2f}", str(row["latency_nbytes"]),
                      "n/a" if peak is None else f"{peak:.3f}", _size(row["peak_nbytes"]),
                      _size(row["half_peak_nbytes"]), str(row["wrong"]), late)
    return Fitting(table, NARROW_DROP, LABELS)


def _ranks(label: str) -> str:
    """'2' for '2 ranks' (the header says ranks); '4 groups of 2' as it is."""
    count = re.fullmatch(r"(\d+) ranks?", label)
    return count.group(1) if count else label


def _size(nbytes: int | None) -> str:
    return "n/a" if nbytes is None else str(nbytes)
