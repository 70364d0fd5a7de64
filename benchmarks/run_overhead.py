"""What phase recording costs a training step: `ddp` with commprof's Phases against a do-nothing stand-in.

One `ddp` strategy per rank (ResNet-18 on 3×32×32 synthetic images, 32 per rank by default; 2 ranks,
gloo, one intra-op thread each, as `commprof run --nproc 2` gives them on 2 cores) trains on the same
pre-built batches under two kinds of phase object, alternating R rounds of S steps each:

  on    commprof.record.phases.Phases, as `commprof run` uses it: an NVTX range per iteration and
        per phase, two clock stamps per phase, and at the end of each iteration the compute/comm
        breakdown (Phases.end) and the op volume (step_volume) from the op log;
  off   NoPhases below: begin/end do nothing, phase() hands back a nullcontext, nothing is computed.

Each step is timed from outside everything, `t0 = perf_counter_ns(); begin; train_step; end; …`, so a
step's time is its wall clock. Both sides call the same strategy.train_step on the same model and data.
Comm logs every op in both (one tuple appended per op, and its NVTX push/pop): that is Comm's cost,
always paid, and not what is measured here. Each side starts after a barrier, the order flipping every
round; per round, the median step time of each rank is averaged over ranks.

    python benchmarks/run_overhead.py [--quick] [--model resnet18] [--batch 32] [--steps 24] [--rounds 10]
                                      [--warmup 3] [--json PATH]

--quick: mnist-cnn, 8 per rank, 2 rounds of 2 steps; a few seconds, to see that it runs.

Reading the table: one row per round, then the medians over rounds. ratio = on / off (1.00 = recording
costs nothing), with the 95 % CI of its median (benchmarks/common.py's ratio_ci); the verdict compares
the median ratio with the target, ≤ 1.02. Rounds differ by a few percent on a shared 2-core machine (an
on/off run with NoPhases on both sides spreads about as much), so the spread of the per-round ratios says
how far to trust the median. The line under the table
resolves what the rounds cannot: recording's own time per step, one real step's phases and op log
replayed 2000 times through Phases (breakdown and volume included) minus the same through NoPhases.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from common import (
    NPROC,
    env_record,
    interleaved,
    make_batches,
    parse,
    ratio_ci,
    spawn_ranks,
    training_argv,
    training_parser,
)

RATIO_TARGET = 1.02
QUICK = {"model": "mnist-cnn", "batch": 8, "steps": 2, "rounds": 2, "warmup": 1}
"""--quick: the smallest model, two rounds (one each way) of two steps."""


class NoPhases:
    """A phase recorder that records nothing: the baseline a step without commprof's timing would be."""

    def __init__(self) -> None:
        self._null = nullcontext()

    def begin(self, index: int) -> None:
        pass

    def phase(self, name: str):
        return self._null

    def end(self) -> None:
        return None


# ---- a worker: one rank --------------------------------------------------------------------------
def worker(args) -> None:
    import torch

    from commprof.base.world import discover
    from commprof.comm import end_process, init_comm
    from commprof.record.phases import Phases
    from commprof.record.volume import step_volume
    from commprof.run.config import RunConfig
    from commprof.run.loop import build
    from commprof.strategies import STRATEGIES

    torch.set_num_threads(1)
    comm = init_comm(discover(), backend="gloo", timeout_s=300)
    cfg = RunConfig(strategy="ddp", model=args.model, backend="gloo", batch_size=args.batch, steps=args.steps)
    source, spec = build(cfg)
    strategy = STRATEGIES["ddp"](spec=spec, comm=comm, config=cfg)
    batches = make_batches(source, rank=comm.rank, world_size=comm.world_size, batch=args.batch, steps=args.steps)
    recorder, now = comm.recorder, time.perf_counter_ns
    spec.module.train()

    def on(n: int) -> list[int]:
        phases, times = Phases(recorder), []
        for i in range(n):
            t0 = now()
            phases.begin(i)
            strategy.train_step([batches[i]], phases)
            phases.end()
            step_volume(phases.ops())
            recorder.clear()
            times.append(now() - t0)
        return times

    def off(n: int) -> list[int]:
        phases, times = NoPhases(), []
        for i in range(n):
            t0 = now()
            phases.begin(i)
            strategy.train_step([batches[i]], phases)
            phases.end()
            recorder.clear()  # Comm logged the ops all the same; drop them as `on` does
            times.append(now() - t0)
        return times

    for side in (on, off):  # warm up: allocator, gloo connections, caches
        side(min(args.warmup, args.steps))
    sides = {"on": lambda: statistics.median(on(args.steps)) / 1e6,
             "off": lambda: statistics.median(off(args.steps)) / 1e6}
    rounds = [{"first": r["first"], "on_ms": r["on"], "off_ms": r["off"]}
              for r in interleaved(sides, args.rounds, before=comm.control_barrier)]
    cost_ns = recording_cost_ns(recorder, lambda phases: strategy.train_step([batches[0]], phases))
    gathered = comm.gather_object({"rounds": rounds, "recording_cost_ns": cost_ns}, dst=0)
    if comm.rank == 0:
        Path(args.out).write_text(json.dumps(gathered))
    comm.close()
    end_process(0)  # not the interpreter's exit: see commprof.comm.end_process


