"""commprof's `ddp` and `fsdp` against PyTorch's own: DistributedDataParallel and FSDP2's fully_shard.

Four trainers per rank, each on its own copy of the same model (commprof.models, same seed, so the
same initial weights), the same pre-built batches, SGD (momentum 0.9, lr 0.01) and the same loss:

  ours ddp     STRATEGIES["ddp"], buckets of 25 MiB;
  torch ddp    DistributedDataParallel(bucket_cap_mb=25, forward_sync_buffers=False): ours does not
               broadcast BatchNorm buffers either; torch keeps its 1 MiB first bucket;
  ours fsdp    STRATEGIES["fsdp"] with prefetch, wrapping each of spec.units, the rest as the root;
  torch fsdp   fully_shard(unit, mesh) for each of spec.units, then fully_shard(model, mesh).

Ours runs as `commprof run` does, recording on: a real Phases, the breakdown and op volume at the end of
each iteration. Torch's step is forward, loss, backward, optimizer step, zero_grad, loss.item(), as
ours. Every step is timed from outside, `t0 = perf_counter_ns(); step; perf_counter_ns() - t0`, the
same way for both. 2 ranks, gloo, one intra-op thread each. R rounds of S steps per trainer; each
trainer starts after a barrier, the order reversing every round (ours first, then torch first).
Per round, each rank's median step time is averaged over ranks.

After all steps, the parameters of ours and torch's are compared (max |difference| over all
parameters and ranks, next to how far training moved them from the initial weights): both have done
the same steps on the same data, so they should agree to rounding; a timing comparison between
different computations would mean nothing.

    python benchmarks/run_vs_torch.py [--quick] [--model resnet18] [--batch 32] [--steps 15] [--rounds 8]
                                      [--warmup 2] [--json PATH]

--quick: mnist-cnn, 8 per rank, 2 rounds of 2 steps; a few seconds, to see that it runs.

Reading the table: ms are medians over rounds; ratio = ours / torch per round, median over rounds with its
95 % CI (benchmarks/common.py's ratio_ci) (1.00 = as fast as PyTorch, below 1 = faster). Target ≤ 1.10 per
pair.
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
PAIRS = ("ddp", "fsdp")
QUICK = {"model": "mnist-cnn", "batch": 8, "steps": 2, "rounds": 2, "warmup": 1}
"""--quick: the smallest model, two rounds (one each way) of two steps."""


# ---- the four trainers ----------------------------------------------------------------------------
def theirs(cfg, batches, mesh):
    """A step of PyTorch's DistributedDataParallel (cfg.strategy "ddp") or FSDP2 ("fsdp")."""
    from commprof.run.loop import build
    from commprof.strategies.base import loss_fn, make_optimizer

    _, spec = build(cfg)
    if cfg.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(spec.module, bucket_cap_mb=cfg.bucket_mb, forward_sync_buffers=False)
    else:
        from torch.distributed.fsdp import fully_shard

        for unit in spec.units:
            fully_shard(unit, mesh=mesh)
        model = fully_shard(spec.module, mesh=mesh)
    optimizer = make_optimizer(model.parameters(), name=cfg.optimizer, lr=cfg.lr)
    model.train()

    def step(i: int) -> float:
        x, y = batches[i % len(batches)]
        loss = loss_fn(spec.task, model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    def params() -> list:
        return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach() for p in spec.module.parameters()]

    return step, params


# ---- a worker: one rank ------------------------------------------------------------------------------
def worker(args) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from commprof.base.world import discover
    from commprof.comm import end_process, init_comm
    from commprof.run.config import RunConfig
    from commprof.run.loop import build

    torch.set_num_threads(1)
    comm = init_comm(discover(), backend="gloo", timeout_s=300)
    cfg = RunConfig(strategy="ddp", model=args.model, backend="gloo", batch_size=args.batch, steps=args.steps)
    source, _ = build(cfg)
    batches = make_batches(source, rank=comm.rank, world_size=comm.world_size, batch=args.batch, steps=args.steps)
    trainers, errors = {}, {}
    for pair in PAIRS:
        pcfg = replace(cfg, strategy=pair)
        trainers[f"ours {pair}"] = strategy_trainer(pcfg, comm, batches)[:2]
        try:
            mesh = init_device_mesh("cpu", (comm.world_size,)) if pair == "fsdp" else None
            trainers[f"torch {pair}"] = theirs(pcfg, batches, mesh)
            trainers[f"torch {pair}"][0](0)  # fails here, not in a timed round, if it cannot run at all
        except Exception as exc:  # noqa: BLE001 - reported as the pair's result
            errors[pair] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
            trainers.pop(f"torch {pair}", None)
            trainers.pop(f"ours {pair}")
    names = list(trainers)
    done = {name: 1 if name.startswith("torch") else 0 for name in names}  # steps each has taken
    for name in names:  # warm up; ours catches up with torch's probing step so both see the same steps
        step = trainers[name][0]
        for _ in range(args.warmup + (1 - done[name])):
            step(done[name])
            done[name] += 1
    rounds = timed_rounds(comm, trainers, names, done, rounds=args.rounds, steps=args.steps)
    parity, initial = {}, [p.detach() for p in build(cfg)[1].module.parameters()]
    for pair in PAIRS:
        if pair in errors:
            continue
        a, b = trainers[f"ours {pair}"][1](), trainers[f"torch {pair}"][1]()
        parity[pair] = {"max_abs_diff": max(float((x - y).abs().max()) for x, y in zip(a, b)),
                        "max_abs_update": max(float((x - y).abs().max()) for x, y in zip(a, initial)),
                        "steps": done[f"ours {pair}"], "steps_torch": done[f"torch {pair}"]}
    gathered = comm.gather_object({"rounds": rounds, "parity": parity, "errors": errors}, dst=0)
    if comm.rank == 0:
        Path(args.out).write_text(json.dumps(gathered))
    comm.close()
    end_process(0)  # not the interpreter's exit: see commprof.comm.end_process


