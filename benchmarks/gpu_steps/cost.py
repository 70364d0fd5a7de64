"""gpu_checks.py's `cost` step: what `commprof profile` costs DDP and FSDP2 on CUDA tensors, with
benchmarks/profile_cost.py's jobs (plain, plain again, profiled, interleaved): per-round ratios and the A/A ratio.
`OUT=out python3 benchmarks/gpu_checks.py cost --device cpu --rounds 1` runs it on CPU tensors."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import profile_cost as pc

from gpu_steps.harness import Budget, log, record


def run(args, out: Path, budget: Budget) -> None:
    cuda = args.device == "cuda"
    model = "resnet18" if cuda else "small"
    # one job per arm runs every workload in turn (as profile_cost's --quick does): half the jobs of one
    # job per workload, and a job's start-up is most of its time here
    plan = [("gloo", ["ddp", "fsdp2"])]
    record(out, "cost", device=args.device, model=model, steps=args.cost_steps, warmup=args.cost_warmup,
           arms=list(pc.ARMS), note="each job runs its workloads one after another; ratio = arm / plain per round")
    rows: dict[str, list] = {}
    errors = []
    round_s = None
    for r in range(args.rounds):
        if round_s is not None and budget.left() < round_s * 1.15 + 5:
            record(out, "cost", stopped_after_rounds=r, why=f"{budget.left():.0f} s left, a round took {round_s:.0f} s")
            break
        t0 = time.monotonic()
        queue = list(plan)
        while queue:
            backend, workloads = queue.pop(0)
            key = f"{backend}:{','.join(workloads)}"
            try:
                got = {}
                for arm in pc.ORDERS[r % 6]:
                    log(f"cost round {r + 1}: {arm}, {backend}, {', '.join(workloads)}")
                    got[arm] = pc.run(arm, workloads, args.cost_steps, args.cost_warmup, model, args.device, backend,
                                      timeout_s=max(10.0, budget.left() - 5))
            except (SystemExit, Exception) as exc:  # common.run_all says why a job failed by exiting
                errors.append({"round": r + 1, "jobs": key, "error": str(exc)[-1500:]})
                log(f"  failed: {str(exc)[-300:]}")
                plan.remove((backend, workloads))
                if len(workloads) > 1:  # apart, so one workload's failure keeps the other's figures
                    parts = [(backend, [w]) for w in workloads]
                elif backend == "gloo" and cuda:  # NCCL at one rank: where two ranks cannot share the GPU over gloo
                    parts = [("nccl", workloads)]
                else:
                    parts = []
                plan.extend(parts)
                queue = parts + queue
                if budget.left() < 20:
                    break
                continue
            for w in workloads:
                ms = {arm: got[arm][w] for arm in pc.ARMS}
                rows.setdefault(f"{w} ({backend}, {pc.nproc(args.device, backend)} rank(s))", []).append(
                    {"round": r + 1, "order": list(pc.ORDERS[r % 6]), "ms": ms,
                     "ratio": {arm: ms[arm] / ms["plain"] for arm in pc.ARMS[1:]}})
        round_s = time.monotonic() - t0
        summary = {}
        for name, rs in rows.items():
            summary[name] = {"rounds": len(rs),
                             "ms_median": {arm: statistics.median(x["ms"][arm] for x in rs) for arm in pc.ARMS},
                             "profiled_over_plain": statistics.median(x["ratio"]["profiled"] for x in rs),
                             "aa_plain_again_over_plain": statistics.median(x["ratio"]["plain again"] for x in rs),
                             "per_round": rs}
        record(out, "cost", results=summary, errors=errors, round_s=round_s)
        log(f"cost round {r + 1} done in {round_s:.0f} s: " + "; ".join(
            f"{k}: profiled/plain {v['profiled_over_plain']:.3f}, A/A {v['aa_plain_again_over_plain']:.3f}"
            for k, v in summary.items()))