def recording_cost_ns(recorder, step, n: int = 2000) -> float:
    """Recording's own time per iteration, without the training around it: one real step's phases and
    op log replayed n times through Phases (with end's breakdown and the volume) and through NoPhases."""
    from commprof.record.phases import Phases
    from commprof.record.volume import step_volume

    recorder.clear()
    phases = Phases(recorder)
    phases.begin(0)
    step(phases)
    phases.end()
    names, ops, waits = [s[0] for s in phases.spans], list(recorder.ops), list(recorder.waits)
    recorder.clear()

    def replay(phases, volume: bool) -> float:
        start = time.perf_counter_ns()
        for i in range(n):
            phases.begin(i)
            for name in names:
                with phases.phase(name):
                    pass
            recorder.ops.extend(ops)  # what Comm logs during a step, in both
            recorder.waits.extend(waits)
            phases.end()
            if volume:
                step_volume(phases.ops())
            recorder.clear()
        return (time.perf_counter_ns() - start) / n

    replay(Phases(recorder), True)  # warm up
    return statistics.median(replay(Phases(recorder), True) - replay(NoPhases(), False) for _ in range(5))


def summarize(gathered: list[dict]) -> dict:
    """Average over ranks per round, ratio per round, medians over rounds."""
    per_rank, rounds = [g["rounds"] for g in gathered], []
    for i, first in enumerate(per_rank[0]):
        row = {"round": i + 1, "first": first["first"]}
        for k in ("on_ms", "off_ms"):
            row[k] = statistics.fmean(r[i][k] for r in per_rank)
        row["ratio"] = row["on_ms"] / row["off_ms"]
        rounds.append(row)
    ratios = [r["ratio"] for r in rounds]
    out = {"on_ms": statistics.median(r["on_ms"] for r in rounds),
           "off_ms": statistics.median(r["off_ms"] for r in rounds),
           "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
           "ratio_ci95": ratio_ci([r["on_ms"] for r in rounds], [r["off_ms"] for r in rounds])["ci95"],
           "per_rank_rounds": per_rank,
           "recording_cost_us": statistics.fmean(g["recording_cost_ns"] for g in gathered) / 1e3}
    out["recording_cost_fraction"] = out["recording_cost_us"] / 1e3 / out["off_ms"]
    out["verdict"] = "PASS" if out["ratio"] <= RATIO_TARGET else "FAIL"
    return {"per_round": rounds, "summary": out}


def print_table(result: dict, args) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"phase recording overhead: ddp {args.model}, batch {args.batch}/rank, {NPROC} ranks gloo, "
                        f"{args.steps} steps × {args.rounds} interleaved rounds",
                  caption="ms = median wall per step, mean over ranks; ratio = on / off")
    for name in ("round", "first", "off ms", "on ms", "ratio"):
        table.add_column(name, justify="left" if name == "first" else "right")
    for r in result["per_round"]:
        table.add_row(str(r["round"]), r["first"], f"{r['off_ms']:.1f}", f"{r['on_ms']:.1f}", f"{r['ratio']:.3f}")
    s = result["summary"]
    table.add_row("median", "", f"{s['off_ms']:.1f}", f"{s['on_ms']:.1f}", f"{s['ratio']:.3f}", end_section=True)
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    lo, hi = s["ratio_ci95"]
    print(f"ratio range over rounds {s['ratio_min']:.3f} … {s['ratio_max']:.3f}; "
          f"median {s['ratio']:.3f} (95 % CI {lo:.3f} … {hi:.3f}): {s['verdict']} (target ≤ {RATIO_TARGET:g})")
    print(f"recording alone (one step's phases and op log replayed, on − off): {s['recording_cost_us']:.1f} µs "
          f"per step = {100 * s['recording_cost_fraction']:.3f}% of an off step")


def main() -> None:
    p = training_parser(__doc__, model="resnet18", batch="samples per rank per step", steps=24, rounds=10, warmup=3,
                        what="side")
    args = parse(p, QUICK)
    if args.worker:
        return worker(args)
    with tempfile.TemporaryDirectory() as tmp:
        result = summarize(json.loads(spawn_ranks(__file__, training_argv(p, args), tmp).read_text()))
    print_table(result, args)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "strategy": "ddp", "model": args.model, "batch_per_rank": args.batch, "world_size": NPROC,
            "backend": "gloo", "steps": args.steps, "rounds": args.rounds, "warmup": args.warmup,
            "target": {"ratio_on_off": RATIO_TARGET}, **result,
            "env": env_record(["python", *sys.argv])}, indent=2))


if __name__ == "__main__":
    main()
