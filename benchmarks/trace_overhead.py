"""The cost of commprof's own instrumentation on `commprof run --strategy ddp`: NVTX off, NVTX with no
tool attached (the default), and NVTX + the Chrome trace (--trace), side by side.

Each round runs the three configurations once, in a rotating order, as separate `commprof run` jobs on
2 gloo ranks (--nproc); a configuration's figure is the run's mean iteration time over its measured steps
(summary.iteration_ms, slowest rank). Ratios are taken within a round, then the median over rounds.
"NVTX off" is NVTX_DISABLE=1, which turns the nvtx package into no-ops. The trace size is the bytes of
both per-rank files divided by (iterations × ranks).

    python benchmarks/trace_overhead.py [--quick] [--rounds 5] [--steps 60] [--warmup 5] [--ops 100000]
                                        [--json benchmarks/results/trace-overhead-results.json]

Each ratio over off comes with the 95 % CI of its median (benchmarks/common.py's ratio_ci). --quick: one
round of 3 steps after 1 of warm-up on 1 rank, 10,000 ranges and ops for the costs; to see that it runs.

Whole runs on this VM swing by ±15 % between runs, far above the 1 % asked of NVTX, so the script
also measures the cost itself, in one process per configuration with nothing else in the loop: the
time of one phase range (push, pop) and of one synchronous comm op's instrumentation (push, op-log
entry, pop), both including the trace's formatting and writing; and counts the ranges and ops of one
ddp iteration in the last round's trace. cost per iteration = ranges × range cost + ops × op cost,
reported against the NVTX-off iteration time.

Reading it: mnist-cnn's iteration is a few ms with 3 all_reduces (40 KiB buckets), so per-range costs
show here more than in any real model.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from common import job, parse, parser, ratio_ci

CONFIGS = ("off", "nvtx", "trace")
QUICK = {"rounds": 1, "steps": 3, "warmup": 1, "ops": 10_000, "nproc": 1}
"""--quick: one round of 3 steps after 1 of warm-up on one rank (a rank's start-up is most of a quick run's
time); 10,000 ranges and ops for the costs."""
RUN_TIMEOUT_S = 900


def one_run(config: str, steps: int, warmup: int, nproc: int, tmp: Path) -> dict:
    out, trace_dir = tmp / f"{config}.json", tmp / f"trace-{config}"
    argv = [sys.executable, "-m", "commprof", "run", "--strategy", "ddp", "--nproc", str(nproc), "--steps", str(steps),
            "--warmup", str(warmup), "--batch-size", "32", "--bucket-mb", "0.04", "--eval-samples", "0",
            "--json", str(out)]
    env = dict(os.environ)
    if config == "off":
        env["NVTX_DISABLE"] = "1"
    if config == "trace":
        argv += ["--trace", str(trace_dir)]
    job(argv, env=env, timeout_s=RUN_TIMEOUT_S, what=f"trace_overhead: the {config} run")
    row = {"iteration_ms": json.loads(out.read_text())["summary"]["iteration_ms"]}
    if config == "trace":
        files = list(trace_dir.glob("rank*.trace.json"))
        row["trace_bytes_per_iteration_per_rank"] = sum(f.stat().st_size for f in files) / (steps * len(files))
        row["merged_bytes"] = (trace_dir / "trace.json").stat().st_size
    return row


def worker(config: str, n: int) -> None:
    """Print ns per phase range and per instrumented sync op, for this process's configuration."""
    import time

    from commprof.record import trace
    from commprof.record.annotate import ANNOTATOR
    from commprof.record.clock import CpuClock

    class FakeComm:  # what the op-log hook reads of a Comm
        rank, world_size, clock, members = 0, 2, CpuClock(), [0, 1]

    tmp = tempfile.mkdtemp()
    if config == "trace":
        clocks = {"epoch_ns": time.perf_counter_ns(), "ranks": [{"rank": 0, "host": "h", "measured_offset_ns": 0,
                  "bound_ns": 0, "applied_offset_ns": 0, "residual_ns": 0}]}
        ANNOTATOR.trace = trace.TraceRecorder(Path(tmp) / "rank0.trace.json", rank=0, world_size=2, clocks=clocks)
    phase = ANNOTATOR.label("forward", "compute")
    op = ANNOTATOR.label("all_reduce (world) 40 KiB float32", "comm", payload=40960)
    outer = ANNOTATOR.label("iteration 0", "iteration")
    comm = FakeComm()
    ANNOTATOR.push(outer)
    start = time.perf_counter_ns()
    for _ in range(n):
        ANNOTATOR.push(phase)
        ANNOTATOR.pop()
    per_range = (time.perf_counter_ns() - start) / n
    start = time.perf_counter_ns()
    for _ in range(n):
        ANNOTATOR.push(op)
        t = time.perf_counter_ns()
        if ANNOTATOR.trace is not None:
            ANNOTATOR.trace.op(("all_reduce", 40960, 2, t, t + 1000, False, "world"), comm)
        ANNOTATOR.pop()
    per_op = (time.perf_counter_ns() - start) / n
    ANNOTATOR.pop()
    if ANNOTATOR.trace is not None:
        ANNOTATOR.trace.close()
    print(json.dumps({"range_ns": per_range, "op_ns": per_op}))


