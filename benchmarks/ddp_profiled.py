"""What `commprof profile` costs a real training step: PyTorch's own DistributedDataParallel on ResNet-18
(torchvision, CIFAR-10-sized synthetic batches of 32 per rank, SGD), 2 gloo ranks, the whole step as the
script times it — unprofiled (ranks started with torchrun's variables) against `commprof profile` (every
bucket through Comm by the reducer's own process group, BatchNorm's buffers through Comm, module/optimizer/
autograd hooks, NVTX), and against `commprof profile --no-ddp-reducer` (the buckets left to DDP's C++ path,
the rest as before).

Rounds alternate which goes first; each run's figure is the median of its steps after the warm-up; the
ratio is profiled/unprofiled per round, and its median over rounds is the result.

    python benchmarks/ddp_profiled.py [--rounds 7] [--steps 30] [--json PATH]

Target: ≤ 1.02. Results: README, "Benchmarks: what profiling a script costs".
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

TARGET = 1.02
ROOT = Path(__file__).resolve().parent.parent
WARMUP = 5


def script(steps: int) -> None:
    """One rank's training: prints its median step time (ms) after the warm-up as a JSON line."""
    import time

    import torch
    import torch.distributed as dist
    import torchvision
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torchvision.models.resnet18(num_classes=10))
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
        print(json.dumps({"step_ms": statistics.median(times[WARMUP:])}), flush=True)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ARMS = {"plain": None, "profiled": [], "profiled --no-ddp-reducer": ["--no-ddp-reducer"]}
"""Each arm: None for the unprofiled script, else the `commprof profile` flags it runs with."""


def run(arm: str, steps: int) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("THP_MEM_ALLOC_ENABLE", None)  # the same allocator in every arm
    args = [__file__, "--script", "--steps", str(steps)]
    if ARMS[arm] is not None:
        procs = [subprocess.Popen([sys.executable, "-m", "commprof", "profile", "--nproc", "2", *ARMS[arm], "--",
                                   *args], env=env, stdout=subprocess.PIPE, text=True)]
    else:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2")
        procs = [subprocess.Popen([sys.executable, *args], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                  stdout=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=1200)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("a run failed")
    return json.loads(next(line for out in outs for line in out.splitlines() if line.startswith('{"step_ms"')))["step_ms"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--script", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "ddp-profiled-results.json"))
    args = p.parse_args()
    if args.script:
        script(args.steps)
        return
    rounds = []
    for r in range(args.rounds):
        order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
        got = {arm: run(arm, args.steps) for arm in order}
        rounds.append({"ms": got, "ratio": {arm: got[arm] / got["plain"] for arm in ARMS if arm != "plain"}})
        print(f"round {r}: " + ", ".join(f"{arm} {got[arm]:.1f} ms" for arm in ARMS), flush=True)
    doc = {"ms": {arm: statistics.median(x["ms"][arm] for x in rounds) for arm in ARMS},
           "ratio": {arm: statistics.median(x["ratio"][arm] for x in rounds) for arm in ARMS if arm != "plain"},
           "rounds": rounds, "target": TARGET, "steps": args.steps, "warmup": WARMUP}
    for arm, ratio in doc["ratio"].items():
        print(f"{arm} / plain: median ratio {ratio:.3f} (target ≤ {TARGET})")
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
