"""What the interception layer costs a training step, measured inside one profiled job: the run-to-run noise
of whole launches (±7 % between launches of the same plain script on this VM) is larger than the cost
profile_cost.py looks for, and steps side by side in one process do not carry it.

One `commprof profile` job of 2 gloo ranks trains two copies of profile_cost.py's fsdp2_units workload (PyTorch's
FSDP2 example's shape: 10 per-block units, prefetch, Adam, clip), each on its own process group. Blocks of
--block steps alternate between
- on: the copy whose group was made with commprof's backend in front of gloo (intercept/seen.py), with
  torch.distributed's names routed through Comm (interpose.py) and the module, optimizer and autograd hooks in
  place (record/hooks.py) — what every step of a profiled script pays;
- off: the copy on a group made without it, the names torch's own, the hooks removed — a plain step, in the
  same process.
A second kind of job, A/A, alternates the same way with nothing switched (both copies on plain groups): the
comparison's own noise, place in the job and model copy included. The first step of each block is left out;
each block's median step is divided by the median of the next block of the other arm; the result is the median
of those ratios over every job, with its 95 % CI (common.median_ci). What stays on in both arms: the trace and
NVTX ranges of the job, its watchdog, and the functional collectives' kernels (clip's one all_reduce).

--clock cpu times each step by the training thread's CPU time (`time.thread_time`) instead of the wall clock:
what the layer adds to the work of a step, apart from what it makes the thread wait.

Then, unless --quick, what one op costs through the layer (--ops blocks of --reps iterations, one job): on one
plain group, blocks alternate torch.distributed's names routed through Comm and torch's own, for
- p2p: a round trip of one 8 KiB message each way, `batch_isend_irecv` of one P2POp and its wait, as
  torch.distributed.pipelining sends each micro-batch's activations and gradients;
- async: 3 async all_gathers of 4 KiB shards and a reduce_scatter, 20 small matmuls after each issue, then the
  waits, as FSDP2 prefetches its units;
each as µs of wall and of the thread's CPU per iteration, on ÷ off. And the p2p round trip layer by layer, the
arms in turn in each block: gloo's own calls on the group, through its Comm, with the Work around the Handle,
through the interposed batch_isend_irecv, routed as a script calls it, torch's own (p2p_layers).

    python benchmarks/interception_cost.py [--quick] [--jobs 3] [--steps 160] [--block 5] [--clock wall|cpu]
                                           [--ops 40] [--reps 50]

Results: benchmarks/README.md, benchmarks/results/interception-cost-results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from common import fsdp2_units, job, median_ci, parse, parser, with_root

QUICK = {"jobs": 1, "steps": 8, "block": 2}
KINDS = ("interception", "A/A")
RUN_TIMEOUT_S = 900


def plain_group():
    """A group made as torch makes it, without commprof's backend in front of gloo."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from commprof.intercept import seen

    made_seen = c10d._new_process_group_helper
    c10d._new_process_group_helper = seen._SAVED["helper"]
    try:
        return dist.new_group(backend="gloo")
    finally:
        c10d._new_process_group_helper = made_seen


