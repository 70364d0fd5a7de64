"""commprof's `pipeline-gpipe` against PyTorch's own GPipe: torch.distributed.pipelining's PipelineStage
and ScheduleGPipe, on the same model cut in the same place.

Two trainers per rank, each on its own copy of the same model (commprof.models, built by
commprof.run.loop.build with the same seed, so the same initial weights), the same pre-built batches,
the same micro-batches, SGD (momentum 0.9, lr 0.01) and the same loss:

  ours    STRATEGIES["pipeline-gpipe"] as `commprof run --strategy pipeline-gpipe --stages 2` builds it
          (RunConfig pp=2, dp=1, micro_batches=m), with explicit `cuts` = the cut by parameter count
          (balanced_starts(param_costs(spec.layers), 2)); blocking recv, isend, one two-rank gloo group
          per boundary; the last stage backpropagates loss_fn(task, logits, y) / m per micro-batch;
  torch   rank s wraps nn.Sequential(*spec.layers[start_s:end_s]) of its own copy of the model, the
          same layers as ours, in PipelineStage(submodule, s, 2, cpu) on the default (world) gloo group
          and runs ScheduleGPipe(stage, n_microbatches=m, loss_fn=loss_fn(task, ·, ·)) with its default
          scale_grads=True: it backpropagates each micro-batch's unscaled loss and divides the summed
          gradients by m after the last backward (ours divides each loss by m before it: the same
          gradients; with m a power of two, bit for bit). step(x) on stage 0, step(target=y,
          losses=…) on the last, return_outputs=False (ours keeps no logits either); torch splits the
          batch with tensor_split, the same m row blocks ours gets. Its first step infers the stages'
          input/output shapes by a real forward and backward exchanged between the ranks (send/recv
          of pickled metadata); that step is the untimed probe below.

Both run on the one torch.distributed gloo world that commprof's init_comm creates (torch's pipelining
needs the default process group). Ours runs as `commprof run` does, recording on: a real Phases, the
breakdown and op volume at the end of each iteration. Torch's step is schedule.step, optimizer step,
zero_grad, and the last stage's loss.item() per micro-batch, as ours. Every step is timed from outside,
`t0 = perf_counter_ns(); step; perf_counter_ns() - t0`, the same way for both. 2 ranks = 2 stages,
gloo, one intra-op thread each. R rounds of S steps per trainer; each trainer starts after a barrier,
the order reversing every round (ours first, then torch first). Per round, each rank's median step time
is averaged over ranks.

After all steps, each rank compares its stage's parameters, ours against torch's (max |difference|
over all parameters and both ranks, next to how far training moved them from the initial weights):
both have done the same steps on the same data, so they should agree to rounding; a timing comparison
between different computations would mean nothing.

    python benchmarks/pipeline_vs_torch.py [--quick] [--model gpt2] [--batch 32] [--micro-batches 4] [--steps 5]
                                           [--rounds 6] [--warmup 1] [--json PATH]

--quick: gpt2-tiny, a batch of 8 in 2 micro-batches, 2 rounds of 2 steps; a few seconds, to see that it runs.

Reading the table: ms are medians over rounds; ratio = ours / torch per round, median over rounds with its
95 % CI (benchmarks/common.py's ratio_ci) (1.00 = as fast as PyTorch, below 1 = faster). Target ≤ 1.10.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from common import (
    NPROC,
    env_record,
    make_batches,
    parse,
    ratio_ci,
    spawn_ranks,
    strategy_trainer,
    timed_rounds,
    training_argv,
    training_parser,
)

RATIO_TARGET = 1.10
NAMES = ("ours", "torch")
QUICK = {"model": "gpt2-tiny", "batch": 8, "micro_batches": 2, "steps": 2, "rounds": 2, "warmup": 1}
"""--quick: the smallest chain model, 2 micro-batches, two rounds (one each way) of two steps."""


# ---- the two trainers -----------------------------------------------------------------------------
def theirs(cfg, comm, batches, starts: list[int]):
    """A step of torch.distributed.pipelining's ScheduleGPipe over this rank's stage of the same cut."""
    import torch
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from commprof.run.loop import build
    from commprof.strategies.base import loss_fn, make_optimizer, trainable

    _, spec = build(cfg)
    s, p, m = comm.rank, comm.world_size, cfg.micro_batches
    ends = [*starts[1:], len(spec.layers)]
    submod = torch.nn.Sequential(*spec.layers[starts[s]:ends[s]])
    submod.train()
    stage = PipelineStage(submod, s, p, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=m, loss_fn=lambda out, y: loss_fn(spec.task, out, y))
    optimizer = make_optimizer(trainable(submod), name=cfg.optimizer, lr=cfg.lr)
    first, last = s == 0, s == p - 1

    def step(i: int) -> float:
        x, y, _ = batches[i % len(batches)]
        losses: list = []
        if first:
            schedule.step(x, return_outputs=False)
        elif last:
            schedule.step(target=y, losses=losses, return_outputs=False)
        else:
            schedule.step(return_outputs=False)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return sum(loss.item() for loss in losses) / m if last else float("nan")

    def params() -> list:
        return [q.detach() for q in submod.parameters()]

    return step, params


def split_batches(batches: list, m: int) -> list[tuple]:
    """Each (x, y) as (x, y, its m micro-batches sliced as commprof.run.loop slices them)."""
    out = []
    for x, y in batches:
        micro = len(x) // m
        out.append((x, y, [(x[i:i + micro], y[i:i + micro]) for i in range(0, len(x), micro)]))
    return out


# ---- a worker: one rank ------------------------------------------------------------------------------
def worker(args) -> None:
    import torch

    from commprof.base.world import discover
    from commprof.comm import end_process, init_comm
    from commprof.parallel.partition import balanced_starts, param_costs
    from commprof.run.config import RunConfig
    from commprof.run.loop import build

    torch.set_num_threads(1)
    comm = init_comm(discover(), backend="gloo", timeout_s=300)
    cfg = RunConfig(strategy="pipeline-gpipe", model=args.model, backend="gloo", batch_size=args.batch,
                    steps=args.steps, pp=comm.world_size, dp=1, micro_batches=args.micro_batches)
    source, spec = build(cfg)
    starts = balanced_starts(param_costs(spec.layers), comm.world_size)
    cfg = replace(cfg, cuts=tuple(starts[1:]))  # both sides cut here: ours through --cuts, torch's by hand
    ends = [*starts[1:], len(spec.layers)]
    initial = [p.detach().clone() for layer in spec.layers[starts[comm.rank]:ends[comm.rank]]
               for p in layer.parameters()]
    del spec
    # Every stage trains on the same (the replica's) batch: data rank 0 of 1, as commprof.run.loop does.
    batches = split_batches(make_batches(source, rank=0, world_size=1, batch=args.batch, steps=args.steps),
                            args.micro_batches)
    trainers, error = {}, None
    step, _, strategy = strategy_trainer(cfg, comm, batches, micro_batches=lambda batch: batch[2])
    assert strategy.starts == starts, (strategy.starts, starts)
    # each rank compares its own stage (full_state gathers to rank 0 only)
    trainers["ours"] = (step, lambda: [p.detach() for p in strategy.stage_module.parameters()])
    try:
        trainers["torch"] = theirs(cfg, comm, batches, starts)
        trainers["torch"][0](0)  # fails here, not in a timed round, if it cannot run at all
    except Exception as exc:  # noqa: BLE001 - reported as the result
        error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
    errors = comm.gather_object(error, dst=0)
    error = comm.broadcast_object(next((e for e in errors if e), None) if errors else None, src=0)
    rounds, done = [], {"ours": 0, "torch": 1}  # steps each has taken
    if error is None:
        for name in NAMES:  # warm up; ours catches up with torch's probing step so both see the same steps
            for _ in range(args.warmup + (1 - done[name])):
                trainers[name][0](done[name])
                done[name] += 1
        rounds = timed_rounds(comm, trainers, NAMES, done, rounds=args.rounds, steps=args.steps)
    parity = None
    if error is None:
        a, b = trainers["ours"][1](), trainers["torch"][1]()
        parity = {"max_abs_diff": max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True)),
                  "max_abs_update": max(float((x - y).abs().max()) for x, y in zip(a, initial, strict=True)),
                  "steps": done["ours"], "steps_torch": done["torch"], "stage_params": sum(x.numel() for x in a)}
    gathered = comm.gather_object({"rounds": rounds, "parity": parity, "error": error, "starts": starts}, dst=0)
    if comm.rank == 0:
        Path(args.out).write_text(json.dumps(gathered))
    comm.close()
    end_process(0)  # not the interpreter's exit: see commprof.comm.end_process


def summarize(per_rank: list[dict]) -> dict:
    """Average over ranks per round, ours/torch per round, medians over rounds; parity as the worst rank's."""
    first = per_rank[0]
    if first["error"]:
        return {"starts": first["starts"], "error": first["error"]}
    rounds = []
    for i, r0 in enumerate(first["rounds"]):
        row = {"round": i + 1, "first": r0["first"]}
        row.update({name: statistics.fmean(r["rounds"][i][name] for r in per_rank) for name in NAMES})
        row["ratio"] = row["ours"] / row["torch"]
        rounds.append(row)
    ratios = [r["ratio"] for r in rounds]
    parity = {k: max(r["parity"][k] for r in per_rank) for k in ("max_abs_diff", "max_abs_update", "steps",
                                                                "steps_torch")}
    parity["stage_params"] = [r["parity"]["stage_params"] for r in per_rank]
    summary = {"ours_ms": statistics.median(r["ours"] for r in rounds),
               "torch_ms": statistics.median(r["torch"] for r in rounds),
               "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
               "ratio_ci95": ratio_ci([r["ours"] for r in rounds], [r["torch"] for r in rounds])["ci95"],
               "parity": parity}
    summary["verdict"] = "PASS" if summary["ratio"] <= RATIO_TARGET else "FAIL"
    return {"starts": first["starts"], "per_round": rounds, "summary": summary}


