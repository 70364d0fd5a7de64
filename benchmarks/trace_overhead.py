"""The cost of commprof's own instrumentation on `commprof run --strategy ddp`: NVTX off, NVTX with no
tool attached (the default), and NVTX + the Chrome trace (--trace), side by side.

Each round runs the three configurations once, in a rotating order, as separate `commprof run` jobs on
2 gloo ranks; a configuration's figure is the run's mean iteration time over its measured steps
(summary.iteration_ms, slowest rank). Ratios are taken within a round, then the median over rounds.
"NVTX off" is NVTX_DISABLE=1, which turns the nvtx package into no-ops. The trace size is the bytes of
both per-rank files divided by (iterations × ranks).

    python benchmarks/trace_overhead.py [--rounds 5] [--steps 60] [--json benchmarks/results/trace-overhead-results.json]

Whole runs on this VM swing by ±15 % between runs, far above the 1 % asked of NVTX, so the script
also measures the cost itself, in one process per configuration with nothing else in the loop: the
time of one phase range (push, pop) and of one synchronous comm op's instrumentation (push, op-log
entry, pop), both including the trace's formatting and writing; and counts the ranges and ops of one
ddp iteration from the trace. cost per iteration = ranges × range cost + ops × op cost, reported
against the NVTX-off iteration time.

Reading it: mnist-cnn's iteration is a few ms with 3 all_reduces (40 KiB buckets), so per-range costs
show here more than in any real model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
CONFIGS = ("off", "nvtx", "trace")


def one_run(config: str, steps: int, warmup: int, tmp: Path) -> dict:
    out, trace_dir = tmp / f"{config}.json", tmp / f"trace-{config}"
    argv = [sys.executable, "-m", "commprof", "run", "--strategy", "ddp", "--nproc", "2", "--steps", str(steps),
            "--warmup", str(warmup), "--batch-size", "32", "--bucket-mb", "0.04", "--eval-samples", "0",
            "--json", str(out)]
    env = dict(os.environ)
    if config == "off":
        env["NVTX_DISABLE"] = "1"
    if config == "trace":
        argv += ["--trace", str(trace_dir)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"{config} run failed: {proc.stderr.strip()[-400:]}")
    row = {"iteration_ms": json.loads(out.read_text())["summary"]["iteration_ms"]}
    if config == "trace":
        files = list(trace_dir.glob("rank*.trace.json"))
        row["trace_bytes_per_iteration_per_rank"] = sum(f.stat().st_size for f in files) / (steps * len(files))
        row["merged_bytes"] = (trace_dir / "trace.json").stat().st_size
    return row


def worker(config: str, n: int = 100_000) -> None:
    """Print ns per phase range and per instrumented sync op, for this process's configuration."""
    import time

    from commprof.profile import trace
    from commprof.profile.annotate import ANNOTATOR
    from commprof.profile.clock import CpuClock

    class FakeComm:  # what the op-log hook reads of a Comm
        rank, world_size, clock = 0, 2, CpuClock()

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


def micro(config: str) -> dict:
    env = dict(os.environ)
    if config == "off":
        env["NVTX_DISABLE"] = "1"
    proc = subprocess.run([sys.executable, __file__, "--worker", config], env=env, capture_output=True, text=True,
                          check=True)
    return json.loads(proc.stdout)


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        return worker(sys.argv[2])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", default=str(HERE / "results" / "trace-overhead-results.json"))
    args = p.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = CONFIGS[r % 3:] + CONFIGS[:r % 3]
            row = {c: one_run(c, args.steps, args.warmup, Path(tmp)) for c in order}
            rounds.append(row)
            print(f"round {r}: " + ", ".join(f"{c} {row[c]['iteration_ms']:.3f} ms" for c in CONFIGS), flush=True)
    summary = {}
    for c in ("nvtx", "trace"):
        ratios = [row[c]["iteration_ms"] / row["off"]["iteration_ms"] for row in rounds]
        summary[f"{c}_over_off"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    costs = {c: micro(c) for c in CONFIGS}
    ranges, ops = ranges_per_iteration(args.steps, args.warmup)
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
    Path(args.json).write_text(json.dumps({"summary": summary, "rounds": rounds, "argv": ["python", *sys.argv]},
                                          indent=1) + "\n")


def ranges_per_iteration(steps: int, warmup: int) -> tuple[float, float]:
    """Training-thread ranges (ops excluded) and comm ops per iteration, counted in one traced run."""
    with tempfile.TemporaryDirectory() as tmp:
        one_run("trace", steps, warmup, Path(tmp))
        from commprof.profile import trace

        events = trace.load(Path(tmp) / "trace-trace" / "rank0.trace.json")
    xs = [e for e in events if e["ph"] == "X" and not str(e["tid"]).startswith("1000")]
    ops = sum(1 for e in xs if e["cat"] == "comm")
    return (len(xs) - ops) / steps, ops / steps


if __name__ == "__main__":
    main()