def script(kind: str, steps: int, block: int, clock: str) -> None:
    """One rank of a job (run under `commprof profile`): prints rank 0's per-block pair ratios as JSON."""
    import time

    import torch
    import torch.distributed as dist
    import torch.distributed.fsdp as fsdp
    from torch.distributed.device_mesh import DeviceMesh

    from commprof.intercept import interpose
    from commprof.record import hooks

    dist.init_process_group("gloo")
    now = time.thread_time if clock == "cpu" else time.perf_counter
    plain = plain_group()
    other = plain_group() if kind == "A/A" else dist.new_group(backend="gloo")

    def copy(group):
        mesh, shard = DeviceMesh.from_group(group, "cpu"), fsdp.fully_shard
        fsdp.fully_shard = lambda module, **kw: shard(module, mesh=mesh, **kw)
        torch.manual_seed(0)
        try:
            return fsdp2_units(None, torch.device("cpu"))[0]
        finally:
            fsdp.fully_shard = shard

    steps_of = {"on": copy(other), "off": copy(plain)}
    tracker, backward = hooks.ACTIVE, torch.autograd.backward

    def switch(arm: str) -> None:
        if kind == "A/A":
            return
        if arm == "off":
            interpose._hide()
            for handle in tracker._handles:
                handle.remove()
            torch.autograd.backward = backward.__wrapped__
        else:
            interpose._show()
            tracker.install()
            torch.autograd.backward = backward

    blocks: list[tuple[str, list[float]]] = []
    for i in range(steps):
        arm = "off" if (i // block) % 2 else "on"
        if i % block == 0:
            switch(arm)
            blocks.append((arm, []))
        start = now()
        steps_of[arm]()
        if i % block:  # the block's first step pays for the switch
            blocks[-1][1].append((now() - start) * 1e3)
    switch("on")
    medians = [(arm, statistics.median(ms)) for arm, ms in blocks[1:] if ms]  # the first block warms up
    ratios = [(a[1] / b[1]) if a[0] == "on" else (b[1] / a[1]) for a, b in zip(medians, medians[1:])]
    if dist.get_rank() == 0:
        print(json.dumps({"ratios": ratios, "on_ms": statistics.median(m for a, m in medians if a == "on"),
                          "off_ms": statistics.median(m for a, m in medians if a == "off")}), flush=True)
    dist.destroy_process_group()


def ops_script(blocks: int, reps: int) -> None:
    """One rank of the --ops job: prints rank 0's per-loop figures as JSON."""
    import time

    import torch
    import torch.distributed as dist

    from commprof.intercept import interpose

    dist.init_process_group("gloo")
    group, rank = plain_group(), dist.get_rank()
    peer = 1 - rank
    message, shard, full, a = torch.zeros(2048), torch.randn(1024), torch.empty(2048), torch.randn(64, 64)

    def send_receive(kind) -> None:
        for work in dist.batch_isend_irecv([dist.P2POp(kind, message, peer, group)]):
            work.wait()

    def p2p() -> None:
        for kind in (dist.isend, dist.irecv) if rank == 0 else (dist.irecv, dist.isend):
            send_receive(kind)

    def async_ops() -> None:
        works = [dist.all_gather_into_tensor(full, shard, group=group, async_op=True) for _ in range(3)]
        for _ in range(20):
            a @ a
        for work in works:
            work.wait()
        work = dist.reduce_scatter_tensor(shard, full, group=group, async_op=True)
        for _ in range(20):
            a @ a
        work.wait()

    out = {}
    for name, loop in (("p2p", p2p), ("async", async_ops)):
        got = {"on": [], "off": []}
        for b in range(blocks):
            arm = "off" if b % 2 else "on"
            (interpose._hide if arm == "off" else interpose._show)()
            loop()  # after the switch
            wall, cpu = time.perf_counter(), time.thread_time()
            for _ in range(reps):
                loop()
            got[arm].append(((time.perf_counter() - wall) / reps * 1e6, (time.thread_time() - cpu) / reps * 1e6))
        interpose._show()
        pairs = list(zip(got["on"], got["off"]))
        out[name] = {f"{what}_{arm}_us": statistics.median(x[i] for x in got[arm])
                     for i, what in enumerate(("wall", "cpu")) for arm in ("on", "off")}
        out[name].update({f"{what}_ratios": [on[i] / off[i] for on, off in pairs]
                          for i, what in enumerate(("wall", "cpu"))})
    out["p2p_layers"] = p2p_layers(group, peer, message, blocks, reps)
    if rank == 0:
        print(json.dumps({"ops": out}), flush=True)
    dist.destroy_process_group()


def p2p_layers(group, peer: int, message, blocks: int, reps: int) -> dict:
    """The p2p round trip's cost layer by layer, each arm in turn (the order reversed every other block):
    gloo's own send, recv and wait called on the group (no Python layer); through its Comm (isend, irecv and
    the Handle's wait); with the Work torch's callers get around the Handle; through the interposed
    `batch_isend_irecv` of a P2POp built beforehand; routed as a script calls it (a P2POp built per message);
    torch's own functions. -> {layer: {"wall_us", "cpu_us"}}: medians over blocks, per round trip."""
    import statistics
    import time

    import torch.distributed as dist

    from commprof.intercept import interpose
    from commprof.intercept.work import Work

    rank = dist.get_rank()
    sends = (True, False) if rank == 0 else (False, True)
    comm = interpose._ACTIVE.comm(group)
    built = [[dist.P2POp(dist.isend if send else dist.irecv, message, peer, group)] for send in sends]

    def backend() -> None:
        for send in sends:
            (group.send if send else group.recv)([message], peer, 0).wait()

    def through_comm() -> None:
        for send in sends:
            (comm.isend(message, dst=peer) if send else comm.irecv(message, src=peer)).wait()

    def with_work() -> None:
        for send in sends:
            Work(comm.isend(message, dst=peer) if send else comm.irecv(message, src=peer)).wait()

    def batched() -> None:
        for ops in built:
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    def routed() -> None:
        for send in sends:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend if send else dist.irecv, message, peer, group)]):
                work.wait()

    arms = {"backend": backend, "comm": through_comm, "comm_work": with_work, "batch_isend_irecv": batched,
            "routed": routed, "own": routed}
    got: dict = {name: [] for name in arms}
    for b in range(blocks):
        for name in list(arms) if b % 2 == 0 else list(arms)[::-1]:
            (interpose._hide if name == "own" else interpose._show)()
            arms[name]()  # after the switch
            wall, cpu = time.perf_counter(), time.thread_time()
            for _ in range(reps):
                arms[name]()
            got[name].append(((time.perf_counter() - wall) / reps * 1e6, (time.thread_time() - cpu) / reps * 1e6))
    interpose._show()
    return {name: {"wall_us": statistics.median(x[0] for x in v), "cpu_us": statistics.median(x[1] for x in v)}
            for name, v in got.items()}


