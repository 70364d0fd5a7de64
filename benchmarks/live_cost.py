"""What `--live` costs a training step, inside one `commprof profile --live` job: launches of the same script
differ by more than the 1 % target on this VM (±7 %), steps side by side in one process do not.

Per workload (common.py's: ddp, ResNet-18 under DistributedDataParallel; fsdp2, `fully_shard` per block with
Adam and clipping; pipeline, torch's GPipe over 2 stages), one job of 2 gloo ranks alternates blocks of
--block steps with the live fold on (each measured iteration folded into the rank's window; every --window
steps the window posted to rank 0, combined with its findings, served to Prometheus and appended to the log)
and off (the tracker hands its iterations to nothing) — everything else `profile` does stays on in both. An
A/A job alternates the same way with live on throughout: the comparison's own noise. A block's figure is the
mean of its steps after the first (a mean, not a median: the step that ends a window pays for it, once in
--window steps); each block divided by the next block of the other arm; per workload the median of those ratios
over every job, with its 95 % CI (common.median_ci). Beside it, what resolves far below that noise: the time the
training thread spends in live's own code (the fold, and at each window's end handing it over), timed around it,
plus the CPU time of rank 0's live thread (combining, exporting, the log), per measured step.

    python benchmarks/live_cost.py [--quick] [--workloads ddp,fsdp2,pipeline] [--jobs 2] [--steps 120]
                                   [--block 10] [--window 20]

--memory instead: the peak RSS of rank 0 under `profile --live` after 1,000 and after 100,000 steps of a
step of one 32-byte all_reduce (what a long job holds is what a short one does). Results: benchmarks/README.md,
benchmarks/results/live-cost-results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from common import ddp, fsdp2, job, median_ci, parse, parser, pipeline, with_root

WORKLOADS = {"ddp": ddp, "fsdp2": fsdp2, "pipeline": pipeline}
QUICK = {"jobs": 1, "steps": 8, "block": 2, "window": 2, "workloads": "pipeline"}
KINDS = ("live", "A/A")
MEMORY_STEPS = (1_000, 100_000)
RUN_TIMEOUT_S = 1200


def script(kind: str, workload: str, steps: int, block: int) -> None:
    """One rank of a job (under `commprof profile --live`): rank 0 prints its block pair ratios as JSON."""
    import time

    import torch
    import torch.distributed as dist

    from commprof.record import hooks

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    step, _ = WORKLOADS[workload]("resnet18", torch.device("cpu"))
    tracker = hooks.ACTIVE
    live = tracker.live
    spent = [0.0, 0]

    def fold(*args):  # live's own work on the training thread, timed: its fold, and each window's post/export
        start = time.perf_counter()
        live(*args)
        spent[0] += time.perf_counter() - start
        spent[1] += 1
    blocks: list[tuple[str, list[float]]] = []
    for i in range(steps):
        arm = "off" if (i // block) % 2 else "on"
        if i % block == 0:
            tracker.live = fold if arm == "on" or kind == "A/A" else None
            blocks.append((arm, []))
        start = time.perf_counter()
        step()
        if i % block:
            blocks[-1][1].append((time.perf_counter() - start) * 1e3)
    tracker.live = fold
    means = [(arm, statistics.fmean(ms)) for arm, ms in blocks[1:] if ms]
    ratios = [(a[1] / b[1]) if a[0] == "on" else (b[1] / a[1]) for a, b in zip(means, means[1:])]
    if dist.get_rank() == 0:
        thread_ms = live.__self__.thread_s * 1e3 / max(1, spent[1])  # rank 0's live thread, per folded step
        print(json.dumps({"ratios": ratios, "on_ms": statistics.median(m for a, m in means if a == "on"),
                          "live_ms_per_step": spent[0] * 1e3 / max(1, spent[1]) + thread_ms,
                          "thread_ms_per_step": thread_ms}), flush=True)
    dist.destroy_process_group()


def memory_script(steps: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(8)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))])
    page = os.sysconf("SC_PAGE_SIZE")
    for i in range(1, steps + 1):
        dist.all_reduce(t)
        opt.step()  # an optimizer step ends an iteration
        if i in (1_000, 10_000, 100_000) and dist.get_rank() == 0:  # rank 0's resident memory now
            rss = int(Path("/proc/self/statm").read_text().split()[1]) * page
            print(json.dumps({"step": i, "rss_bytes": rss}), flush=True)
    dist.destroy_process_group()


def _profile(args: list[str], what: str, tmp: str) -> str:
    env = with_root({**os.environ, "OMP_NUM_THREADS": "1"})
    return job([sys.executable, "-m", "commprof", "profile", "--nproc", "2", *args], env=env, timeout_s=RUN_TIMEOUT_S,
               what=what)


def run(kind: str, workload: str, a: argparse.Namespace, tmp: str) -> dict:
    out = _profile(["--live", "--live-window", str(a.window), "--metrics-port", "0", "--live-log",
                    str(Path(tmp) / f"{workload}.jsonl"), "--", __file__, "--script", kind, "--workload", workload,
                    "--steps", str(a.steps), "--block", str(a.block)], f"live_cost: {workload}, {kind}", tmp)
    return next(json.loads(line) for line in out.splitlines() if line.startswith('{"ratios"'))


def memory(tmp: str) -> list[dict]:
    rows = []
    for steps in MEMORY_STEPS:
        path = Path(tmp) / f"memory-{steps}.json"
        out = _profile(["--live", "--metrics-port", "0", "--live-log", str(Path(tmp) / f"memory-{steps}.jsonl"),
                        "--json", str(path), "--", __file__, "--memory-script", str(steps)],
                       f"live_cost: memory, {steps} steps", tmp)
        doc = json.loads(path.read_text())
        rss = doc["summary"]["peak_rss_bytes"]  # the largest rank's
        now = {x["step"]: x["rss_bytes"] for x in (json.loads(line) for line in out.splitlines()
                                                          if line.startswith('{"step"'))}
        rows.append({"steps": steps, "peak_rss_bytes": rss, "rss_bytes_at_step": now,
                     "iterations_kept": len(doc["iterations"]),
                     "log_bytes": (Path(tmp) / f"memory-{steps}.jsonl").stat().st_size})
        print(f"{steps} steps: peak RSS {rss / 2**20:.1f} MiB; rank 0 resident at step "
              + ", ".join(f"{k:,} {v / 2**20:.1f} MiB" for k, v in now.items())
              + f"; {rows[-1]['iterations_kept']} iteration records kept", flush=True)
    return rows


def main() -> None:
    p = parser(__doc__, json="live-cost-results.json")
    p.add_argument("--script", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--memory-script", type=int, help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--jobs", type=int, default=2, help="jobs of each kind per workload, taken in turn (default 2)")
    p.add_argument("--steps", type=int, default=120, help="steps per job (default 120)")
    p.add_argument("--block", type=int, default=10, help="steps per block (default 10)")
    p.add_argument("--window", type=int, default=20, help="--live-window (default 20, commprof's)")
    p.add_argument("--memory", action="store_true", help="the peak RSS after 1,000 and 100,000 steps instead")
    args = parse(p, QUICK)
    if args.script:
        script(args.script, args.workload, args.steps, args.block)
        return
    if args.memory_script:
        memory_script(args.memory_script)
        return
    workloads = args.workloads.split(",")
    if set(workloads) - set(WORKLOADS) or args.block < 2 or args.steps < 4 * args.block:
        p.error(f"--workloads from {', '.join(WORKLOADS)}; --block at least 2 and --steps at least 4 blocks")
    with tempfile.TemporaryDirectory(prefix="live-cost-") as tmp:
        if args.memory:
            result = {"memory": memory(tmp)}
        else:
            rows = []
            for w in workloads:
                kinds = KINDS[:1] if args.quick else KINDS  # --quick: that it runs, one job
                got = {kind: [] for kind in kinds}
                for j in range(args.jobs):
                    for kind in kinds if j % 2 == 0 else kinds[::-1]:
                        got[kind].append(run(kind, w, args, tmp))
                row = {"workload": w, "step_ms": statistics.median(x["on_ms"] for x in got["live"]),
                       "live_ms_per_step": statistics.median(x["live_ms_per_step"] for x in got["live"]),
                       "thread_ms_per_step": statistics.median(x["thread_ms_per_step"] for x in got["live"])}
                for kind in kinds:
                    ratios = [r for x in got[kind] for r in x["ratios"]]
                    row[kind] = {"ratio": statistics.median(ratios), "ci95": list(median_ci(ratios)),
                                 "pairs": len(ratios)}
                rows.append(row)
                print(f"{w}: step {row['step_ms']:.1f} ms, live's own {row['live_ms_per_step'] * 1e3:.0f} µs a step "
                      f"({row['live_ms_per_step'] / row['step_ms']:.3%}); "
                      + "; ".join(f"{k} {row[k]['ratio']:.4f} ({row[k]['ci95'][0]:.4f} … {row[k]['ci95'][1]:.4f})"
                                  for k in kinds), flush=True)
            result = {"rows": rows, "jobs": args.jobs, "steps": args.steps, "block": args.block,
                      "window": args.window}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
