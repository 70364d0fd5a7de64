"""What the backend `commprof profile` puts in front of every gloo group (commprof/intercept/seen.py) costs an
interposed op, and why a group's Comm calls gloo itself rather than the group.

One gloo rank, interposed as `profile` interposes a script; three groups of that rank, each with its
8-byte in-place `dist.all_reduce` (the op where a per-op cost shows most):
- without: a group made before the backend was installed, gloo's alone;
- seen: a group with the backend in front, as `profile` makes every group; its Comm calls gloo itself;
- through: the same, its Comm calling the group, so that each op passes through the Python backend.
Blocks of --iters ops, the three arms in each of their 6 orders in turn over --turns; per arm, the median
over turns of (arm − without) per op, with its 95 % CI (common.median_ci).

    python benchmarks/seen_backend.py [--quick] [--turns 60] [--iters 500] [--json PATH]

--quick: 6 turns of 20 ops, to see that it runs. Target: seen − without ≤ 0 µs (no cost an op).
Results: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

from common import median_ci, parse, parser, ranks

ARMS = ("without", "seen", "through")
QUICK = {"turns": 6, "iters": 20}
TIMEOUT_S = 600


def worker(turns: int, iters: int) -> None:
    import time

    import torch
    import torch.distributed as dist

    from commprof.comm.gloo_comm import GLOO_BEHIND
    from commprof.intercept import interpose, seen

    interposer = interpose.install()
    dist.init_process_group("gloo")
    groups = {"without": dist.new_group([0])}
    seen.install(interposer)
    groups["seen"], groups["through"] = dist.new_group([0]), dist.new_group([0])
    GLOO_BEHIND.pop(id(groups["through"]))  # its Comm calls the group: through the Python backend
    t = torch.ones(2)
    us: dict[str, list[float]] = {arm: [] for arm in ARMS}
    orders = list(itertools.permutations(ARMS))
    for turn in range(turns):
        for arm in orders[turn % len(orders)]:
            group = groups[arm]
            for _ in range(max(iters // 10, 1)):  # the group's caches warm
                dist.all_reduce(t, group=group)
            start = time.perf_counter_ns()
            for _ in range(iters):
                dist.all_reduce(t, group=group)
            us[arm].append((time.perf_counter_ns() - start) / iters / 1e3)
    assert t.tolist() == [1.0, 1.0]  # one rank: every all_reduce leaves it as it was
    seen.uninstall()
    dist.destroy_process_group()
    interpose.uninstall()
    print(json.dumps({"us": us}))


def main() -> None:
    p = parser(__doc__, json="seen-backend-results.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--turns", type=int, default=60)
    p.add_argument("--iters", type=int, default=500)
    args = parse(p, QUICK)
    if args.worker:
        worker(args.turns, args.iters)
        return
    if args.turns < 1 or args.iters < 1:
        p.error("--turns and --iters must be at least 1")
    out = ranks([sys.executable, __file__, "--worker", "--turns", str(args.turns), "--iters", str(args.iters)], 1,
                timeout_s=TIMEOUT_S, what="seen_backend")[0]
    us = json.loads(out.strip().splitlines()[-1])["us"]
    doc = {"turns": args.turns, "iters": args.iters,
           "without_us": statistics.median(us["without"]), "us": us}
    for arm in ARMS[1:]:
        extra = [a - b for a, b in zip(us[arm], us["without"])]
        doc[f"{arm}_minus_without_us"] = statistics.median(extra)
        doc[f"{arm}_minus_without_ci95_us"] = median_ci(extra)
        print(f"{arm}: {doc[f'{arm}_minus_without_us']:+.1f} µs an op (95 % CI "
              f"{doc[f'{arm}_minus_without_ci95_us'][0]:+.1f} … {doc[f'{arm}_minus_without_ci95_us'][1]:+.1f}) "
              f"against {doc['without_us']:.1f} µs without", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
