"""gpu_checks.py's `straggler` step: `commprof profile` of a CUDA DDP script whose rank 1 runs a calibrated
torch.cuda._sleep kernel before every backward (2 gloo ranks on CUDA tensors): the rank the findings name, and the
cost they give it against the delay injected (and against the delay as the device ran it).
`OUT=out python3 benchmarks/gpu_checks.py straggler --device cpu` runs it with a host sleep on CPU tensors;
`python3 benchmarks/gpu_checks.py --quick --json PATH` runs it alone on a GPU."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpu_steps.harness import SCRIPT, Budget, commprof, env_with_root, failed, last_json_line, record, sh

DELAY_MS = 20.0
"""The straggler's injected delay, as tests/test_findings.py injects it on CPU."""
TOLERANCE = 0.15


def calibrate_worker() -> None:
    """Cycles of torch.cuda._sleep per ms, timed with CUDA events, and a DELAY_MS sleep timed back."""
    import torch

    torch.cuda.init()
    for _ in range(100):  # ~0.2 s of work first: the GPU's clock up before the calibration
        torch.cuda._sleep(2_000_000)
    torch.cuda.synchronize()

    def timed(cycles: int) -> float:
        out = []
        for _ in range(7):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1_000_000)  # queued ahead, so the host's launch is not between the events
            a.record()
            torch.cuda._sleep(cycles)
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        return statistics.median(out)

    per_ms = 10_000_000 / timed(10_000_000)
    check = timed(int(DELAY_MS * per_ms))
    print(json.dumps({"cycles_per_ms": per_ms, "delay_ms_requested": DELAY_MS, "delay_ms_timed": check,
                      "gpu": torch.cuda.get_device_name(0)}))


def straggler_script(argv: list[str]) -> None:
    """What `commprof profile` runs: tests/scripts/straggler_train.py's DDP job on CUDA tensors over gloo, rank
    --slow-rank's delay a torch.cuda._sleep kernel ahead of its backward (a time.sleep on CPU), each timed with
    CUDA events into --truth-out.rank<r>.json."""
    import gc

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--device", default="cuda")
    p.add_argument("--cycles-per-ms", type=float, default=0.0)
    p.add_argument("--host-wait", action="store_true", help="the host waits for the sleep kernel (as time.sleep)")
    p.add_argument("--truth-out")
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).to(device)
    ddp = DDP(model, bucket_cap_mb=0.5, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 256, generator=g).to(device), torch.randint(0, 10, (64,), generator=g).to(device)
    slow = rank == args.slow_rank and args.delay_ms > 0
    cycles = int(args.delay_ms * args.cycles_per_ms)
    timed, host_ms = [], []
    for _ in range(args.steps):
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        if slow:
            t0 = time.perf_counter()
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                torch.cuda._sleep(cycles)
                b.record()
                timed.append((a, b))
                if args.host_wait:
                    b.synchronize()
            else:
                time.sleep(args.delay_ms / 1e3)
            host_ms.append((time.perf_counter() - t0) * 1e3)
        loss.backward()
        opt.step()
    if cuda:
        torch.cuda.synchronize()
    if args.truth_out:
        device_ms = [a.elapsed_time(b) for a, b in timed]
        Path(f"{args.truth_out}.rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "slow": slow, "device_sleep_ms": device_ms, "host_ms": host_ms,
             "device_sleep_ms_median": statistics.median(device_ms) if device_ms else None}))
    del ddp, opt, loss  # before the group goes (gloo's threads abort a process left holding it)
    gc.collect()
    dist.destroy_process_group()


def _findings_of(stdout: str) -> str:
    """The findings block of a profile's stdout: it closes the output, after the tables."""
    at = stdout.rfind("\nfindings")
    return stdout[at + 1:] if at >= 0 else ""


