"""Where the time of one gloo all_reduce goes, layer by layer: torch's function, the bare ProcessGroup call,
Comm's backend method, Comm's whole op, the Interposer's, and Comm's path alone after a gloo call.

One process, a 1-rank gloo world (the op is local, so what differs is the path to it), in-place 8-byte
all_reduces. Each turn calls every arm once in a random order, each call timed alone with perf_counter_ns;
reported: each arm's median and the median over turns of (arm − torch's call). Run on a checkout from before
commprof/comm/gloo_comm.py existed it measures TorchComm, so the two can be set side by side.

  torch          `distributed_c10d.all_reduce(t)`, torch's own function
  pg             `pg.allreduce([t], opts).wait()`: the ProcessGroup call torch's function ends in
  backend        Comm's backend method (`comm._all_reduce`), what Comm times
  comm           `comm.all_reduce(t)`: the backend method inside Comm's path (label, ring, NVTX, log)
  interposer     the Interposer's `all_reduce`, what a script's `dist.all_reduce` becomes
  torch+path     torch's call, then Comm's whole path around a backend that does nothing: the path's
                 cost when it runs right after a blocking call, as it does between two ops
  path, hot      that path alone in a tight loop (a column of its own, not a turn)

    python benchmarks/gloo_layers.py [--quick] [--turns 3000] [--json PATH]

Each "− torch" comes with the 95 % CI of its median (benchmarks/common.py's median_ci). --quick: 50 turns;
seconds, to see that it runs.

Results: benchmarks/README.md.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from common import median_ci, parse, parser

QUICK = {"turns": 50}
"""--quick: 50 turns."""


def comm_over(c10d, recorder):
    """The world's Comm as `commprof` makes it for gloo."""
    import torch

    try:
        from commprof.comm.gloo_comm import comm_class
        cls = comm_class("gloo")
    except ImportError:  # a checkout from before GlooComm
        from commprof.comm.torch_comm import TorchComm as cls
    return cls(backend="gloo", group=None, ranks=[0], control_group=None, device=torch.device("cpu"),
               clock=recorder.clock, recorder=recorder)


def measure(turns: int) -> dict:
    import torch
    from torch.distributed import distributed_c10d as c10d

    from commprof.base.backends import free_port
    from commprof.intercept.interposer import Interposer
    from commprof.record.clock import CpuClock
    from commprof.record.recorder import OpRecorder

    torch.set_num_threads(1)
    port = free_port()
    c10d.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    t = torch.zeros(2)
    recorder, idle = OpRecorder(CpuClock()), OpRecorder(CpuClock())
    comm, noop = comm_over(c10d, recorder), comm_over(c10d, idle)
    noop._all_reduce = lambda tensor, op, output, async_op: None
    interposer = Interposer(recorder)
    interposer.adopt(comm)
    pg, opts = c10d._get_default_group(), c10d.AllreduceOptions()
    opts.reduceOp = c10d.ReduceOp.SUM

    def torch_then_path():
        c10d.all_reduce(t)
        noop.all_reduce(t)

    arms = {"torch": lambda: c10d.all_reduce(t), "pg": lambda: pg.allreduce([t], opts).wait(),
            "backend": lambda: comm._all_reduce(t, "sum", None, False), "comm": lambda: comm.all_reduce(t),
            "interposer": lambda: interposer.all_reduce(t), "torch+path": torch_then_path}
    now, rng = time.perf_counter_ns, random.Random(0)
    names = list(arms)
    for run in arms.values():  # first calls build caches and labels
        run()
    out: dict[str, list[int]] = {arm: [] for arm in arms}
    for _ in range(turns):
        rng.shuffle(names)
        for arm in names:
            t0 = now()
            arms[arm]()
            out[arm].append(now() - t0)
        recorder.clear()
        idle.clear()
    hot = []
    for _ in range(20):
        t0 = now()
        for _ in range(200):
            noop.all_reduce(t)
        hot.append((now() - t0) / 200)
        idle.clear()
    c10d.destroy_process_group()
    torch_ns = out["torch"]
    return {"turns": turns, "torch_us": statistics.median(torch_ns) / 1e3,
            "arms": {arm: {"median_us": statistics.median(v) / 1e3,
                           "minus_torch_us": statistics.median(a - b for a, b in zip(v, torch_ns)) / 1e3,
                           "minus_torch_ci95_us": [d / 1e3 for d in median_ci([a - b for a, b in zip(v, torch_ns)])]}
                     for arm, v in out.items() if arm != "torch"},
            "path_hot_us": statistics.median(hot) / 1e3}


def main() -> None:
    p = parser(__doc__, json="gloo-layers-results.json")
    p.add_argument("--turns", type=int, default=3000)
    args = parse(p, QUICK)
    result = measure(args.turns)
    print(f"torch's call: {result['torch_us']:.2f} µs (median of {args.turns} turns)")
    print("| arm | µs/op | − torch, turn by turn (µs) | 95 % CI |")
    print("| --- | ---: | ---: | ---: |")
    for arm, r in result["arms"].items():
        lo, hi = r["minus_torch_ci95_us"]
        print(f"| {arm} | {r['median_us']:.2f} | {r['minus_torch_us']:+.2f} | {lo:+.2f} … {hi:+.2f} |")
    print(f"| path, hot | {result['path_hot_us']:.2f} | | |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    sys.stdout.flush()  # os._exit does not
    os._exit(0)  # gloo's threads outlive destroy_process_group (see commprof.comm.end_process)


if __name__ == "__main__":
    main()
