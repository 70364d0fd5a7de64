"""What `commprof profile` costs each kind of training, the script unchanged: per workload, the step as the
script times it, plain (ranks with torchrun's variables) against `commprof profile`, 2 gloo ranks, and a
second plain arm against the first (A/A: the noise of the comparison itself).

Workloads (`--workloads`):
- ddp: torch's DistributedDataParallel, ResNet-18 (torchvision) on CIFAR-sized batches of 32, SGD;
- fsdp2: `fully_shard` per block of a small transformer (4 blocks, width 128, 64 tokens) then the root,
  Adam, `clip_grad_norm_` every step, the full state gathered once after the last step;
- fsdp2_units: many small FSDP2 units, shaped like PyTorch's FSDP2 example (distributed/FSDP2/example.py):
  a 10-block transformer of width 16 (4 heads, 1024 tokens of vocabulary, 64-token sequences, batch 32),
  `fully_shard` per block then the root, explicit prefetching (2 blocks ahead forward and backward, the root
  unsharded before each step), Adam, `clip_grad_norm_`: 21 all_gathers, 11 reduce_scatters and 1 all_reduce
  a step, each a few KiB, so the step is mostly per-op cost;
- pipeline: torch.distributed.pipelining's GPipe schedule, one stage of 4 Linear(256) per rank,
  8 micro-batches;
- tp: a DTensor MLP (ColwiseParallel then RowwiseParallel, width 1024, batch 128) under
  `parallelize_module`, Adam;
- small: 200 all_reduces of 8 floats a step, nothing else.

--device cuda puts each workload's model and batches on the GPU (rank r on GPU r mod the GPUs there) and
times each step to its last kernel (torch.cuda.synchronize); with gloo, the default, 2 ranks share one GPU
(gloo moves CUDA tensors through the host); --backend nccl runs a rank per GPU, at most 2 (NCCL puts no two
ranks of a group on one GPU).

Rounds take the arms in each of their 6 orders in turn; each run's figure is the median of its steps after
the warm-up; the ratio is arm/plain per round, and its median over rounds is the result, with its 95 % CI
(common.median_ci).

    python benchmarks/profile_cost.py [--quick] [--workloads ddp,fsdp2,pipeline,tp,small] [--rounds 5]
                                      [--steps 30] [--warmup 5] [--device cpu|cuda] [--backend gloo|nccl]
                                      [--against CHECKOUT] [--json PATH]

--against CHECKOUT adds a fourth arm, `commprof profile` of another checkout (e.g. `git worktree add
/tmp/before <commit>`): what a change to commprof costs each workload, measured in the same rounds as the
rest. Its jobs start from a folder outside every checkout, with CHECKOUT first on PYTHONPATH, so that its
commprof is the one imported; the workloads are this script's. With four arms a round takes them in a row
of a Williams square: every 4 rounds each arm has taken each place once and followed each other arm once.

--quick: every workload profiled, one after another in one job of 4 steps each after 1 of warm-up, ddp on
a small CNN: to see that each runs under `commprof profile` (no plain arm, so no ratio).
Target: profiled/plain ≤ 1.02 on each. Results: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# the workloads ddp, fsdp2, fsdp2_units and pipeline are common.py's (live_cost.py and interception_cost.py train
# them too), found here by name
from common import ROOT, ddp, fsdp2, fsdp2_units, job, median_ci, parse, parser, pipeline, ranks, with_root  # noqa: F401

TARGET = 1.02
WORKLOADS = ("ddp", "fsdp2", "fsdp2_units", "pipeline", "tp", "small")
QUICK = {"rounds": 1, "steps": 4, "warmup": 1, "model": "small"}
"""--quick: every workload in one profiled job (ranks start once: it is their start-up that costs), 4 steps
each after 1 of warm-up."""
ARMS = ("plain", "plain again", "profiled")
AGAINST = "profiled by --against"
ORDERS = list(itertools.permutations(ARMS))
"""Round r runs the arms in ORDERS[r % 6]: every 6 rounds each arm has taken each place twice. Alternating
one order with its reverse kept "plain again" in the middle of every round, and on this VM the place in a
round moved a run's step by more than 20 %: the A/A arm read 1.25 on small ops."""
RUN_TIMEOUT_S = 900