def print_table(result: dict, args) -> None:
    from rich.console import Console
    from rich.table import Table

    if "error" in result:
        print(f"torch's side could not run, not measured (cut at layers {result['starts']}): {result['error']}")
        return
    table = Table(title=f"pipeline-gpipe vs torch ScheduleGPipe: {args.model}, {NPROC} stages (cut at "
                        f"layer {', '.join(map(str, result['starts'][1:]))}), batch {args.batch} in "
                        f"{args.micro_batches} micro-batches, gloo, {args.steps} steps × {args.rounds} "
                        f"interleaved rounds",
                  caption="ms = median wall per step, mean over ranks; ratio = ours / torch")
    for name in ("round", "first", "ours ms", "torch ms", "ratio"):
        table.add_column(name, justify="left" if name == "first" else "right")
    for r in result["per_round"]:
        table.add_row(str(r["round"]), r["first"], f"{r['ours']:.1f}", f"{r['torch']:.1f}", f"{r['ratio']:.3f}")
    s = result["summary"]
    table.add_row("median", "", f"{s['ours_ms']:.1f}", f"{s['torch_ms']:.1f}", f"{s['ratio']:.3f}")
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    q, (lo, hi) = s["parity"], s["ratio_ci95"]
    print(f"ours/torch {s['ratio']:.3f} (rounds {s['ratio_min']:.3f} … {s['ratio_max']:.3f}, 95 % CI {lo:.3f} … "
          f"{hi:.3f}): {s['verdict']} "
          f"(target ≤ {RATIO_TARGET:g}); parameters after {q['steps']} steps: max |ours - torch| = "
          f"{q['max_abs_diff']:.3g} (max |ours - initial| {q['max_abs_update']:.3g})")


