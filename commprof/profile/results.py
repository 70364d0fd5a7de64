"""Every rank's figures of a profiled script combined into the report document (plain data; rendering is
report/script_table.py).

Per rank: the median over measured iterations of each figure, as `commprof run` (run/results.py); across
ranks: avg, min, max, slowest rank, skew. Volume: rank 0's mean per measured iteration, per op and group
("all_reduce", "send (ranks0-1)"), and per epoch (--steps-per-epoch, else every iteration the script ran);
ops outside every iteration (set-up, evaluation after the last step) are counted apart. Op times: rank 0's own ops
of the measured iterations, read back from its trace file, a row per op and group (report/op_table.py). torch's
record: rank 0's flight record of the same iterations beside commprof's counts, and the ops only it holds
(profile/torch_record.py).
Exercised by: `pytest tests/test_profile_cli.py tests/unit/test_op_table.py tests/unit/test_torch_record.py`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

from commprof.base.errors import UsageError
from commprof.perfmodel.timeline import from_ranks
from commprof.profile.torch_record import reconcile
from commprof.record.merge import load
from commprof.record.step_figures import mean_volume, time_row, time_summary
from commprof.record.volume import volume_table
from commprof.report.op_table import op_time_rows


def combine(cfg, results: list[dict], env: dict, *, trace_dir: str | None = None, record: dict | None = None) -> dict:
    """Every rank's result (rank 0's op log and trace for the volume and the op times) as the report document;
    `trace_dir`: the folder rank 0 traced into, whose rank0.trace.json gives "op_times" (None: no trace, no
    op times, as in a --live job without --trace); `record`: rank 0's flight record tallied over its measured
    iterations (profile/rank.py), set against commprof's counts as "torch_record" (torch_record.reconcile)."""
    results = sorted(results, key=lambda r: r["rank"])
    first = results[0]
    # a script's rank holds what its process holds: nothing says which bytes are parameters
    rows = [{**time_row(r), "coords": {}, "peak_rss_bytes": r["peak_rss_bytes"],
             "peak_mem_bytes": r["peak_rss_bytes"]} for r in results]
    summary = time_summary(rows)
    summary["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in rows)
    summary["peak_mem_bytes"] = summary["peak_rss_bytes"]
    step_ms = max(r["wall_ms"] for r in rows)
    summary["iteration_ms"] = step_ms
    summary["iterations_per_s"] = 1e3 / step_ms if step_ms > 0 else 0.0
    if cfg.global_batch:
        summary["throughput"] = cfg.global_batch * summary["iterations_per_s"]
        summary["throughput_unit"] = "samples/s"
    per_epoch = cfg.steps_per_epoch or first["found"]
    volume = volume_table(mean_volume(first["volume_steps"]), {}, group_sizes={}, steps_per_epoch=per_epoch)
    for v in volume.values():  # nothing predicts a script's traffic
        for key in ("predicted_payload_bytes_per_step", "predicted_wire_bytes_per_step", "predicted_bytes_per_epoch"):
            v.pop(key)
    unseen: Counter = Counter()
    for r in results:
        unseen.update(r["unseen"])
    steps = {"found": first["found"], "measured": first.get("measured", len(first["iterations"])), "warmup": cfg.warmup,
             "per_epoch": per_epoch}
    if steps["measured"] > len(first["iterations"]):  # --live keeps the last live/monitor.KEEP
        steps["kept"] = len(first["iterations"])
    doc = {
        "env": env,
        "config": dataclasses.asdict(cfg),
        "steps": steps,
        "iterations": [{"rank": r["rank"], **it} for r in results for it in r["iterations"]],
        "summary": summary,
        "volume": volume,
        "outside_iterations": first["outside"],
        "unseen": dict(unseen),
        **({"op_times": op_times(trace_dir, env.get("world_size", len(results)))} if trace_dir else {}),
    }
    if record is not None:
        doc["torch_record"] = with_record(record, first["volume_steps"], env, per_epoch, dict(unseen))
    return doc


def with_record(record: dict, steps: list[dict], env: dict, per_epoch: int, unseen: dict) -> dict:
    """The report's "torch_record" block: the ring's size and who set it, then rank 0's record set against
    commprof's counts of the same iterations, or why there is none."""
    head = {"buffer_size": record["buffer_size"], "set_by": record["set_by"]}
    if "tallied" not in record:
        return {**head, "why": record.get("why", "not read")}
    if not record["tallied"]["entries"]:  # a backend that keeps none (MPI's): nothing to set against commprof's
        return {**head, "why": f"torch's record holds no op of this job's groups (backend {env.get('backend')})"}
    return {**head, **reconcile(record["tallied"], steps, backend=str(env.get("backend", "")),
                                steps_per_epoch=per_epoch, unseen=unseen, unseen_steps=record["unseen_steps"])}


def op_times(trace_dir: str, world_size: int) -> list[dict]:
    """Rank 0's own ops of the measured iterations in its trace file (rank0.trace.json in `trace_dir`), a row per
    op and group: count, payload bytes and the min / median / p99 / max of their issue-to-completion times (µs)
    (report/op_table.py). Only rank 0's file is read, so it costs the same at any world size; [] when the file
    holds no measured iteration or cannot be read."""
    try:
        events = load(Path(trace_dir) / "rank0.trace.json")
        measured = from_ranks([(0, events)], world_size, trace_dir, strategy="", global_batch=None, backend=None)
    except (OSError, ValueError, UsageError):
        return []
    return op_time_rows((op.name, op.label, op.nbytes, end - start)
                        for (program,) in measured.iterations for start, end, op in program.spans)


def partial(cfg, result: dict, env: dict, *, reason: str) -> dict:
    """One rank's figures when the job failed before every rank's could be gathered: the report of that rank
    alone, marked incomplete (no summary when it measured no iteration)."""
    doc = {"complete": False, "reason": reason, "ranks_reported": [result["rank"]],
           "note": f"rank {result['rank']} only: the job failed before every rank's figures were gathered"}
    if not result["iterations"]:
        return {**doc, "env": env, "config": dataclasses.asdict(cfg), "summary": None}
    return {**doc, **combine(cfg, [result], env)}
