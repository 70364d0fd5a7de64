"""What `commprof profile` costs a real training step: PyTorch's own DistributedDataParallel on ResNet-18
(torchvision, CIFAR-10-sized synthetic batches of 32 per rank, SGD), 2 gloo ranks, the whole step as the
script times it — unprofiled (ranks started with torchrun's variables) against `commprof profile` (every
bucket through Comm by the reducer's own process group, BatchNorm's buffers through Comm, module/optimizer/
autograd hooks, NVTX), and against `commprof profile --no-ddp-reducer` (the buckets left to DDP's C++ path,
the rest as before).

Rounds alternate which goes first; each run's figure is the median of its steps after the warm-up (the
first 5, --warmup); the ratio is profiled/unprofiled per round, and its median over rounds is the
result, with its 95 % CI (benchmarks/common.py's median_ci).

    python benchmarks/ddp_profiled.py [--quick] [--rounds 7] [--steps 30] [--warmup 5] [--model resnet18]
                                      [--json PATH]

--quick: one round of 2 steps after 1 of warm-up, on a small CNN (--model small: two convolutions with
BatchNorm, no torchvision); seconds, to see that it runs.

Target: ≤ 1.02. Results: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from common import image_model, job, median_ci, order, parse, parser, ranks, with_root

TARGET = 1.02
WARMUP = 5
QUICK = {"rounds": 1, "steps": 2, "warmup": 1, "model": "small"}
"""--quick: one round of 2 steps after 1 of warm-up, on a small CNN."""
RUN_TIMEOUT_S = 1200


def script(steps: int, warmup: int, model_name: str) -> None:
    """One rank's training: prints its median step time (ms) after the warm-up as a JSON line."""
    import gc
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(image_model(model_name))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - start) * 1e3)
    if dist.get_rank() == 0:
        print(json.dumps({"step_ms": statistics.median(times[warmup:])}), flush=True)
    # DDP's reducer, kept alive by a reference cycle, holds the process group: left to interpreter exit,
    # gloo's threads abort the process (1 exit in 4 on torch 2.14). Free it while the process is whole.
    del model, opt, loss
    gc.collect()
    dist.destroy_process_group()


ARMS = {"plain": None, "profiled": [], "profiled --no-ddp-reducer": ["--no-ddp-reducer"]}
"""Each arm: None for the unprofiled script, else the `commprof profile` flags it runs with."""


def run(arm: str, steps: int, warmup: int, model: str) -> float:
    env = with_root({**os.environ, "OMP_NUM_THREADS": "1"})
    env.pop("THP_MEM_ALLOC_ENABLE", None)  # the same allocator in every arm
    args = [__file__, "--script", "--steps", str(steps), "--warmup", str(warmup), "--model", model]
    what = f"ddp_profiled: {arm}"
    if ARMS[arm] is not None:
        outs = [job([sys.executable, "-m", "commprof", "profile", "--nproc", "2", *ARMS[arm], "--", *args], env=env,
                    timeout_s=RUN_TIMEOUT_S, what=what)]
    else:
        outs = ranks([sys.executable, *args], 2, env=env, timeout_s=RUN_TIMEOUT_S, what=what)
    line = next(line for out in outs for line in out.splitlines() if line.startswith('{"step_ms"'))
    return json.loads(line)["step_ms"]


def main() -> None:
    p = parser(__doc__, json="ddp-profiled-results.json")
    p.add_argument("--script", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=WARMUP, help=f"untimed steps first, of --steps (default {WARMUP})")
    p.add_argument("--model", choices=("resnet18", "small"), default="resnet18",
                   help="torchvision's ResNet-18 (default), or a small CNN")
    args = parse(p, QUICK)
    if args.script:
        script(args.steps, args.warmup, args.model)
        return
    if args.rounds < 1 or not 0 <= args.warmup < args.steps:
        p.error("--rounds must be at least 1, and --steps more than --warmup")
    rounds = []
    for r in range(args.rounds):
        got = {arm: run(arm, args.steps, args.warmup, args.model) for arm in order(ARMS, r)}
        rounds.append({"ms": got, "ratio": {arm: got[arm] / got["plain"] for arm in ARMS if arm != "plain"}})
        print(f"round {r}: " + ", ".join(f"{arm} {got[arm]:.1f} ms" for arm in ARMS), flush=True)
    profiled = [arm for arm in ARMS if arm != "plain"]
    doc = {"ms": {arm: statistics.median(x["ms"][arm] for x in rounds) for arm in ARMS},
           "ratio": {arm: statistics.median(x["ratio"][arm] for x in rounds) for arm in profiled},
           "ratio_ci95": {arm: median_ci([x["ratio"][arm] for x in rounds]) for arm in profiled},
           "rounds": rounds, "target": TARGET, "model": args.model, "steps": args.steps, "warmup": args.warmup}
    for arm, ratio in doc["ratio"].items():
        lo, hi = doc["ratio_ci95"][arm]
        print(f"{arm} / plain: median ratio {ratio:.3f} (95 % CI {lo:.3f} … {hi:.3f}; target ≤ {TARGET})")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
