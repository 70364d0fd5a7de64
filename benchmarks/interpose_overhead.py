"""What interposition costs per op: a script's `dist.all_reduce` routed through Comm (commprof/comm/
interpose.py: the wrapper, the group's Comm, Comm's timing, NVTX and op log) against torch's own
`distributed_c10d.all_reduce` (as commprof/comm/torch_own.py keeps it), side by side in the same processes.

Every rank runs both in alternating blocks of N in-place 8-byte all_reduces (the op where the cost shows
most; rounds alternate which goes first), each block timed as a whole after a barrier; extra = the median
over rounds of (interposed block − torch block). A gloo op's own time moves by several µs from block to
block, more than the cost sought, so the path is also timed alone: the same interposed calls with the
backend's op replaced by nothing — the wrapper, the group's Comm, Comm's stamps, NVTX range and log entry.
A 1-rank gloo world isolates the per-op cost (the op is local); 2 ranks show it beside a real exchange. Ranks are
started as torchrun starts them, and by mpiexec (`--launcher mpi`): a script's process group is gloo
either way (PyPI's torch has no MPI backend), so the MPI rows say what the cost is on ranks mpiexec starts.
Then turn by turn (rounds × iters / 10 turns): each turn calls torch's, the interposed, a control — torch's
call followed by the path's time in busy Python —, Comm's own all_reduce (commprof/comm/gloo_comm.py: the
ProcessGroup's method called directly) and that bare ProcessGroup call, once each, in the 120 orders in
sequence, every call timed alone; the median over turns of (arm − torch) and its 95 % CI. Neighbouring calls
share the machine's moment, which blocks do not; the control tells the path's own time between calls from a
cost inside the call, and the ProcessGroup arm shows what torch's Python layer costs on its own.

    python benchmarks/interpose_overhead.py [--quick] [--rounds 101] [--iters 200] [--nproc 1,2]
                                            [--launchers gloo,mpi] [--json PATH]

The CIs are benchmarks/common.py's median_ci. --quick: 1 rank under each launcher, 2 rounds of 20 ops;
seconds, to see that it runs.

Target: ≤ 2 µs per op, as Comm's own. Results: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from common import job, median_ci, order, parse, parser, ranks, with_root

TARGET_US = 2.0
TURN_ARMS = ("interposed", "control", "comm", "process group")
"""The turn-by-turn arms set against torch's own call."""
QUICK = {"rounds": 2, "iters": 20, "nproc": "1"}
"""--quick: 1 rank under each launcher, 2 rounds of 20 ops (4 turns)."""
TIMEOUT_S = 1200


