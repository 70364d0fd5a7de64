"""The pipeline bubble against the number of micro-batches: measured on 4 stages vs (p − 1)/(m + p − 1).

4 gloo ranks (--stages), one stage each, of `commprof.models.calibrated`'s chain: every stage's forward
takes --fwd-ms and its backward --bwd-ms per micro-batch (sleeping, so 4 ranks on 2 cores do not distort
it). For m = 1, 2, 4, 8 and both schedules (GPipe, 1F1B), each stage runs --steps measured steps
(after 2 warm-up) through a real Phases, as `commprof run` does; its bubble fraction is its median
bubble / schedule over the steps. The table gives the mean over stages (and the range), the bubble
per step, and the prediction; the PNG plots measured against predicted.

    pip install -e ".[bench]"         # matplotlib, for the plot
    python benchmarks/bubble.py [--quick] [--stages 4] [--steps 5] [--fwd-ms 20] [--bwd-ms 40] [--json PATH]
                                [--png PATH]

--quick: 2 stages, one measured step of 1 + 2 ms per micro-batch; a few seconds, to see that it runs.

Reading it: with equal stages both schedules idle (p − 1)(fwd + bwd) per step, so more micro-batches
shrink the bubble's share as (p − 1)/(m + p − 1); what is left above the line is per-hop latency
(send/recv and scheduling), which the model does not have. 1F1B's gain is memory, not bubble.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from common import env_record, parse, parser, spawn_ranks

STAGES = 4
"""Stages, one rank each (--stages)."""
MICRO = (1, 2, 4, 8)
SCHEDULES = ("pipeline-gpipe", "pipeline-1f1b")
QUICK = {"stages": 2, "steps": 1, "fwd_ms": 1.0, "bwd_ms": 2.0}
"""--quick: 2 stages, one measured step of 1 + 2 ms per micro-batch: the same schedules and micro-batch counts."""


def worker(args) -> None:
    import numpy as np

    from commprof.base.world import discover
    from commprof.comm import end_process, init_comm
    from commprof.run.calibrated import calibrated_bubble

    comm = init_comm(discover(), backend="gloo", timeout_s=300)
    rows = []
    for schedule in SCHEDULES:
        for m in MICRO:
            steps = calibrated_bubble(comm, schedule, micro_batches=m, fwd_ms=args.fwd_ms, bwd_ms=args.bwd_ms,
                                      steps=args.steps)
            mine = {"fraction": float(np.median([s["fraction"] for s in steps])),
                    "bubble_ms": float(np.median([s["bubble_ms"] for s in steps])),
                    "schedule_ms": float(np.median([s["schedule_ms"] for s in steps]))}
            every = comm.gather_object(mine, dst=0)
            if comm.rank == 0:
                rows.append({"schedule": schedule, "micro_batches": m, "stages": every,
                             "predicted": (comm.world_size - 1) / (m + comm.world_size - 1)})
    if comm.rank == 0:
        Path(args.out).write_text(json.dumps(rows))
    comm.control_barrier()
    comm.close()
    end_process(0)  # not the interpreter's exit: see commprof.comm.end_process


def summarize(rows: list[dict], args) -> dict:
    out = []
    for row in rows:
        fractions = [s["fraction"] for s in row["stages"]]
        out.append({"schedule": row["schedule"], "micro_batches": row["micro_batches"],
                    "predicted": row["predicted"], "measured": statistics.mean(fractions),
                    "measured_min": min(fractions), "measured_max": max(fractions),
                    "bubble_ms": statistics.mean(s["bubble_ms"] for s in row["stages"]),
                    "schedule_ms": statistics.mean(s["schedule_ms"] for s in row["stages"]),
                    "ideal_schedule_ms": (row["micro_batches"] + args.stages - 1) * (args.fwd_ms + args.bwd_ms)})
    return {"stages": args.stages, "fwd_ms": args.fwd_ms, "bwd_ms": args.bwd_ms, "steps": args.steps, "rows": out}


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"pipeline bubble, {result['stages']} stages of {result['fwd_ms']:g}+{result['bwd_ms']:g} "
                        "ms per micro-batch (mean over stages of each stage's median)", title_justify="left")
    for label in ("schedule", "m", "predicted", "measured", "range", "bubble ms/step", "schedule ms", "ideal ms"):
        table.add_column(label, justify="left" if label == "schedule" else "right")
    for r in result["rows"]:
        table.add_row(r["schedule"], str(r["micro_batches"]), f"{100 * r['predicted']:.1f}%",
                      f"{100 * r['measured']:.1f}%", f"{100 * r['measured_min']:.1f}–{100 * r['measured_max']:.1f}%",
                      f"{r['bubble_ms']:.1f}", f"{r['schedule_ms']:.1f}", f"{r['ideal_schedule_ms']:.0f}")
    Console(width=120).print(table)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ms = [m for m in range(1, max(MICRO) + 1)]
    p = result["stages"]
    ax.plot(ms, [(p - 1) / (m + p - 1) for m in ms], "k-", label="predicted (p−1)/(m+p−1)")
    for schedule, marker in zip(SCHEDULES, ("o", "s")):
        rows = [r for r in result["rows"] if r["schedule"] == schedule]
        ax.errorbar([r["micro_batches"] for r in rows], [r["measured"] for r in rows],
                    yerr=[[r["measured"] - r["measured_min"] for r in rows],
                          [r["measured_max"] - r["measured"] for r in rows]],
                    fmt=marker, capsize=3, label=f"measured, {schedule}")
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble fraction of the schedule")
    ax.set_xticks(list(MICRO))
    ax.set_ylim(0, 1)
    ax.set_title(f"{p} stages, {result['fwd_ms']:g}+{result['bwd_ms']:g} ms per micro-batch, gloo")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    p = parser(__doc__, json="bubble-results.json", png="bubble.png")
    p.add_argument("--stages", type=int, default=STAGES, help=f"ranks, one stage each (default {STAGES})")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--fwd-ms", type=float, default=20.0)
    p.add_argument("--bwd-ms", type=float, default=40.0)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = parse(p, QUICK)
    if args.worker:
        return worker(args)
    argv = [f"--steps={args.steps}", f"--fwd-ms={args.fwd_ms}", f"--bwd-ms={args.bwd_ms}"]
    with tempfile.TemporaryDirectory() as tmp:
        rows = json.loads(spawn_ranks(__file__, argv, tmp, nproc=args.stages).read_text())
    result = {"env": env_record(["python", "benchmarks/bubble.py", *sys.argv[1:]], nproc=args.stages),
              **summarize(rows, args)}
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.png:
        plot(result, args.png)
    written = [path for path in (args.json, args.png) if path]
    if written:
        print(f"wrote {' and '.join(written)}")


if __name__ == "__main__":
    main()
