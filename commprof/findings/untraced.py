"""Findings from a job's own figures, no trace needed: a pipeline's bubble beyond its schedule's own, and the
host's work in no phase. A findings block made from the trace (findings/kinds.py) gets them in its place.

  bubble        a pipeline (`run`'s pipeline strategies) idling beyond its schedule's own bubble, the
                fraction f = (p − 1)/(m + p − 1) of p stages and m micro-batches: with the stages' work
                (schedule − bubble) split evenly, the longest schedule would be mean work / (1 − f); the
                excess over that is its cost (unequal stages, or point-to-point latency). Without it: the
                step less that excess. The evidence splits it: `unequal_stages_ms`, what GPipe's and 1F1B's
                step, (m − 1)·t_max + Σ t of per-micro-batch work t, loses to the slowest stage against the
                mean, (m − 1)/m · (work_max − mean work) — and `other_ms`, the rest (p2p latency, wake-ups).
  host          time every rank's training thread spent in no phase and no wait (the `other` column: a batch
                fetched outside a data phase, gradient clipping, logging, a checkpoint): ms_per_step is the
                least of the ranks' medians — what every rank spends, and so what the step holds at least;
                a rank whose own `other` alone is long makes its peers wait and is a straggler instead.
                Without it: the step less that.

Exercised by: `pytest tests/unit/test_findings_recorded.py`.
"""

from __future__ import annotations

from commprof.findings.kinds import THRESHOLD


def bubble(pipeline: dict | None, step_ms: float, *, threshold: float = THRESHOLD) -> list[dict]:
    """The bubble finding of a run's "pipeline" block (run/pipeline_figures.py), [] below `threshold` of the
    step or for a run that is not a pipeline."""
    if not pipeline or step_ms <= 0:
        return []
    f = pipeline["predicted_bubble_fraction"]
    stages = pipeline["per_stage"]
    work = [s["schedule_ms"] - s["bubble_ms"] for s in stages]
    cost, unequal = excess(pipeline)
    if cost < threshold * step_ms:
        return []
    idle = max(stages, key=lambda s: s["bubble_fraction"])
    return [{"kind": "bubble", "stage": idle["stage"], "rank": idle["rank"], "ms_per_step": cost,
             "share_of_step": cost / step_ms, "step_ms_without": step_ms - cost,
             "evidence": {"stages": pipeline["stages"], "micro_batches": pipeline["micro_batches"],
                          "schedule": pipeline["schedule"], "predicted_fraction": f,
                          "fraction_by_stage": {s["stage"]: s["bubble_fraction"] for s in stages},
                          "work_ms_by_stage": {s["stage"]: w for s, w in zip(stages, work)},
                          "unequal_stages_ms": unequal, "other_ms": max(0.0, cost - unequal)}}]


def excess(pipeline: dict) -> tuple[float, float]:
    """(ms a step the pipeline idles beyond its schedule's own bubble, the part of it unequal stages make)."""
    f, m = pipeline["predicted_bubble_fraction"], pipeline["micro_batches"]
    work = [s["schedule_ms"] - s["bubble_ms"] for s in pipeline["per_stage"]]
    mean = sum(work) / len(work)
    cost = max(0.0, max(s["schedule_ms"] for s in pipeline["per_stage"]) - mean / (1 - f))
    return cost, min(cost, (m - 1) / m * (max(work) - mean))


def host(summary: dict, step_ms: float, *, threshold: float = THRESHOLD) -> list[dict]:
    """The host finding of a report's summary (its per-rank `other_ms`), [] below `threshold` of the step."""
    rows = [r for r in summary.get("per_rank") or [] if "other_ms" in r]
    if not rows or step_ms <= 0:
        return []
    cost = min(r["other_ms"] for r in rows)
    if cost < threshold * step_ms:
        return []
    most = max(rows, key=lambda r: r["other_ms"])
    return [{"kind": "host", "rank": most["rank"], "ms_per_step": cost, "share_of_step": cost / step_ms,
             "step_ms_without": step_ms - cost,
             "evidence": {"other_ms_by_rank": {r["rank"]: r["other_ms"] for r in rows}}}]


def with_figures(block: dict | None, doc: dict) -> dict | None:
    """A findings block (of_trace's; None where the job has no trace to read) with the findings of the report
    `doc`'s own figures in their place; a job without a trace gets a block of those alone, which says so."""
    step_ms = (block or {}).get("step_ms") or doc["summary"]["wall_ms"]  # the trace's step where there is one
    threshold = block["threshold"] if block else THRESHOLD
    found = bubble(doc.get("pipeline"), step_ms, threshold=threshold) + host(doc["summary"], step_ms,
                                                                            threshold=threshold)
    if block is None:
        return None if not found else {"threshold": THRESHOLD, "items": found,
                                       "scope": "from the job's own figures only: the other kinds read a trace"}
    if block.get("items") is None:
        return block
    out = {**block, "items": sorted(block["items"] + found, key=lambda x: -x["ms_per_step"])}
    contention = (doc.get("env") or {}).get("contention") or {}
    if contention.get("contended"):  # another process's load can make a rank look slow: the reader is told
        out["contended"] = {"others_cores": contention["others_cores"]}
    return out


