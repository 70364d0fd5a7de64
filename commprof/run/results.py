"""Every rank's figures combined into the run's report document (plain data; rendering is elsewhere).

Per rank: the median over measured iterations of each figure, overlap % = Σ overlap / Σ comm.
Across ranks: avg (the headline number), min, max, slowest rank and skew (max − min). Throughput is
the global batch over the slowest rank's median wall time: a synchronous step ends when the slowest
rank does. Volume is rank 0's measured mean per step next to the strategy's prediction.
Exercised by: `pytest tests/test_run_cli.py`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from commprof.record.step_figures import mean_volume, time_row, time_summary
from commprof.record.volume import volume_table
from commprof.run.pipeline_figures import pipeline_section


def rank_summary(result: dict) -> dict:
    row = time_row(result)
    row["coords"] = result["coords"]
    held = result["held_bytes"]
    row["held_bytes"] = held
    gpu = result["gpu_max_allocated_bytes"]
    row["peak_mem_bytes"] = gpu if gpu is not None else sum(held.values())
    row["peak_rss_bytes"] = result["peak_rss_bytes"]
    return row


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
