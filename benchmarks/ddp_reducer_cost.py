"""What routing DistributedDataParallel's buckets through Comm costs a training step, measured in the same
processes step by step: ResNet-18 (torchvision, CIFAR-10-sized synthetic batches of 32 per rank, SGD),
2 gloo ranks, four DDPs over four copies of the same model, taking turns step by step:

  plain      DDP as PyTorch builds it: the reducer's buckets in C++, unseen;
  routed     DDP built while commprof/intercept/ddp_reducer.py is installed (what `commprof profile` and
             `run --strategy torch-ddp` do): the reducer's all-reduces through Comm, DDP's arithmetic;
  hook       DDP with a comm hook that divides each bucket and all-reduces it through Comm — how commprof
             routed the buckets before, and what a Python comm hook costs any script on CPU;
  profiled   the routed DDP with everything else `commprof profile` puts under a script switched on for its
             steps: torch.distributed interposed, DDP's buffer broadcasts through Comm, the module,
             optimizer and autograd hooks that find iterations and phases (switched off between them).

Each arm's step is timed whole and the arms rotate through the orders, so each step shares its neighbours'
moment of this noisy machine, which whole runs launched apart do not (an earlier whole-run benchmark: ±15 %
between rounds). The models train on the same batches and end equal (checked), so a ratio is a cost alone.

    python benchmarks/ddp_reducer_cost.py [--quick] [--turns 24] [--warmup 3] [--model resnet18] [--json PATH]

Each ratio is the median over turns and ranks of the arm's step over the plain step of its turn, with the
median's 95 % CI (benchmarks/common.py's median_ci) and the quartiles; the first --warmup turns are not
counted. --quick: 2 measured turns, no warm-up, on a small CNN (--model small: two convolutions with
BatchNorm, no torchvision); seconds, to see that it runs.

Target: routed ÷ plain ≤ 1.02. Results: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
from pathlib import Path

from common import image_model, median_ci, parse, parser, ranks, with_root

TARGET = 1.02
WARMUP = 3
ARMS = ("plain", "routed", "hook", "profiled")
QUICK = {"turns": 2, "warmup": 0, "model": "small"}
"""--quick: 2 measured turns, no warm-up, on a small CNN."""


def _hook(comm, bucket):
    """The comm hook commprof used before: DDP's default arithmetic, the all-reduce through Comm."""
    buffer = bucket.buffer()
    buffer.div_(comm.world_size)
    return comm.all_reduce(buffer, async_op=True).get_future().then(lambda _: buffer)


