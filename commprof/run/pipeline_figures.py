"""The pipeline part of a `commprof run` report: per stage its layers, bubble and activation memory, per
boundary the bytes that crossed it next to the prediction (plain data; rendering is elsewhere).

Measured bubble fraction of a stage = Σ bubble / Σ schedule over the measured steps, where schedule
is the stage's span from its first forward/recv to its last backward/send; with equal stages it is
(p − 1) / (m + p − 1) on every stage. Boundary b→b+1's activation bytes are what stage b sent on
that link per step, its gradient bytes what stage b+1 sent back, both from the op log of replica 0.
Exercised by: `pytest tests/test_pipeline.py`.
"""

from __future__ import annotations

import numpy as np

from commprof.record.volume import op_key


def _sent(result: dict, label: str) -> float:
    """Mean payload bytes per measured step this rank sent on group `label`."""
    steps = result["volume_steps"]
    key = op_key("send", label)
    return float(np.mean([s[key]["payload_bytes"] if key in s else 0 for s in steps])) if steps else 0.0


def pipeline_section(results: list[dict], rows: list[dict]) -> dict | None:
    """`results`: every rank's train() output; `rows`: their summaries (results.rank_summary)."""
    replica = [(r, row) for r, row in zip(results, rows) if r["pipeline"] is not None and r["coords"]["dp"] == 0]
    if not replica:
        return None
    replica.sort(key=lambda pair: pair[0]["pipeline"]["stage"])
    first = replica[0][0]["pipeline"]
    m = first["micro_batches"]
    stages = []
    for result, row in replica:
        fig = result["pipeline"]
        its = result["iterations"]
        schedule = sum(it["schedule_ms"] for it in its)
        stages.append({
            "stage": fig["stage"], "rank": result["rank"], "layers": fig["layers"][fig["stage"]],
            "bubble_ms": row["bubble_ms"], "schedule_ms": float(np.median([it["schedule_ms"] for it in its])),
            "bubble_fraction": sum(it["bubble_ms"] for it in its) / schedule if schedule > 0 else 0.0,
            "peak_micro_batches_in_flight": fig["peak_micro_batches_in_flight"],
            "activation_bytes_per_micro": (fig["activation_bytes_per_micro"][0]
                                           if fig["activation_bytes_per_micro"] else 0),
            "peak_activation_bytes": fig["peak_activation_bytes"], "peak_mem_bytes": row["peak_mem_bytes"],
        })
    boundaries = []
    for b, bound in enumerate(first["boundaries"]):
        label = bound["boundary"]
        per_step = m * bound["bytes_per_micro"]
        boundaries.append({
            **bound, "activation_bytes_per_step": _sent(replica[b][0], label),
            "predicted_activation_bytes_per_step": per_step,
            "grad_bytes_per_step": _sent(replica[b + 1][0], label),
            "predicted_grad_bytes_per_step": per_step if bound["carries_grad"] else 0,
        })
    return {
        "schedule": first["schedule"], "stages": first["stages"], "micro_batches": m,
        "predicted_bubble_fraction": first["predicted_bubble_fraction"],
        "bubble_fraction": float(np.mean([s["bubble_fraction"] for s in stages])),
        "per_stage": stages, "boundaries": boundaries,
    }
