"""The straggler finding's "step without it" against the same job run without the straggler, on three kinds of
training: multi-bucket DDP, FSDP2 with a unit per block, and a GPipe pipeline. Rank 1 sleeps D ms before every
step; `commprof profile` names it and prices its cost; the step without it is held against

- balanced: the same job with no sleep, run interleaved with the delayed one (--rounds of balanced then
  delayed, the order reversed every other round); each figure the median over its runs;
- neighbours: one job where rank 1 sleeps before every other step only; each delayed iteration replayed
  alone without the straggler (commprof/findings/whatif.py) over the mean of the balanced iterations on
  either side of it — a control from the same moment of the machine, where separate runs move by 10-30 %
  here — beside a balanced iteration over its balanced neighbours two away (the comparison's own noise).

Every finding's "step without it" is checked to be at most the step it is taken from (`above_step` counts
those that are not).

Workloads:
- ddp: DistributedDataParallel over an MLP of 2.6 M parameters in 1 MiB buckets (4 buckets a step), SGD;
- fsdp2: benchmarks/common.py's fsdp2 (4 transformer blocks, `fully_shard` each then the root, Adam, clip);
- pipeline: benchmarks/common.py's pipeline (GPipe, one stage of 4 Linear(256) per rank, 8 micro-batches).

    python benchmarks/findings_workloads.py [--quick] [--workloads ddp,fsdp2,pipeline] [--delay-ms 20]
                                            [--rounds 3] [--steps 40] [--json PATH]

--quick: ddp alone, its alternating job of 8 steps alone: that it runs. Target: step
without ÷ balanced and ÷ neighbours within 15 % (0.85-1.15). Results: benchmarks/README.md,
benchmarks/results/findings-workloads-results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# fsdp2 and pipeline are common.py's workloads (profile_cost.py trains them too), found here by name
from common import alternating_ratios, classifier_step, fsdp2, job, parse, parser, pipeline, with_root  # noqa: F401

WORKLOADS = ("ddp", "fsdp2", "pipeline")
QUICK = {"workloads": "ddp", "rounds": 1, "steps": 8}
SLOW = 1
"""The rank that sleeps."""
TIMEOUT_S = 600


def ddp(_, device):
    """Multi-bucket DDP: an MLP whose 2.6 M gradients fill 4 buckets of 1 MiB, each all-reduced as backward
    reaches it."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    layers = [torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
              torch.nn.Linear(1024, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)]
    model = DDP(torch.nn.Sequential(*layers).to(device), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(128, 512, generator=g), torch.randint(0, 10, (128,), generator=g)
    return classifier_step(model, opt, x, y), lambda: None


def script(workload: str, steps: int, delay_ms: float, every: int) -> None:
    """One rank: `steps` steps of `workload`, rank SLOW sleeping `delay_ms` before every `every`-th."""
    import gc

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    step, _ = globals()[workload](None, torch.device("cpu"))  # fsdp2, pipeline: common.py's
    slow = dist.get_rank() == SLOW
    for i in range(steps):
        if slow and delay_ms and i % every == 0:
            time.sleep(delay_ms / 1e3)
        step()
    del step
    gc.collect()  # a module holding the group, left to interpreter exit, lets gloo's threads abort the process
    dist.destroy_process_group()


def profiled(tmp: Path, name: str, workload: str, steps: int, delay_ms: float = 0.0, every: int = 1) -> dict:
    """`commprof profile --json --trace` of one job: its JSON."""
    out = tmp / f"{name}.json"
    job([sys.executable, "-m", "commprof", "profile", "--nproc", "2", "--json", str(out), "--trace", str(tmp / name),
         "--", __file__, "--script", workload, "--steps", str(steps), "--delay-ms", str(delay_ms), "--every",
         str(every)], env=with_root({**os.environ, "OMP_NUM_THREADS": "1"}), timeout_s=TIMEOUT_S,
        what=f"findings_workloads: {name}")
    return json.loads(out.read_text())


def above_step(doc: dict) -> int:
    """How many of the job's findings say a step without their cause longer than the step."""
    block = doc["findings"]
    return sum(f.get("step_ms_without") is not None and f["step_ms_without"] > block["step_ms"] + 1e-9
               for f in block["items"] or [])


def compare(tmp: Path, workload: str, args: argparse.Namespace) -> dict:
    """The workload's balanced and delayed jobs interleaved (not --quick), then its alternating job: its row."""
    kinds = () if args.quick else ("balanced", "delayed")  # --quick: that it runs, the alternating job alone
    runs: dict[str, list[dict]] = {kind: [] for kind in ("balanced", "delayed")}
    for r in range(args.rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            delay = args.delay_ms if kind == "delayed" else 0.0
            runs[kind].append(profiled(tmp, f"{workload}-{kind}{r}", workload, args.steps, delay))
    found = [next((f for f in d["findings"]["items"] or [] if f["kind"] == "straggler"), None) for d in runs["delayed"]]
    named = [f for f in found if f is not None and f["rank"] == SLOW]
    row = {"workload": workload, "delay_ms": args.delay_ms, "rounds": args.rounds, "steps": args.steps,
           "named": len(named), "balanced_step_ms": [d["findings"]["step_ms"] for d in runs["balanced"]],
           "delayed_step_ms": [d["findings"]["step_ms"] for d in runs["delayed"]],
           "cost_over_delay": [f["ms_per_step"] / args.delay_ms for f in named],
           "without_ms": [f["step_ms_without"] for f in named],
           "above_step": sum(above_step(d) for d in runs["balanced"] + runs["delayed"]),
           "contended": [(d["env"].get("contention") or {}).get("contended")
                         for d in runs["balanced"] + runs["delayed"]]}
    row["without_over_balanced"] = row["rank0_own_balanced_over_delayed"] = None
    if not args.quick:
        row["without_over_balanced"] = (statistics.median(row["without_ms"]) /
                                        statistics.median(row["balanced_step_ms"]) if named else None)
        # the replay keeps each rank's own time as the delayed job measured it; the balanced job's may differ
        # (ranks computing at once on shared cores, where the delayed ones take turns): rank 0's, balanced ÷ delayed
        own = {k: statistics.median(d["findings"]["by_rank"][0]["busy_ms"] for d in runs[k]) for k in runs}
        row["rank0_own_balanced_over_delayed"] = own["balanced"] / own["delayed"]
    alternating = tmp / f"{workload}-alternating"
    doc = profiled(tmp, alternating.name, workload, args.steps, args.delay_ms, every=2)
    row["above_step"] += above_step(doc)
    row.update(alternating_ratios(str(alternating), args.delay_ms, SLOW))
    return row


def show(row: dict) -> None:
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    costs = ", ".join(f"{c:.2f}" for c in row["cost_over_delay"]) or "-"
    line = (f"{row['workload']}: rank {SLOW} named in {row['named']} of {len(row['delayed_step_ms'])} delayed jobs, "
            f"cost ÷ D {costs}; "
            f"step without ÷ balanced {f(row['without_over_balanced'])} (balanced steps "
            f"{', '.join(f'{s:.1f}' for s in row['balanced_step_ms'])} ms)")
    if "without_over_neighbours" in row:
        ci = row["without_over_neighbours_ci95"]
        line += (f"; every other step delayed: ÷ neighbours {f(row['without_over_neighbours'])}"
                 f"{'' if ci is None else f' ({ci[0]:.3f} … {ci[1]:.3f})'} over {row['pairs']} iterations, "
                 f"balanced ÷ balanced {f(row['balanced_over_neighbours'])}")
    print(line + f"; rank 0's own time balanced ÷ delayed {f(row['rank0_own_balanced_over_delayed'])}; "
          f"findings above their step: {row['above_step']}", flush=True)


def main() -> None:
    p = parser(__doc__, json="findings-workloads-results.json")
    p.add_argument("--script", choices=WORKLOADS, help=argparse.SUPPRESS)
    p.add_argument("--every", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--delay-ms", type=float, default=20.0, help="how long rank 1 sleeps before a step (default 20)")
    p.add_argument("--rounds", type=int, default=3, help="balanced and delayed jobs of each workload (default 3)")
    p.add_argument("--steps", type=int, default=40, help="steps a job (default 40: 36 measured after profile's 4)")
    args = parse(p, QUICK)
    if args.script:
        script(args.script, args.steps, args.delay_ms, args.every)
        return
    workloads = args.workloads.split(",")
    if unknown := set(workloads) - set(WORKLOADS):
        p.error(f"--workloads: no workload {', '.join(sorted(unknown))} (choose from {', '.join(WORKLOADS)})")
    if args.rounds < 1 or args.delay_ms <= 0 or args.steps < 6:
        p.error("--rounds must be at least 1, --delay-ms above 0 and --steps at least 6")
    with tempfile.TemporaryDirectory(prefix="findings-workloads-") as tmp:
        rows = []
        for workload in workloads:
            rows.append(compare(Path(tmp), workload, args))
            show(rows[-1])
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