def worker(turns: int, warmup: int, model_name: str) -> None:
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from commprof.intercept import ddp_reducer, interpose
    from commprof.intercept.interposer import Interposer
    from commprof.record import hooks
    from commprof.record.clock import CpuClock
    from commprof.record.recorder import OpRecorder

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    interposer = Interposer(OpRecorder(CpuClock()))
    comm = interposer.comm(None)

    def model():
        torch.manual_seed(0)
        return image_model(model_name)

    ddps = {"plain": DDP(model())}
    ddp_reducer.install(interposer)
    ddps["routed"] = DDP(model())
    ddps["profiled"] = DDP(model())
    ddp_reducer.uninstall()  # buffer broadcasts back to DDP's own path, but for the profiled arm's steps
    ddps["hook"] = DDP(model())
    ddps["hook"].register_comm_hook(comm, _hook)
    opts = {arm: torch.optim.SGD(d.parameters(), lr=0.01, momentum=0.9) for arm, d in ddps.items()}
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)

    def profile(on: bool) -> None:
        if on:
            interpose.install(comm.recorder).adopt(comm)
            ddp_reducer.install(interposer)
            hooks.install(comm.recorder, 0)
        else:
            hooks.uninstall()
            ddp_reducer.uninstall()
            interpose.uninstall()

    def step(arm):
        if arm == "profiled":
            profile(True)
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(ddps[arm](x), y)
        opts[arm].zero_grad()
        loss.backward()
        opts[arm].step()
        ms = (time.perf_counter() - start) * 1e3
        if arm == "profiled":
            profile(False)
        return ms

    orders = list(itertools.permutations(ARMS))
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    seen = {arm: 0 for arm in ARMS}  # all-reduces Comm logged during each arm's steps (the tracker of the
    for t in range(warmup + turns):   # profiled arm takes its ops into its iterations: not counted there)
        for arm in orders[t % len(orders)]:
            mark = len(comm.recorder.ops)
            ms = step(arm)
            seen[arm] += sum(1 for op in comm.recorder.ops[mark:] if op[0] == "all_reduce")
            if t >= warmup:
                times[arm].append(ms)
    params = {arm: torch.cat([p.detach().reshape(-1) for p in d.parameters()]) for arm, d in ddps.items()}
    diff = max(float((params[arm] - params["plain"]).abs().max()) for arm in ARMS)
    per_rank = [None, None] if rank == 0 else None
    dist.gather_object({"times": times, "max_abs_diff": diff, "all_reduces_seen": seen}, per_rank, dst=0)
    if rank == 0:
        print(json.dumps(per_rank), flush=True)
    ddps.clear()  # the models go before the process group
    opts.clear()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def summarise(per_rank: list[dict], turns: int, warmup: int) -> dict:
    out = {"turns": turns, "warmup": warmup, "target": TARGET, "per_rank": per_rank}
    for arm in ARMS:
        out[f"{arm}_ms"] = statistics.fmean(statistics.median(r["times"][arm]) for r in per_rank)
    for arm in ARMS[1:]:
        # step by step: the arm's step over the plain step of the same turn, median over turns and ranks
        ratios = sorted(a / b for r in per_rank for a, b in zip(r["times"][arm], r["times"]["plain"]))
        out[f"{arm}_ratio"] = statistics.median(ratios)
        out[f"{arm}_ratio_ci95"] = median_ci(ratios)
        out[f"{arm}_quartiles"] = statistics.quantiles(ratios, n=4)[::2]
        out[f"{arm}_ratio_of_medians"] = out[f"{arm}_ms"] / out["plain_ms"]
    out["max_abs_diff"] = max(r["max_abs_diff"] for r in per_rank)
    return out


def main() -> None:
    p = parser(__doc__, json="ddp-reducer-cost-results.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--turns", type=int, default=24, help="measured turns (each: one step of every arm)")
    p.add_argument("--warmup", type=int, default=WARMUP, help=f"turns before them, not measured (default {WARMUP})")
    p.add_argument("--model", choices=("resnet18", "small"), default="resnet18",
                   help="torchvision's ResNet-18 (default), or a small CNN")
    args = parse(p, QUICK)
    if args.worker:
        return worker(args.turns, args.warmup, args.model)
    if args.turns < 1 or args.warmup < 0:
        p.error("--turns must be at least 1, --warmup at least 0")
    env = with_root()
    env.pop("THP_MEM_ALLOC_ENABLE", None)
    outs = ranks([sys.executable, __file__, "--worker", "--turns", str(args.turns), "--warmup", str(args.warmup),
                  "--model", args.model], 2, env=env, timeout_s=3600, what="ddp_reducer_cost")
    per_rank = json.loads(next(line for line in outs[0].splitlines() if line.startswith("[")))
    doc = {"model": args.model, **summarise(per_rank, args.turns, args.warmup)}
    for arm in ARMS:
        print(f"{arm:7s} {doc[arm + '_ms']:.1f} ms/step" + (
            f"   ÷ plain, step by step: {doc[arm + '_ratio']:.3f} (95 % CI {doc[arm + '_ratio_ci95'][0]:.3f}–"
            f"{doc[arm + '_ratio_ci95'][1]:.3f}, quartiles {doc[arm + '_quartiles'][0]:.3f}–"
            f"{doc[arm + '_quartiles'][1]:.3f}); ratio of medians {doc[arm + '_ratio_of_medians']:.3f}"
            if arm != "plain" else ""))
    print(f"parameters: max |arm − plain| = {doc['max_abs_diff']:.3g}; all-reduces seen by Comm per rank: "
          f"{per_rank[0]['all_reduces_seen']}")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
