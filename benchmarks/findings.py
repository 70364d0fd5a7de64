"""Findings against causes injected into real jobs (commprof/findings/): `commprof profile --trace` of

- tests/scripts/straggler_train.py, rank 1 sleeping D ms before every backward, D = 5, 20, 50, beside the
  same job with D = 0: the straggler found, its cost per step over D, and its step without the delay over
  the step measured without it;
- tests/scripts/per_param_train.py, every gradient all-reduced on its own, beside the same script fusing
  them into one all-reduce: latency_bound found, and the saving it predicts over the saving measured (the
  per-parameter step less the fused one).

Each on --backends (gloo, mpi) at --nproc ranks (2; 4 oversubscribes 2 cores).

    python benchmarks/findings.py [--quick] [--delays 5,20,50] [--backends gloo,mpi] [--nproc 2]
                                  [--steps 16] [--json PATH]

--quick: D = 20 on gloo, 8 steps; seconds, to see that it runs. Targets: cost and step within 15 %,
saving within 25 %. Results: benchmarks/README.md.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from common import ROOT, job, parse, parser, with_root

SCRIPTS = ROOT / "tests" / "scripts"
QUICK = {"delays": "20", "backends": "gloo", "steps": 8}
"""--quick: one delay, one backend, 8 steps."""
TIMEOUT_S = 600


def profiled(tmp: Path, name: str, backend: str, nproc: int, script: str, *args: str) -> dict:
    """The JSON of `commprof profile --trace` of tests/scripts/SCRIPT, with the step of its own trace."""
    sys.path.insert(0, str(ROOT))
    from commprof.predict import timeline

    out = tmp / f"{name}.json"
    job([sys.executable, "-m", "commprof", "profile", "--nproc", str(nproc), "--backend", backend, "--trace",
         str(tmp / name), "--json", str(out), "--", str(SCRIPTS / script), *args], env=with_root(),
        timeout_s=TIMEOUT_S, what=f"findings: {name}")
    doc = json.loads(out.read_text())
    doc["trace_step_ms"] = timeline.load(str(tmp / name)).measured_wall_ms
    return doc


def first(doc: dict, kind: str) -> dict | None:
    return next((f for f in doc["findings"]["items"] or [] if f["kind"] == kind), None)


def main() -> None:
    p = parser(__doc__, json="findings-results.json")
    p.add_argument("--delays", default="5,20,50", help="ms rank 1 sleeps before each backward")
    p.add_argument("--backends", default="gloo,mpi")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=16)
    args = parse(p, QUICK)
    steps = ["--steps", str(args.steps)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="findings-") as tmp:
        tmp = Path(tmp)
        for backend in args.backends.split(","):
            at = f"{backend}, {args.nproc} ranks"
            base = profiled(tmp, f"{backend}-d0", backend, args.nproc, "straggler_train.py", *steps)
            for delay in map(float, args.delays.split(",")):
                doc = profiled(tmp, f"{backend}-d{delay:g}", backend, args.nproc, "straggler_train.py", *steps,
                               "--delay-ms", str(delay))
                found = first(doc, "straggler")
                row = {"case": "straggler", "backend": backend, "nproc": args.nproc, "delay_ms": delay,
                       "found_rank": None if found is None else found["rank"],
                       "cost_over_delay": None if found is None else found["ms_per_step"] / delay,
                       "without_over_balanced": None if found is None
                       else found["step_ms_without"] / base["trace_step_ms"],
                       "step_ms": doc["trace_step_ms"], "balanced_step_ms": base["trace_step_ms"]}
                rows.append(row)
                print(f"straggler D={delay:g} ms ({at}): found rank {row['found_rank']}, cost/D "
                      f"{_f(row['cost_over_delay'])}, step without/balanced {_f(row['without_over_balanced'])}",
                      flush=True)
            per = profiled(tmp, f"{backend}-per-param", backend, args.nproc, "per_param_train.py", *steps)
            fused = profiled(tmp, f"{backend}-fused", backend, args.nproc, "per_param_train.py", *steps, "--fused")
            found = first(per, "latency_bound")
            measured = per["trace_step_ms"] - fused["trace_step_ms"]
            predicted = None if found is None else per["trace_step_ms"] - found["step_ms_without"]
            rows.append({"case": "latency_bound", "backend": backend, "nproc": args.nproc,
                         "found": found is not None, "predicted_saving_ms": predicted,
                         "measured_saving_ms": measured,
                         "predicted_over_measured": None if predicted is None or measured <= 0
                         else predicted / measured})
            print(f"latency_bound ({at}): found {found is not None}, saving predicted {_f(predicted)} ms, "
                  f"measured {measured:.2f} ms", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1) + "\n")


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


if __name__ == "__main__":
    main()