def micro(config: str, n: int) -> dict:
    env = dict(os.environ)
    if config == "off":
        env["NVTX_DISABLE"] = "1"
    out = job([sys.executable, __file__, "--worker", config, str(n)], env=env, timeout_s=RUN_TIMEOUT_S,
              what=f"trace_overhead: the {config} costs")
    return json.loads(out)


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        return worker(sys.argv[2], int(sys.argv[3]))
    p = parser(__doc__, json="trace-overhead-results.json")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--ops", type=int, default=100_000, help="ranges and ops timed for each cost (default 100000)")
    p.add_argument("--nproc", type=int, default=2, help="gloo ranks of each run (default 2)")
    args = parse(p, QUICK)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = CONFIGS[r % 3:] + CONFIGS[:r % 3]
            row = {c: one_run(c, args.steps, args.warmup, args.nproc, Path(tmp)) for c in order}
            rounds.append(row)
            print(f"round {r}: " + ", ".join(f"{c} {row[c]['iteration_ms']:.3f} ms" for c in CONFIGS), flush=True)
        ranges, ops = ranges_per_iteration(Path(tmp) / "trace-trace" / "rank0.trace.json", args.steps)
    summary = {}
    for c in ("nvtx", "trace"):
        ratios = [row[c]["iteration_ms"] / row["off"]["iteration_ms"] for row in rounds]
        ci = ratio_ci([row[c]["iteration_ms"] for row in rounds], [row["off"]["iteration_ms"] for row in rounds])
        summary[f"{c}_over_off"] = {"median": statistics.median(ratios), "ci95": ci["ci95"], "min": min(ratios),
                                    "max": max(ratios)}
    costs = {c: micro(c, args.ops) for c in CONFIGS}
    base_ms = statistics.median(row["off"]["iteration_ms"] for row in rounds)
    for c in ("nvtx", "trace"):
        extra_ns = (ranges * (costs[c]["range_ns"] - costs["off"]["range_ns"])
                    + ops * (costs[c]["op_ns"] - costs["off"]["op_ns"]))
        summary[f"{c}_cost_pct_of_iteration"] = 100 * extra_ns / 1e6 / base_ms
    summary["per_range_ns"] = costs
    summary["ranges_per_iteration"], summary["ops_per_iteration"] = ranges, ops
    sizes = [row["trace"]["trace_bytes_per_iteration_per_rank"] for row in rounds]
    summary["trace_bytes_per_iteration_per_rank"] = statistics.median(sizes)
    summary["off_iteration_ms_median"] = statistics.median(row["off"]["iteration_ms"] for row in rounds)
    for key, value in summary.items():
        print(f"{key}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rounds": rounds, "argv": ["python", *sys.argv]},
                                              indent=1) + "\n")


def ranges_per_iteration(rank0: Path, steps: int) -> tuple[float, float]:
    """Training-thread ranges (ops excluded) and comm ops per iteration, counted in one traced run's rank 0
    trace (the last round's)."""
    from commprof.record import trace

    events = trace.load(rank0)
    xs = [e for e in events if e["ph"] == "X" and not str(e["tid"]).startswith("1000")]
    ops = sum(1 for e in xs if e["cat"] == "comm")
    return (len(xs) - ops) / steps, ops / steps


if __name__ == "__main__":
    main()
