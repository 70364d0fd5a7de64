"""What torch's flight record costs a profiled step: `commprof profile` of tests/scripts/ddp_train.py (2 gloo
ranks, a DDP step of one bucket all-reduce and BatchNorm's two broadcasts) with the record on — profile's default:
TORCH_FR_BUFFER_SIZE=2000, rank 0 stamping each measured iteration and reading its record once after the last —
and off (TORCH_FR_BUFFER_SIZE=0: profile leaves it off), and off again (A/A: the comparison's own noise).

torch sizes its ring when the first process group is made, so on and off are separate jobs. Rounds take the arms
in turn, the order reversed every other round (common.order); each job's figure is profile's own step, the slowest
rank's median wall over its measured iterations (`summary.iteration_ms` in its --json); per round on/off and
off-again/off, and over rounds the median of each with its 95 % CI (common.ratio_ci); the same of each job's
fastest tenth of iterations (`fast`, every rank's: the step without the machine's bursts of other load). Beside
it, from the "on" jobs: the ring's entries at the end and whether the record agreed with commprof's every count.

Jobs of the same step differ by more than the record can cost such a step on a busy machine, so beside them what
resolves it: the record's cost an op inside `profile` (`per_op`), a 1-rank job of steps of --ops all_reduces of 8
floats, its ring on (2,000) and off in alternating jobs; each job's figure its fastest tenth of iterations over
--ops, in µs an op; per round on − off (µs) and on/off, their medians over rounds with 95 % CIs.

    python benchmarks/fr_cost.py [--quick] [--rounds 6] [--steps 60] [--warmup 4] [--ops 200] [--json PATH]

--quick: one round of on and off, 6 steps after 1 of warm-up, and one of the op loop: to see that it runs.
Target: on/off within the A/A's noise (a few µs an op against a step of milliseconds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from common import ROOT, env_record, job, median_ci, order, parse, parser, ratio_ci, with_root

SCRIPT = ROOT / "tests" / "scripts" / "ddp_train.py"
ARMS = ("on", "off", "off again")
QUICK = {"rounds": 1, "steps": 6, "warmup": 1, "ops": 50}
RUN_TIMEOUT_S = 600
OP_STEPS = 30
"""Steps of the op loop a job runs (profile's --warmup 4 leaves 26 measured)."""


def op_loop(ops: int) -> None:
    """The op loop's script: OP_STEPS steps of `ops` all_reduces of 8 floats and an optimizer's step."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(8)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))])
    for _ in range(OP_STEPS):
        for _ in range(ops):
            dist.all_reduce(t)
        opt.step()  # ends an iteration
    dist.destroy_process_group()


def per_op(args, tmp: str) -> dict:
    """The record's cost an op inside `profile`: --rounds rounds of a 1-rank op-loop job with the ring on and one
    with it off; each job's step (profile's median) over --ops, in µs an op."""
    got: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for arm in order(("on", "off"), r):
            env = with_root({**os.environ, "OMP_NUM_THREADS": "1"})
            env.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
            env["TORCH_FR_BUFFER_SIZE"] = "2000" if arm == "on" else "0"
            out = Path(tmp) / f"ops-{arm}-{r}.json"
            job([sys.executable, "-m", "commprof", "profile", "--nproc", "1", "--json", str(out), "--", __file__,
                 "--op-loop", str(args.ops)], env=env, timeout_s=RUN_TIMEOUT_S, what=f"fr_cost: op loop, {arm}")
            got[arm].append(fast_ms(json.loads(out.read_text())) * 1e3 / args.ops)
    extra = [a - b for a, b in zip(got["on"], got["off"])]
    return {"on_us": statistics.median(got["on"]), "off_us": statistics.median(got["off"]),
            "extra_us": statistics.median(extra), "extra_ci95_us": median_ci(extra),
            "on_over_off": ratio_ci(got["on"], got["off"]), "ops": args.ops, "steps": OP_STEPS, "rounds": got}


FAST = 0.1
"""The quantile of a job's iteration walls (every rank's) taken as its uncontended step beside profile's median:
on a machine whose other load comes in bursts of seconds, a job's median moved by 2-10× from one job to the next
here, its fastest tenth far less."""


def fast_ms(doc: dict) -> float:
    """A job's FAST quantile of every rank's measured iteration walls (ms)."""
    walls = sorted(it["wall_ms"] for it in doc["iterations"])
    return walls[min(len(walls) - 1, int(FAST * len(walls)))]


def run(arm: str, args, tmp: str, r: int) -> dict:
    """One `commprof profile` job of the arm: its step (ms) and, with the record on, what the record said."""
    env = with_root({**os.environ, "OMP_NUM_THREADS": "1"})
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        env.pop(name, None)
    if arm != "on":
        env["TORCH_FR_BUFFER_SIZE"] = "0"
    out = Path(tmp) / f"{arm.replace(' ', '-')}-{r}.json"
    job([sys.executable, "-m", "commprof", "profile", "--nproc", "2", "--warmup", str(args.warmup), "--json", str(out),
         "--", str(SCRIPT), "--steps", str(args.steps)], env=env, timeout_s=RUN_TIMEOUT_S, what=f"fr_cost: {arm}")
    doc = json.loads(out.read_text())
    record = doc.get("torch_record") or {}
    return {"ms": doc["summary"]["iteration_ms"], "fast_ms": fast_ms(doc), "buffer_size": record.get("buffer_size"),
            "entries": record.get("entries"), "agree": record.get("agree"), "wrapped": record.get("wrapped")}


def main() -> None:
    p = parser(__doc__, json="fr-cost-results.json")
    p.add_argument("--rounds", type=int, default=6, help="rounds, each a job of every arm (default 6)")
    p.add_argument("--steps", type=int, default=60, help="steps of ddp_train.py a job (default 60)")
    p.add_argument("--warmup", type=int, default=4, help="profile's --warmup (default 4, profile's)")
    p.add_argument("--ops", type=int, default=200, help="all_reduces a block of the op loop (default 200)")
    p.add_argument("--op-loop", type=int, help=argparse.SUPPRESS)
    args = parse(p, QUICK)
    if args.op_loop:
        op_loop(args.op_loop)
        return
    if args.rounds < 1 or not 0 <= args.warmup < args.steps:
        p.error("--rounds must be at least 1, and --steps more than --warmup")
    arms = ARMS[:2] if args.quick else ARMS
    rounds = []
    with tempfile.TemporaryDirectory(prefix="fr-cost-") as tmp:
        for r in range(args.rounds):
            rounds.append({"first": order(arms, r)[0],
                           **{arm: run(arm, args, tmp, r) for arm in order(arms, r)}})
            print(f"round {r + 1}: " + ", ".join(f"{arm} {rounds[-1][arm]['ms']:.2f} ms" for arm in arms), flush=True)
    ms = {arm: [x[arm]["ms"] for x in rounds] for arm in arms}
    fast = {arm: [x[arm]["fast_ms"] for x in rounds] for arm in arms}
    result = {"on_over_off": ratio_ci(ms["on"], ms["off"]),
              "on_ms": statistics.median(ms["on"]), "off_ms": statistics.median(ms["off"]),
              "fast": {"on_over_off": ratio_ci(fast["on"], fast["off"]), "on_ms": statistics.median(fast["on"]),
                       "off_ms": statistics.median(fast["off"]),
                       **({"off_again_over_off": ratio_ci(fast["off again"], fast["off"])} if "off again" in arms
                          else {})},
              "record": {"buffer_size": rounds[0]["on"]["buffer_size"],
                         "entries": statistics.median(x["on"]["entries"] or 0 for x in rounds),
                         "agree_every_job": all(x["on"]["agree"] for x in rounds),
                         "wrapped_any_job": any(x["on"]["wrapped"] for x in rounds)},
              "rounds": rounds, "steps": args.steps, "warmup": args.warmup, "script": str(SCRIPT.relative_to(ROOT)),
              "env": env_record(sys.argv)}
    if "off again" in arms:
        result["off_again_over_off"] = ratio_ci(ms["off again"], ms["off"])
    with tempfile.TemporaryDirectory(prefix="fr-cost-") as tmp:
        result["per_op"] = per_op(args, tmp)
    told = result["on_over_off"]
    print(f"record on {result['on_ms']:.2f} ms, off {result['off_ms']:.2f} ms a step; on/off {told['ratio']:.4f} "
          f"({told['ci95'][0]:.4f} … {told['ci95'][1]:.4f}, {told['rounds']} rounds)"
          + (f"; A/A {result['off_again_over_off']['ratio']:.4f} ({result['off_again_over_off']['ci95'][0]:.4f} … "
             f"{result['off_again_over_off']['ci95'][1]:.4f})" if "off_again_over_off" in result else "")
          + f"; the record agreed in every job: {result['record']['agree_every_job']}", flush=True)
    f = result["fast"]
    print(f"fastest tenth of each job's iterations: on {f['on_ms']:.2f} ms, off {f['off_ms']:.2f} ms; on/off "
          f"{f['on_over_off']['ratio']:.4f} ({f['on_over_off']['ci95'][0]:.4f} … {f['on_over_off']['ci95'][1]:.4f})"
          + (f"; A/A {f['off_again_over_off']['ratio']:.4f} ({f['off_again_over_off']['ci95'][0]:.4f} … "
             f"{f['off_again_over_off']['ci95'][1]:.4f})" if "off_again_over_off" in f else ""), flush=True)
    op = result["per_op"]
    print(f"an all_reduce of 8 floats under profile, 1 rank: {op['off_us']:.2f} µs off, on + {op['extra_us']:.2f} µs "
          f"({op['extra_ci95_us'][0]:.2f} … {op['extra_ci95_us'][1]:.2f}); on/off {op['on_over_off']['ratio']:.4f} "
          f"({op['on_over_off']['ci95'][0]:.4f} … {op['on_over_off']['ci95'][1]:.4f})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
