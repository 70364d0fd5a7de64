"""Every rank's figures of a profiled script combined into the report document (plain data; rendering is
report/script_table.py).

Per rank: the median over measured iterations of each figure, as `commprof run` (run/results.py); across
ranks: avg, min, max, slowest rank, skew. Volume: rank 0's mean per measured iteration, per op and group
("all_reduce", "send (ranks0-1)"), and per epoch (--steps-per-epoch, else every iteration the script ran);
ops outside every iteration (set-up, evaluation after the last step) are counted apart.
Exercised by: `pytest tests/test_profile_cli.py`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from commprof.profile.volume import volume_table
from commprof.run.results import FIGURES, across, mean_volume


def rank_row(result: dict) -> dict:
    its = result["iterations"]
    row = {"rank": result["rank"], "coords": {}, "peak_rss_bytes": result["peak_rss_bytes"],
           "peak_mem_bytes": result["peak_rss_bytes"]}
    for name in FIGURES:
        row[name] = float(np.median([it[name] for it in its])) if its else 0.0
    groups = sorted({g for it in its for g in it["comm_by_group_ms"]})
    row["comm_by_group_ms"] = {g: float(np.median([it["comm_by_group_ms"].get(g, 0.0) for it in its]))
                               for g in groups}
    comm = sum(it["comm_ms"] for it in its)
    row["overlap_pct"] = 100.0 * sum(it["overlap_ms"] for it in its) / comm if comm > 0 else 0.0
    return row


def combine(cfg, results: list[dict], env: dict) -> dict:
    results = sorted(results, key=lambda r: r["rank"])
    first = results[0]
    rows = [rank_row(r) for r in results]
    summary: dict = {name: across([r[name] for r in rows])["avg"] for name in FIGURES}
    summary["overlap_pct"] = across([r["overlap_pct"] for r in rows])["avg"]
    summary["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in rows)
    summary["peak_mem_bytes"] = summary["peak_rss_bytes"]
    step_ms = max(r["wall_ms"] for r in rows)
    summary["iteration_ms"] = step_ms
    summary["iterations_per_s"] = 1e3 / step_ms if step_ms > 0 else 0.0
    if cfg.global_batch:
        summary["throughput"] = cfg.global_batch * summary["iterations_per_s"]
        summary["throughput_unit"] = "samples/s"
    summary["across_ranks"] = {name: across([r[name] for r in rows]) for name in (*FIGURES, "overlap_pct")}
    summary["per_rank"] = rows
    groups: dict = {}
    for r in rows:
        for g, v in r["comm_by_group_ms"].items():
            groups.setdefault(g, []).append(v)
    summary["comm_by_group_ms"] = {g: float(np.mean(v)) for g, v in sorted(groups.items())}
    per_epoch = cfg.steps_per_epoch or first["found"]
    volume = volume_table(mean_volume(first["volume_steps"]), {}, group_sizes={}, steps_per_epoch=per_epoch)
    for v in volume.values():  # nothing predicts a script's traffic
        for key in ("predicted_payload_bytes_per_step", "predicted_wire_bytes_per_step", "predicted_bytes_per_epoch"):
            v.pop(key)
    unseen: Counter = Counter()
    for r in results:
        unseen.update(r["unseen"])
    return {
        "env": env,
        "config": dataclasses.asdict(cfg),
        "steps": {"found": first["found"], "measured": len(first["iterations"]), "warmup": cfg.warmup,
                  "per_epoch": per_epoch},
        "iterations": [{"rank": r["rank"], **it} for r in results for it in r["iterations"]],
        "summary": summary,
        "volume": volume,
        "outside_iterations": first["outside"],
        "unseen": dict(unseen),
    }
