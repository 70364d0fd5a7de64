"""Whether gloo ranks forked from the template (commprof/launcher/rank_template.py) train at the speed of ranks started
as interpreters of their own: `commprof run` of DDP on 2 gloo ranks, COMMPROF_RANK_START=fork against =exec,
interleaved job by job (the order flipping every round), rank 0's median step of each job.

    python benchmarks/rank_start.py [--quick] [--workloads mnist-cnn:300,resnet18:25] [--rounds 12]
                                    [--json benchmarks/results/rank-start-results.json]

A workload is MODEL:STEPS (5 warm-up steps before them). Prints per workload the median step of each arm and
the median of the per-round fork/exec ratios with its 95 % CI (benchmarks/common.py's ratio_ci). --quick: one
round of mnist-cnn at 10 steps, to see that it runs. Start-up is benchmarks/startup.py's.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

from common import ROOT, env_record, interleaved, job, parse, parser, ratio_ci, with_root

QUICK = {"workloads": "mnist-cnn:10", "rounds": 1}
TIMEOUT_S = 900
ARMS = ("fork", "exec")


def step_ms(start: str, model: str, steps: int, tmp: str) -> float:
    """Rank 0's median step (wall_ms) of one `commprof run` whose ranks start `start`-wise."""
    out = Path(tmp) / f"{start}.json"
    job([sys.executable, "-m", "commprof", "run", "--strategy", "ddp", "--model", model, "--backend", "gloo",
         "--nproc", "2", "--steps", str(steps), "--warmup", "5", "--eval-samples", "0", "--json", str(out)],
        env=with_root({"COMMPROF_RANK_START": start}), timeout_s=TIMEOUT_S, what=f"run ({start})", cwd=tmp)
    return statistics.median(it["wall_ms"] for it in json.loads(out.read_text())["iterations"] if it["rank"] == 0)


def main() -> int:
    p = parser(__doc__, json="rank-start-results.json")
    p.add_argument("--workloads", default="mnist-cnn:300,resnet18:25")
    p.add_argument("--rounds", type=int, default=12)
    args = parse(p, QUICK)
    workloads = [(w.split(":")[0], int(w.split(":")[1])) for w in args.workloads.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:  # started outside the checkout: with_root's PYTHONPATH decides
        for model, steps in workloads:
            runs = interleaved({a: (lambda a=a: step_ms(a, model, steps, tmp)) for a in ARMS}, args.rounds)
            ms = {a: [r[a] for r in runs] for a in ARMS}
            paired = ratio_ci(ms["fork"], ms["exec"])
            rows.append({"workload": model, "steps": steps, "fork_ms": statistics.median(ms["fork"]),
                         "exec_ms": statistics.median(ms["exec"]), "fork_over_exec": paired, "rounds": runs})
            lo, hi = paired["ci95"]
            print(f"{model} ({steps} steps): exec {rows[-1]['exec_ms']:.2f} ms, fork {rows[-1]['fork_ms']:.2f} ms; "
                  f"fork/exec {paired['ratio']:.3f} ({lo:.3f}-{hi:.3f}), {args.rounds} rounds", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env_record(["python", *sys.argv]), "rows": rows,
                                               "root": str(ROOT)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