# ---- the workloads: each returns one training step, run in a rank --------------------------------------
def tp(_, device):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 1024)).to(device)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(128, 1024, generator=torch.Generator().manual_seed(0)).to(device)

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    return step, lambda: None


def small(_, device):
    import torch
    import torch.distributed as dist

    t = torch.ones(8, device=device)

    def step():
        for _ in range(200):
            dist.all_reduce(t)

    return step, lambda: None


def script(workloads: list[str], steps: int, warmup: int, model_name: str, device_type: str = "cpu",
           backend: str = "gloo") -> None:
    """One rank's run of each workload in turn: prints its median step time (ms) after the warm-up as a
    JSON line per workload."""
    import gc
    import time

    import torch
    import torch.distributed as dist

    device, sync = torch.device("cpu"), lambda: None
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        sync = torch.cuda.synchronize  # a step ends when its last kernel does, not when the host queued it
    dist.init_process_group(backend, **({"device_id": device} if backend == "nccl" else {}))
    for workload in workloads:
        torch.manual_seed(0)
        step, after = globals()[workload](model_name, device)  # fsdp2_units: common.py's
        times = []
        for _ in range(steps):
            sync()
            start = time.perf_counter()
            step()
            sync()
            times.append((time.perf_counter() - start) * 1e3)
        after()
        if dist.get_rank() == 0:
            print(json.dumps({"workload": workload, "step_ms": statistics.median(times[warmup:])}), flush=True)
        # a module holding the group, left to interpreter exit, lets gloo's threads abort the process
        del step, after
        gc.collect()
    dist.destroy_process_group()


def nproc(device: str, backend: str) -> int:
    """Ranks a job starts: 2, or with NCCL one per GPU up to 2 (NCCL puts no two ranks of a group on one GPU)."""
    if backend != "nccl":
        return 2
    from commprof.base.backends import cuda_devices

    return max(1, min(2, cuda_devices()))


def run(arm: str, workloads: list[str], steps: int, warmup: int, model: str, device: str = "cpu",
        backend: str = "gloo", timeout_s: float = RUN_TIMEOUT_S, against: str | None = None) -> dict[str, float]:
    """One job of `arm` running each workload in turn: workload -> its median step (ms)."""
    env = with_root({**os.environ, "OMP_NUM_THREADS": "1"}, root=against if arm == AGAINST else ROOT)
    env.pop("THP_MEM_ALLOC_ENABLE", None)  # the same allocator in every arm
    args = [__file__, "--script", ",".join(workloads), "--steps", str(steps), "--warmup", str(warmup), "--model", model,
            "--device", device, "--backend", backend]
    what = f"profile_cost: {', '.join(workloads)}, {arm}"
    n = nproc(device, backend)
    if arm in ("profiled", AGAINST):
        # another checkout's jobs start outside every checkout, or python would import the one they start in
        outside = tempfile.TemporaryDirectory(prefix="profile-cost-") if arm == AGAINST else contextlib.nullcontext()
        with outside as cwd:
            outs = [job([sys.executable, "-m", "commprof", "profile", "--backend", backend, "--nproc", str(n), "--",
                         *args], env=env, timeout_s=timeout_s, what=what, cwd=cwd)]
    else:
        outs = ranks([sys.executable, *args], n, env=env, timeout_s=timeout_s, what=what)
    got = [json.loads(line) for out in outs for line in out.splitlines() if line.startswith('{"workload"')]
    return {x["workload"]: x["step_ms"] for x in got}