def worker(rounds: int, iters: int) -> None:
    import time

    import torch
    import torch.distributed as dist

    from commprof.comm.torch_own import c10d  # torch's own functions, whatever install() rebinds
    from commprof.intercept import interpose
    from commprof.record.clock import CpuClock
    from commprof.record.recorder import OpRecorder

    if "RANK" not in os.environ:  # mpiexec's variables
        os.environ.update(RANK=os.environ["PMI_RANK"], WORLD_SIZE=os.environ["PMI_SIZE"])
    torch.set_num_threads(1)
    c10d.init_process_group("gloo")
    t = torch.zeros(2)
    recorder = OpRecorder(CpuClock())
    per_op: dict[str, list[float]] = {"torch": [], "interposed": []}
    for r in range(rounds + 1):  # round 0 warms both paths up and is not kept
        for mode in order(("torch", "interposed"), r):
            if mode == "interposed":
                interpose.install(recorder)
            call = dist.all_reduce
            c10d.barrier()
            start = time.perf_counter_ns()
            for _ in range(iters):
                call(t)
            elapsed = time.perf_counter_ns() - start
            if mode == "interposed":
                interpose.uninstall()
                assert len(recorder.ops) == iters, "every interposed call is in the op log"
                recorder.clear()
            if r:
                per_op[mode].append(elapsed / iters / 1e3)
    # the Python path alone: the same calls with the backend's op replaced by nothing, per rank, no exchange
    from commprof.comm.gloo_comm import GlooComm

    interpose.install(recorder)
    backend_op = GlooComm._all_reduce
    GlooComm._all_reduce = lambda self, tensor, op, output, async_op: None
    path = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(iters):
            dist.all_reduce(t)
        path.append((time.perf_counter_ns() - start) / iters / 1e3)
        recorder.clear()
    GlooComm._all_reduce = backend_op
    per_op["python_path"] = path
    per_op["turns"] = turns(statistics.median(path) * 1e3, rounds * iters // 10)
    interpose.uninstall()
    if c10d.get_rank() == 0:
        print(json.dumps(per_op), flush=True)
    c10d.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads outlive destroy_process_group (see commprof.comm.end_process)


def turns(path_ns: float, count: int) -> dict[str, list[float]]:
    """Call by call, inside one loop: torch's own all_reduce, the interposed one (torch.distributed is
    interposed; torch_own's are torch's), a control — torch's call followed by `path_ns` of busy
    Python, what the interposition's own time does to the next call —, the world Comm's all_reduce and the
    bare ProcessGroup call. Each turn runs every arm once, the orders in sequence (the same on every rank);
    each call timed alone. Returns each arm's per-call µs."""
    import itertools
    import time

    import torch
    import torch.distributed as dist

    from commprof.comm.torch_own import c10d  # torch's own functions, whatever install() rebinds
    from commprof.intercept import interpose

    t, now = torch.zeros(2), time.perf_counter_ns

    def control():
        c10d.all_reduce(t)
        end = now() + path_ns
        while now() < end:
            pass

    comm = interpose._ACTIVE.comm(None)
    pg, opts = c10d._get_default_group(), c10d.AllreduceOptions()
    opts.reduceOp, opts.asyncOp = c10d.ReduceOp.SUM, False
    arms = {"torch": lambda: c10d.all_reduce(t), "interposed": lambda: dist.all_reduce(t), "control": control,
            "comm": lambda: comm.all_reduce(t), "process group": lambda: pg.allreduce([t], opts).wait()}
    orders = list(itertools.permutations(arms))
    out: dict[str, list[float]] = {arm: [] for arm in arms}
    c10d.barrier()
    for i in range(count):
        for arm in orders[i % len(orders)]:
            t0 = now()
            arms[arm]()
            out[arm].append((now() - t0 - (path_ns if arm == "control" else 0)) / 1e3)
    return out


def measure(launcher: str, nproc: int, rounds: int, iters: int) -> dict:
    from commprof.base.backends import free_port
    from commprof.launcher.launch import find_mpiexec

    env = with_root({**os.environ, "OMP_NUM_THREADS": "1"})
    command = [sys.executable, __file__, "--worker", "--rounds", str(rounds), "--iters", str(iters)]
    what = f"interpose_overhead: {launcher} × {nproc}"
    if launcher == "mpi":
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(nproc))
        outs = [job([find_mpiexec(), "-n", str(nproc), *command], env=env, timeout_s=TIMEOUT_S, what=what)]
    else:
        outs = ranks(command, nproc, env=env, timeout_s=TIMEOUT_S, what=what)
    per_op = json.loads(next(line for out in outs for line in out.splitlines() if line.startswith("{")))
    extra = [i - t for i, t in zip(per_op["interposed"], per_op["torch"])]
    by_turn = per_op["turns"]
    turn = {arm: [a - b for a, b in zip(by_turn[arm], by_turn["torch"])] for arm in TURN_ARMS}
    return {"launcher": launcher, "nproc": nproc, "rounds": rounds, "iters": iters,
            "torch_us": statistics.median(per_op["torch"]), "interposed_us": statistics.median(per_op["interposed"]),
            "extra_us": statistics.median(extra), "extra_ci_us": median_ci(extra), "extra_us_per_round": extra,
            "python_path_us": statistics.median(per_op["python_path"]), "target_us": TARGET_US,
            "turns": len(by_turn["torch"]), "turn_torch_us": statistics.median(by_turn["torch"]),
            **{f"turn_{arm}_extra_us": statistics.median(d) for arm, d in turn.items()},
            **{f"turn_{arm}_extra_ci_us": median_ci(d) for arm, d in turn.items()}}


def main() -> None:
    p = parser(__doc__, json="interpose-overhead-results.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=101)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--nproc", default="1,2")
    p.add_argument("--launchers", default="gloo,mpi")
    args = parse(p, QUICK)
    if args.worker:
        worker(args.rounds, args.iters)
        return
    rows = [measure(launcher, int(n), args.rounds, args.iters)
            for launcher in args.launchers.split(",") for n in args.nproc.split(",")]
    print("| launcher | ranks | torch (µs/op) | interposed (µs/op) | extra (µs/op, median of paired blocks) | "
          + " | ".join(f"{arm} − torch, turn by turn (µs, 95 % CI)" for arm in TURN_ARMS)
          + " | wrapper + Comm alone, hot (µs/op) | target |")
    print("| --- " * (7 + len(TURN_ARMS)) + "|")

    def ci(r, arm):
        lo, hi = r[f"turn_{arm}_extra_ci_us"]
        return f"{r[f'turn_{arm}_extra_us']:+.2f} [{lo:+.2f}, {hi:+.2f}]"

    for r in rows:
        print(f"| {r['launcher']} | {r['nproc']} | {r['torch_us']:.2f} | {r['interposed_us']:.2f} | "
              f"{r['extra_us']:+.2f} | " + " | ".join(ci(r, arm) for arm in TURN_ARMS)
              + f" | {r['python_path_us']:.2f} | ≤ {TARGET_US:g} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
