"""The step of each rank split by cause, as the findings count it: a stacked bar per rank — its own time
(compute, data, optimizer), its waits for each peer, its exposed transfer, and what is left of its wall —
beside a line at the job's step. Plain data in, a PNG and the data drawn out.

    commprof run --strategy ddp --nproc 2 --trace t/ --plot p/        (p/run-causes.png)

Exercised by: `pytest tests/unit/test_findings_recorded.py`.
"""

from __future__ import annotations

from pathlib import Path

from commprof.report.canvas import color, figure
from commprof.report.findings_block import waits_of

SIZE = (7.0, 4.0)


def segments(by_rank: list[dict]) -> dict[str, list[float]]:
    """Segment name -> ms per rank, bottom first; a segment no rank has is left out."""
    waits = [waits_of(r["waiting_ms"]) for r in by_rank]
    peers = sorted({k for w in waits for k in w})
    out = {"own time": [r["busy_ms"] for r in by_rank]}
    out.update({f"waiting for rank {k}": [w.get(k, 0.0) for w in waits] for k in peers})
    out["transfer"] = [r["transfer_ms"] for r in by_rank]
    out["other"] = [max(0.0, r["wall_ms"] - sum(v[i] for v in out.values())) for i, r in enumerate(by_rank)]
    return {name: values for name, values in out.items() if any(v > 0 for v in values)}


def cause_plot(block: dict, step_ms: float, path: str | Path, *, keep: dict | None = None) -> dict:
    """Draw `block`'s by_rank (a findings block, kinds.of_trace) into `path`; returns {"ranks", "segments",
    "step_ms", "legend"}."""
    by_rank = block["by_rank"]
    ranks = [f"rank {r['rank']}" for r in by_rank]
    parts = segments(by_rank)
    with figure(Path(path), SIZE, keep=keep) as (fig, axes):
        ax = axes[0][0]
        bottom = [0.0] * len(ranks)
        for i, (name, values) in enumerate(parts.items()):
            ax.bar(ranks, values, bottom=bottom, label=name, color=color(i), width=0.6)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.axhline(step_ms, color="black", linestyle="--", linewidth=1, label=f"step {step_ms:.2f} ms")
        ax.set_ylim(0, 1.15 * max([step_ms, *bottom]))
        ax.set_title("Each rank's step by cause (medians over measured iterations)")
        ax.set_ylabel("ms per step")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
    return {"ranks": ranks, "segments": parts, "step_ms": step_ms, "legend": legend}