def main() -> None:
    p = training_parser(__doc__, model="gpt2", batch="samples per step, all micro-batches", steps=5, rounds=6,
                        warmup=1, what="trainer")
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per step (default 4)")
    args = parse(p, QUICK)
    if args.worker:
        return worker(args)
    if args.micro_batches < 1:
        p.error("--micro-batches must be at least 1")
    if args.batch % args.micro_batches:
        p.error(f"--batch {args.batch} must be a multiple of --micro-batches {args.micro_batches} "
                "(torch splits the batch into exactly that many equal micro-batches)")
    with tempfile.TemporaryDirectory() as tmp:
        result = summarize(json.loads(spawn_ranks(__file__, training_argv(
            p, args, "--micro-batches", str(args.micro_batches)), tmp).read_text()))
    print_table(result, args)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "model": args.model, "batch_per_replica": args.batch, "micro_batches": args.micro_batches,
            "stages": NPROC, "world_size": NPROC, "backend": "gloo", "optimizer": "sgd momentum 0.9 lr 0.01",
            "steps": args.steps, "rounds": args.rounds, "warmup": args.warmup,
            "target": {"ratio_ours_torch": RATIO_TARGET}, **result, "env": env_record(["python", *sys.argv])},
            indent=2))


if __name__ == "__main__":
    main()
