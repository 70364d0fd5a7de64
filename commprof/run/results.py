"""Every rank's figures combined into the run's report document (plain data; rendering is elsewhere).

Per rank: the median over measured iterations of each figure, overlap % = Σ overlap / Σ comm.
Across ranks: avg (the headline number), min, max, slowest rank and skew (max − min). Throughput is
the global batch over the slowest rank's median wall time: a synchronous step ends when the slowest
rank does. Volume is rank 0's measured mean per step next to the strategy's prediction.
Exercised by: `pytest tests/test_run_cli.py`.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from commprof.record.volume import volume_table
from commprof.run.pipeline_figures import pipeline_section

FIGURES = ("wall_ms", "data_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "overlap_ms", "bubble_ms")


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
        row[name] = float(np.median([it[name] for it in its])) if its else 0.0
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


def rank_summary(result: dict) -> dict:
    row = time_row(result)
    row["coords"] = result["coords"]
    held = result["held_bytes"]
    row["held_bytes"] = held
    gpu = result["gpu_max_allocated_bytes"]
    row["peak_mem_bytes"] = gpu if gpu is not None else sum(held.values())
    row["peak_rss_bytes"] = result["peak_rss_bytes"]
    return row


def mean_volume(steps: list[dict]) -> dict:
    total: dict = defaultdict(lambda: {"calls": 0, "payload_bytes": 0, "wire_bytes": 0.0})
    for step in steps:
        for name, v in step.items():
            for key in total[name]:
                total[name][key] += v[key]
    n = max(1, len(steps))
    return {name: {"calls": v["calls"] / n, "payload_bytes": round(v["payload_bytes"] / n),
                   "wire_bytes": v["wire_bytes"] / n} for name, v in total.items()}


def combine(cfg, results: list[dict], env: dict) -> dict:
    results = sorted(results, key=lambda r: r["rank"])
    first = results[0]
    rows = [rank_summary(r) for r in results]
    summary = time_summary(rows)
    summary["peak_mem_bytes"] = max(r["peak_mem_bytes"] for r in rows)
    summary["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in rows)
    step_s = max(r["wall_ms"] for r in rows) / 1e3
    summary["throughput"] = first["global_batch"] / step_s if step_s > 0 else 0.0
    summary["throughput_unit"] = "samples/s"
    if first["tokens_per_sample"]:
        summary["tokens_per_s"] = summary["throughput"] * first["tokens_per_sample"]
    summary["iteration_ms"] = step_s * 1e3
    summary["epoch_s"] = step_s * first["steps_per_epoch"]
    pipeline = pipeline_section(results, rows)
    if pipeline is not None:
        summary["bubble_fraction"] = pipeline["bubble_fraction"]
        summary["predicted_bubble_fraction"] = pipeline["predicted_bubble_fraction"]

    # equal shards: the global mean (model-parallel: the ranks that hold the loss)
    losses = np.mean([r["losses"] for r in results if r["reports_loss"]], axis=0).tolist()
    metrics = {"loss": losses, "final_loss": losses[-1], "skipped_steps": first["skipped_steps"],
               "steps_to_threshold": None, "accuracy": None}
    if cfg.loss_threshold is not None:
        metrics["steps_to_threshold"] = next((i + 1 for i, v in enumerate(losses) if v <= cfg.loss_threshold), None)
    evals = [r["eval"] for r in results if r["eval"] is not None]
    if evals:
        total = sum(e["total"] for e in evals)
        metrics["accuracy"] = sum(e["correct"] for e in evals) / total if total else None
        metrics["eval_samples"] = total

    volume = volume_table(mean_volume(first["volume_steps"]), first["predicted"], group_sizes=first["group_sizes"],
                          steps_per_epoch=first["steps_per_epoch"])
    iterations = [{"rank": r["rank"], **it} for r in results for it in r["iterations"]]
    return {
        "env": env,
        "config": dataclasses.asdict(cfg),
        "model": {"name": cfg.model, "parameters": first["parameters"],
                  "trainable_parameters": first["trainable_parameters"]},
        "steps": {"total": first["total_steps"], "measured": len(first["iterations"]),
                  "per_epoch": first["steps_per_epoch"], "global_batch": first["global_batch"]},
        "iterations": iterations,
        "summary": summary,
        "volume": volume,
        "metrics": metrics,
        "pipeline": pipeline,
    }