def summarize(per_rank: list[dict]) -> dict:
    """Average over ranks per round, ours/torch per round, medians over rounds; parity as the worst rank's."""
    first = per_rank[0]
    names = [k for k in first["rounds"][0] if k != "first"] if first["rounds"] else []
    rounds = []
    for i, r0 in enumerate(first["rounds"]):
        row = {"round": i + 1, "first": r0["first"]}
        row.update({name: statistics.fmean(r["rounds"][i][name] for r in per_rank) for name in names})
        for pair in PAIRS:
            if f"ours {pair}" in row:
                row[f"ratio {pair}"] = row[f"ours {pair}"] / row[f"torch {pair}"]
        rounds.append(row)
    pairs = {}
    for pair in PAIRS:
        if pair in first["errors"]:
            pairs[pair] = {"error": first["errors"][pair]}
            continue
        ratios = [r[f"ratio {pair}"] for r in rounds]
        parity = {k: max(r["parity"][pair][k] for r in per_rank) for k in first["parity"][pair]}
        pairs[pair] = {"ours_ms": statistics.median(r[f"ours {pair}"] for r in rounds),
                       "torch_ms": statistics.median(r[f"torch {pair}"] for r in rounds),
                       "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                       "ratio_ci95": ratio_ci([r[f"ours {pair}"] for r in rounds],
                                              [r[f"torch {pair}"] for r in rounds])["ci95"],
                       "parity": parity}
        pairs[pair]["verdict"] = "PASS" if pairs[pair]["ratio"] <= RATIO_TARGET else "FAIL"
    return {"per_round": rounds, "pairs": pairs}


def print_table(result: dict, args) -> None:
    from rich.console import Console
    from rich.table import Table

    pairs = [p for p in PAIRS if "error" not in result["pairs"][p]]
    table = Table(title=f"commprof vs PyTorch: {args.model}, batch {args.batch}/rank, {NPROC} ranks gloo, "
                        f"{args.steps} steps × {args.rounds} interleaved rounds",
                  caption="ms = median wall per step, mean over ranks; ratio = ours / torch")
    table.add_column("round", justify="right")
    table.add_column("first")
    for pair in pairs:
        for name in (f"ours {pair} ms", f"torch {pair} ms", f"ratio {pair}"):
            table.add_column(name, justify="right")
    for r in result["per_round"]:
        cells = [str(r["round"]), r["first"]]
        for pair in pairs:
            cells += [f"{r[f'ours {pair}']:.1f}", f"{r[f'torch {pair}']:.1f}", f"{r[f'ratio {pair}']:.3f}"]
        table.add_row(*cells)
    cells = ["median", ""]
    for pair in pairs:
        p = result["pairs"][pair]
        cells += [f"{p['ours_ms']:.1f}", f"{p['torch_ms']:.1f}", f"{p['ratio']:.3f}"]
    table.add_row(*cells)
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    for pair in PAIRS:
        p = result["pairs"][pair]
        if "error" in p:
            print(f"{pair}: torch's side could not run, not measured: {p['error']}")
            continue
        q = p["parity"]
        lo, hi = p["ratio_ci95"]
        print(f"{pair}: ours/torch {p['ratio']:.3f} (rounds {p['ratio_min']:.3f} … {p['ratio_max']:.3f}, 95 % CI "
              f"{lo:.3f} … {hi:.3f}): "
              f"{p['verdict']} (target ≤ {RATIO_TARGET:g}); parameters after {q['steps']} steps: "
              f"max |ours - torch| = {q['max_abs_diff']:.3g} (max |ours - initial| {q['max_abs_update']:.3g})")


def main() -> None:
    p = training_parser(__doc__, model="resnet18", batch="samples per rank per step", steps=15, rounds=8, warmup=2,
                        what="trainer")
    args = parse(p, QUICK)
    if args.worker:
        return worker(args)
    with tempfile.TemporaryDirectory() as tmp:
        result = summarize(json.loads(spawn_ranks(__file__, training_argv(p, args), tmp).read_text()))
    print_table(result, args)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "model": args.model, "batch_per_rank": args.batch, "world_size": NPROC, "backend": "gloo",
            "optimizer": "sgd momentum 0.9 lr 0.01", "bucket_mb": 25.0, "steps": args.steps,
            "rounds": args.rounds, "warmup": args.warmup, "target": {"ratio_ours_torch": RATIO_TARGET},
            **result, "env": env_record(["python", *sys.argv])}, indent=2))


if __name__ == "__main__":
    main()
