"""A rank's measured iterations as the figures every command reports: the median of each over the iterations,
and each figure across ranks (avg, the headline; min, max, slowest rank, skew). Plain data; `commprof run`
(run/results.py) and `commprof profile` (profile/results.py) build their reports on it.
Exercised by: `pytest tests/test_run_cli.py tests/test_profile_cli.py`.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

FIGURES = ("wall_ms", "data_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "overlap_ms", "bubble_ms", "other_ms")
"""Per iteration; data + compute + exposed + bubble + other = wall (record/phases.py)."""


def figure(it: dict, name: str) -> float:
    """An iteration's figure `name`; other_ms made from the rest for a document written before it was kept."""
    if name == "other_ms" and name not in it:
        rest = it.get("data_ms", 0.0) + it["compute_ms"] + it["exposed_comm_ms"] + it.get("bubble_ms", 0.0)
        return max(0.0, it["wall_ms"] - rest)
    return it[name]


def across(values: list[float]) -> dict:
    arr = np.asarray(values, dtype=float)
    return {"avg": float(arr.mean()), "min": float(arr.min()), "max": float(arr.max()),
            "slowest_rank": int(arr.argmax()), "skew": float(arr.max() - arr.min())}


def time_row(result: dict) -> dict:
    """One rank's time figures: the median of each over its measured iterations (0 without any), comm per
    process group, overlap % = Σ overlap / Σ comm."""
    its = result["iterations"]
    row = {"rank": result["rank"]}
    for name in FIGURES:
        row[name] = float(np.median([figure(it, name) for it in its])) if its else 0.0
    groups = sorted({g for it in its for g in it["comm_by_group_ms"]})
    row["comm_by_group_ms"] = {g: float(np.median([it["comm_by_group_ms"].get(g, 0.0) for it in its]))
                               for g in groups}
    comm = sum(it["comm_ms"] for it in its)
    row["overlap_pct"] = 100.0 * sum(it["overlap_ms"] for it in its) / comm if comm > 0 else 0.0
    return row


def time_summary(rows: list[dict]) -> dict:
    """The time figures across ranks: each one's average (the headline), its spread, the rows, and the mean
    comm per process group."""
    summary: dict = {name: across([r[name] for r in rows])["avg"] for name in FIGURES}
    summary["overlap_pct"] = across([r["overlap_pct"] for r in rows])["avg"]
    summary["across_ranks"] = {name: across([r[name] for r in rows]) for name in (*FIGURES, "overlap_pct")}
    summary["per_rank"] = rows
    by_group: dict = defaultdict(list)
    for r in rows:
        for g, v in r["comm_by_group_ms"].items():
            by_group[g].append(v)
    summary["comm_by_group_ms"] = {g: float(np.mean(v)) for g, v in sorted(by_group.items())}
    return summary


def mean_volume(steps: list[dict]) -> dict:
    total: dict = defaultdict(lambda: {"calls": 0, "payload_bytes": 0, "wire_bytes": 0.0})
    for step in steps:
        for name, v in step.items():
            for key in total[name]:
                total[name][key] += v[key]
    n = max(1, len(steps))
    return {name: {"calls": v["calls"] / n, "payload_bytes": round(v["payload_bytes"] / n),
                   "wire_bytes": v["wire_bytes"] / n} for name, v in total.items()}