def williams(n: int) -> list[list[int]]:
    """A Williams square of even n: n orders of range(n) in which each takes each place once and follows each
    other once (0, 1, n − 1, 2, n − 2, … then that row shifted by 1, 2, …)."""
    first = [0] + [(k + 1) // 2 if k % 2 else n - k // 2 for k in range(1, n)]
    return [[(x + r) % n for x in first] for r in range(n)]


def compare(workload: str, args: argparse.Namespace) -> dict:
    """The workload's arms, interleaved over --rounds, one job each: its row, printed as a line too."""
    arms = ARMS + ((AGAINST,) if args.against else ())
    orders = ORDERS if len(arms) == 3 else [[arms[i] for i in row] for row in williams(len(arms))]
    rounds = []
    for r in range(args.rounds):
        got = {arm: run(arm, [workload], args.steps, args.warmup, args.model, args.device, args.backend,
                        against=args.against)[workload] for arm in orders[r % len(orders)]}
        rounds.append({"ms": got, "ratio": {arm: got[arm] / got["plain"] for arm in arms[1:]}})
    row = {"workload": workload, "rounds": rounds,
           "ms": {arm: statistics.median(x["ms"][arm] for x in rounds) for arm in arms},
           "ratio": {arm: statistics.median(x["ratio"][arm] for x in rounds) for arm in arms[1:]},
           "ratio_ci95": {arm: median_ci([x["ratio"][arm] for x in rounds]) for arm in arms[1:]}}
    if args.against:
        per = [x["ms"]["profiled"] / x["ms"][AGAINST] for x in rounds]
        row["profiled_over_against"] = {"ratio": statistics.median(per), "ci95": median_ci(per)}

    def told(arm: str) -> str:
        return f"{row['ratio'][arm]:.3f} ({row['ratio_ci95'][arm][0]:.3f} … {row['ratio_ci95'][arm][1]:.3f})"

    other = f"; --against/plain {told(AGAINST)}" if args.against else ""
    print(f"{workload}: plain {row['ms']['plain']:.1f} ms; profiled/plain {told('profiled')}; A/A "
          f"{told('plain again')}{other}", flush=True)
    return row


def main() -> None:
    p = parser(__doc__, json="profile-cost-results.json")
    p.add_argument("--script", help=argparse.SUPPRESS)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first, of --steps (default 5)")
    p.add_argument("--model", choices=("resnet18", "small"), default="resnet18", help="ddp's model")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the tensors live (default cpu)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="default gloo; nccl needs --device cuda and runs a rank per GPU, at most 2")
    p.add_argument("--against", metavar="CHECKOUT", help="a fourth arm: `commprof profile` of the checkout there")
    args = parse(p, QUICK)
    if args.script:
        script(args.script.split(","), args.steps, args.warmup, args.model, args.device, args.backend)
        return
    workloads = args.workloads.split(",")
    if unknown := set(workloads) - set(WORKLOADS):
        p.error(f"--workloads: no workload {', '.join(sorted(unknown))} (choose from {', '.join(WORKLOADS)})")
    if args.rounds < 1 or not 0 <= args.warmup < args.steps:
        p.error("--rounds must be at least 1, and --steps more than --warmup")
    if args.backend == "nccl" and args.device != "cuda":
        p.error("--backend nccl needs --device cuda")
    if args.against:
        if not (Path(args.against) / "commprof" / "__main__.py").is_file():
            p.error(f"--against {args.against}: no commprof checkout there (no commprof/__main__.py)")
        args.against = str(Path(args.against).resolve())
    if args.quick:
        got = run("profiled", workloads, args.steps, args.warmup, args.model, args.device, args.backend)
        rows = [{"workload": w, "ms": {"profiled": got[w]}} for w in workloads]
        for w in workloads:
            print(f"{w}: profiled {got[w]:.1f} ms", flush=True)
    else:
        rows = [compare(w, args) for w in workloads]
    if args.json:
        against = {"against": {"path": args.against, "commit": commit(args.against)}} if args.against else {}
        Path(args.json).write_text(json.dumps({"rows": rows, "target": TARGET, "steps": args.steps,
                                               "warmup": args.warmup, "model": args.model, "device": args.device,
                                               "backend": args.backend, **against}, indent=1) + "\n")


def commit(checkout: str) -> str | None:
    """The commit a git checkout is at; None elsewhere."""
    proc = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


if __name__ == "__main__":
    main()