def cost_vs_delay(straggler: dict, truths: dict) -> dict:
    """The cost the findings give the straggler against the delay injected and as the device timed it."""
    cost = straggler["ms_per_step"]
    device_ms = (truths.get(1) or {}).get("device_sleep_ms_median")
    e = straggler.get("evidence") or {}
    # tests/test_findings.py's control: what else the slow rank's own time exceeds its peer's by
    besides = (e["busy_ms"] - DELAY_MS) - e["others_busy_ms"] if {"busy_ms", "others_busy_ms"} <= set(e) else None
    return {"injected_ms": DELAY_MS, "device_timed_ms": device_ms, "cost_ms": cost,
            "error_vs_injected": (cost - DELAY_MS) / DELAY_MS,
            "error_vs_device_timed": (cost - device_ms) / device_ms if device_ms else None,
            "within_15pct_of_injected": abs(cost - DELAY_MS) <= TOLERANCE * DELAY_MS,
            "besides_ms": besides,
            "within_15pct_beside_control": (abs(cost - DELAY_MS) <= TOLERANCE * DELAY_MS + abs(besides)
                                            if besides is not None else None)}


def run(args, out: Path, budget: Budget) -> None:
    cuda = args.device == "cuda"
    per_ms = 0.0
    if cuda:
        res = sh([sys.executable, str(SCRIPT), "--calibrate"], min(40.0, budget.left() - 3), env_with_root())
        if res["rc"] != 0:
            record(out, "straggler", calibration=failed(res))
            return
        cal = last_json_line(res["stdout"])
        per_ms = cal["cycles_per_ms"]
        record(out, "straggler", calibration=cal)
    tmp = Path(tempfile.mkdtemp(prefix="gpu-straggler-"))
    jobs = [("slowed", ["--delay-ms", str(DELAY_MS)]), ("balanced", [])]
    if cuda:  # the same kernel with the host held until it ends: the delay as time.sleep puts it on the host
        jobs.append(("slowed-host-wait", ["--delay-ms", str(DELAY_MS), "--host-wait"]))
    for i, (label, extra) in enumerate(jobs):
        if budget.left() < 25:
            record(out, "straggler", **{label: {"skipped": f"{budget.left():.0f} s left of the step's budget"}})
            continue
        js, truth = tmp / f"{label}.json", tmp / f"{label}-truth"
        res = commprof("profile", "--backend", "gloo", "--nproc", "2", "--json", str(js), "--", str(SCRIPT),
                       "--straggler-script", "--steps", str(args.straggler_steps), "--device", args.device,
                       "--cycles-per-ms", str(per_ms), "--truth-out", str(truth), *extra,
                       timeout_s=budget.left() - 3 - (20 if i + 1 < len(jobs) else 0))
        if res["rc"] != 0 or not js.exists():
            record(out, "straggler", **{label: failed(res)})
            continue
        doc = json.loads(js.read_text())
        found = doc.get("findings") or {}
        items = found.get("items") or []
        truths = {}
        for path in tmp.glob(f"{label}-truth.rank*.json"):
            t = json.loads(path.read_text())
            truths[t["rank"]] = {k: t[k] for k in ("slow", "device_sleep_ms_median", "host_ms")}
            if t["host_ms"]:
                truths[t["rank"]]["host_ms"] = statistics.median(t["host_ms"])
        entry = {"wall_s": res["wall_s"], "steps": doc["steps"], "clock": doc["env"].get("clock"),
                 "summary": {k: doc["summary"].get(k) for k in ("wall_ms", "compute_ms", "comm_ms",
                                                                "exposed_comm_ms", "overlap_ms")},
                 "per_rank": doc["summary"].get("per_rank"), "findings_top": items[:4],
                 "findings_by_rank": found.get("by_rank"), "truth": truths,
                 "findings_text": _findings_of(res["stdout"])}
        stragglers = [f for f in items if f.get("kind") == "straggler"]
        entry["straggler_named"] = [{"rank": f.get("rank"), "ms_per_step": f.get("ms_per_step")} for f in stragglers]
        if label.startswith("slowed"):
            top = items[0] if items else {}
            entry["top_is_rank1_straggler"] = (top.get("kind"), top.get("rank")) == ("straggler", 1)
            if stragglers:
                entry["cost_vs_delay"] = cost_vs_delay(stragglers[0], truths)
        record(out, "straggler", **{label: entry})