def run(argv: list[str], what: str, prefix: str) -> dict:
    env = with_root({**os.environ, "OMP_NUM_THREADS": "1"})
    out = job([sys.executable, "-m", "commprof", "profile", "--nproc", "2", "--", __file__, *argv], env=env,
              timeout_s=RUN_TIMEOUT_S, what=f"interception_cost: {what}")
    return next(json.loads(line) for line in out.splitlines() if line.startswith(prefix))


def main() -> None:
    p = parser(__doc__, json="interception-cost-results.json")
    p.add_argument("--script", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--jobs", type=int, default=3, help="jobs of each kind, taken in turn (default 3)")
    p.add_argument("--steps", type=int, default=160, help="steps per job (default 160)")
    p.add_argument("--block", type=int, default=5, help="steps per block (default 5)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="time a step by the wall clock or by the training thread's CPU time (default wall)")
    p.add_argument("--ops", type=int, default=40, help="blocks of each op loop, on and off in turn (default 40)")
    p.add_argument("--reps", type=int, default=50, help="iterations of an op loop per block (default 50)")
    p.add_argument("--ops-script", action="store_true", help=argparse.SUPPRESS)
    args = parse(p, QUICK)
    if args.block < 2 or args.steps < 4 * args.block:
        p.error("--block must be at least 2 and --steps at least 4 blocks")
    if args.script:
        script(args.script, args.steps, args.block, args.clock)
        return
    if args.ops_script:
        ops_script(args.ops, args.reps)
        return
    kinds = KINDS[:1] if args.quick else KINDS  # --quick: that it runs, one job
    got = {kind: [] for kind in kinds}
    for j in range(args.jobs):
        for kind in kinds if j % 2 == 0 else kinds[::-1]:
            got[kind].append(run(["--script", kind, "--steps", str(args.steps), "--block", str(args.block),
                                  "--clock", args.clock], kind, '{"ratios"'))
    rows = []
    for kind in kinds:
        ratios = [r for x in got[kind] for r in x["ratios"]]
        low, high = median_ci(ratios)
        rows.append({"kind": kind, "ratio": statistics.median(ratios), "ci95": [low, high], "pairs": len(ratios),
                     "on_ms": [x["on_ms"] for x in got[kind]], "off_ms": [x["off_ms"] for x in got[kind]]})
        print(f"{kind}: on ÷ off {rows[-1]['ratio']:.3f} ({low:.3f} … {high:.3f}) over {len(ratios)} block pairs; "
              f"off step {statistics.median(rows[-1]['off_ms']):.1f} {'CPU ' if args.clock == 'cpu' else ''}ms",
              flush=True)
    ops = {}
    if not args.quick:  # --quick: the step's job alone
        ops = run(["--ops-script", "--ops", str(args.ops), "--reps", str(args.reps)], "ops", '{"ops"')["ops"]
        layers = ops.pop("p2p_layers")
        for name, row in ops.items():
            for what in ("wall", "cpu"):
                row[f"{what}_ratio"], row[f"{what}_ci95"] = statistics.median(row[f"{what}_ratios"]), \
                    list(median_ci(row[f"{what}_ratios"]))
                print(f"{name}: {what} {row[f'{what}_on_us']:.1f} µs an iteration routed, {row[f'{what}_off_us']:.1f} "
                      f"torch's own: on ÷ off {row[f'{what}_ratio']:.3f} ({row[f'{what}_ci95'][0]:.3f} … "
                      f"{row[f'{what}_ci95'][1]:.3f})", flush=True)
        for name, row in layers.items():
            print(f"p2p round trip, {name}: {row['wall_us']:.1f} µs wall, {row['cpu_us']:.1f} µs thread CPU "
                  f"({row['cpu_us'] - layers['backend']['cpu_us']:+.1f} over gloo's own calls)", flush=True)
        ops["p2p_layers"] = layers
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "ops": ops, "jobs": args.jobs, "steps": args.steps,
                                               "block": args.block, "clock": args.clock}, indent=1) + "\n")


if __name__ == "__main__":
    main()
