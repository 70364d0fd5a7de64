"""Findings against causes injected into real jobs (commprof/findings/): `commprof profile --trace` of

- tests/scripts/straggler_train.py, rank 1 sleeping D ms before every backward, D = 5, 20, 50, beside the
  same job with D = 0 run before each delayed job and after the last: the straggler found, its cost per step
  over D, and its step without the delay over the balanced runs' median step (and over the mean of the two
  run beside it in time), with the balanced runs' own spread — one balanced run alone varies ~10 % here.
  These jobs run with --warmup (profile's default, 4: warm-up iterations 1-3 are aligned, commprof/record/aligned.py;
  2: iteration 1 alone), and the aligned iterations' ops price the ones the straggler made late;
- tests/scripts/per_param_train.py, every gradient all-reduced on its own, beside the same script fusing
  them into one all-reduce: latency_bound found, and the saving it predicts over the saving measured (the
  per-parameter step less the fused one);
- the straggler job at D = 20 with the last rank's clock --clock-ms ahead (COMMPROF_FAULT=clock): the offset
  the trace's alignment found against the one injected, the bound it states, and the straggler's cost;
- the straggler job with only every other step delayed (--delay-every 2), at each D: every delayed
  iteration's step without the delay (that iteration replayed alone) over the balanced iterations on either
  side of it — a control from the same moment, where separate balanced runs differ by 10–30 % here — and a
  balanced iteration over its balanced neighbours, the comparison's own noise.

Each on --backends (gloo, mpi) at --nproc ranks (2; 4 oversubscribes 2 cores), the ranks unbound as torchrun
leaves them, or each on its own cores (--bind-cores: profile's flag).

    python benchmarks/findings.py [--quick] [--delays 5,20,50] [--backends gloo,mpi] [--nproc 2]
                                  [--steps 48] [--warmup 4] [--clock-ms 500] [--bind-cores] [--json PATH]

48 steps a job: one step of the balanced job takes 7–20 ms here, and a median of fewer moves by ~10 % from
run to run. --quick: D = 20 on gloo, 6 steps, one balanced run, no alternating job; seconds, to see that it
runs. Targets: cost and step within 15 %, saving within 25 %, clock offset within 0.2 ms. Results:
benchmarks/README.md.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from common import ROOT, alternating_ratios, job, parse, parser, with_root

SCRIPTS = ROOT / "tests" / "scripts"
QUICK = {"delays": "20", "backends": "gloo", "steps": 6}
"""--quick: one delay, one backend, 6 steps (2 measured after profile's 4 of warm-up)."""
TIMEOUT_S = 600


def profiled(tmp: Path, name: str, backend: str, nproc: int, script: str, *args: str, fault: str = "",
             bind: bool = False, warmup: int = 1) -> dict:
    """The JSON of `commprof profile --trace` of tests/scripts/SCRIPT (under COMMPROF_FAULT=fault), with the
    step of its own trace and its clock alignment."""
    sys.path.insert(0, str(ROOT))
    from commprof.perfmodel import timeline

    out = tmp / f"{name}.json"
    flags = ["--nproc", str(nproc), "--backend", backend, "--warmup", str(warmup), *(["--bind-cores"] if bind else [])]
    job([sys.executable, "-m", "commprof", "profile", *flags, "--trace", str(tmp / name), "--json", str(out), "--",
         str(SCRIPTS / script), *args],
        env=with_root({**os.environ, "COMMPROF_FAULT": fault}), timeout_s=TIMEOUT_S, what=f"findings: {name}")
    doc = json.loads(out.read_text())
    doc["trace_step_ms"] = timeline.load(str(tmp / name)).measured_wall_ms
    doc["clock_sync"] = json.loads((tmp / name / "trace.json").read_text())["otherData"]["clock_sync"]
    return doc


def first(doc: dict, kind: str) -> dict | None:
    return next((f for f in doc["findings"]["items"] or [] if f["kind"] == kind), None)


def main() -> None:
    p = parser(__doc__, json="findings-results.json")
    p.add_argument("--delays", default="5,20,50", help="ms rank 1 sleeps before each backward")
    p.add_argument("--backends", default="gloo,mpi")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--clock-ms", type=float, default=500.0, help="how far ahead the last rank's clock is set")
    p.add_argument("--bind-cores", action="store_true", help="each rank on its own cores (profile's flag)")
    p.add_argument("--warmup", type=int, default=4,
                   help="--warmup of the straggler jobs and their balanced controls (default: profile's, 4)")
    args = parse(p, QUICK)
    steps = ["--steps", str(args.steps)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="findings-") as tmp:
        tmp = Path(tmp)
        for backend in args.backends.split(","):
            at = f"{backend}, {args.nproc} ranks"
            # the balanced job before each delayed one and after the last: a delayed run's step without the
            # delay is held against the balanced runs beside it in time, and against all of them
            delays = list(map(float, args.delays.split(",")))
            balanced = [profiled(tmp, f"{backend}-d0-0", backend, args.nproc, "straggler_train.py", *steps,
                                 bind=args.bind_cores, warmup=args.warmup)]
            delayed = []
            for k, delay in enumerate(delays):
                delayed.append(profiled(tmp, f"{backend}-d{delay:g}", backend, args.nproc, "straggler_train.py",
                                        *steps, "--delay-ms", str(delay), bind=args.bind_cores, warmup=args.warmup))
                if not args.quick or k + 1 < len(delays):  # --quick: the balanced run before it alone
                    balanced.append(profiled(tmp, f"{backend}-d0-{k + 1}", backend, args.nproc,
                                             "straggler_train.py", *steps, bind=args.bind_cores, warmup=args.warmup))
            steps_ms = [b["trace_step_ms"] for b in balanced]
            for k, (delay, doc) in enumerate(zip(delays, delayed)):
                rows.append(straggler_row(doc, delay, backend, args.nproc, steps_ms, steps_ms[k:k + 2]))
                row = rows[-1]
                print(f"straggler D={delay:g} ms ({at}): found rank {row['found_rank']}, cost/D "
                      f"{_f(row['cost_over_delay'])} (its own time beside D {_f(row['besides_delay_ms'])} ms), "
                      f"priced {row['late_ops_priced_aligned']}, "
                      f"step without/balanced {_f(row['without_over_balanced'])} "
                      f"(balanced runs {row['balanced_min_over_median']:.3f}-{row['balanced_max_over_median']:.3f} "
                      f"of their median), /neighbours {_f(row['without_over_neighbours'])}", flush=True)
            per = profiled(tmp, f"{backend}-per-param", backend, args.nproc, "per_param_train.py", *steps,
                           bind=args.bind_cores)
            fused = profiled(tmp, f"{backend}-fused", backend, args.nproc, "per_param_train.py", *steps, "--fused",
                             bind=args.bind_cores)
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
            rows.append(clock(tmp, backend, args.nproc, args.clock_ms, steps, args.bind_cores))
            for delay in delays if not args.quick else ():  # --quick: findings_workloads.py's quick runs one
                rows.append(alternating(tmp, backend, args.nproc, delay, steps, args.bind_cores))
    if args.json:
        Path(args.json).write_text(json.dumps({"bind_cores": args.bind_cores, "warmup": args.warmup, "rows": rows},
                                              indent=1) + "\n")


def straggler_row(doc: dict, delay: float, backend: str, nproc: int, balanced: list[float],
                  neighbours: list[float]) -> dict:
    """What the straggler finding of a job delayed by `delay` ms said, against the balanced runs' steps (all
    of them, and the two beside it in time)."""
    found = first(doc, "straggler")
    without = None if found is None else found["step_ms_without"]
    mid = statistics.median(balanced)
    return {"case": "straggler", "backend": backend, "nproc": nproc, "delay_ms": delay,
            "found_rank": None if found is None else found["rank"],
            "cost_over_delay": None if found is None else found["ms_per_step"] / delay,
            # what else the straggler's own time exceeds its peers' by (its compute after the sleep, slower on
            # shared cores): part of what its peers wait for, so of its cost too
            "besides_delay_ms": None if found is None else (found["evidence"]["busy_ms"] - delay
                                                            - found["evidence"]["others_busy_ms"]),
            "without_over_balanced": None if without is None else without / mid,
            "without_over_neighbours": None if without is None else without / statistics.fmean(neighbours),
            "without_lower_bound": None if found is None else found.get("step_without_lower_bound"),
            "late_ops_priced_aligned": None if found is None else found["evidence"].get("late_ops_priced_aligned"),
            "step_ms": doc["trace_step_ms"], "balanced_step_ms": mid, "balanced_steps_ms": balanced,
            "balanced_min_over_median": min(balanced) / mid, "balanced_max_over_median": max(balanced) / mid}


def clock(tmp: Path, backend: str, nproc: int, ahead_ms: float, steps: list[str], bind: bool) -> dict:
    """The straggler job (D = 20 ms) with the last rank's clock `ahead_ms` ahead: what the alignment found."""
    skewed = nproc - 1
    doc = profiled(tmp, f"{backend}-clock", backend, nproc, "straggler_train.py", *steps, "--delay-ms", "20",
                   fault=f"clock:rank={skewed}:ms={ahead_ms:g}", bind=bind)
    mine = doc["clock_sync"]["ranks"][skewed]
    found = first(doc, "straggler")
    row = {"case": "clock", "backend": backend, "nproc": nproc, "injected_ms": ahead_ms,
           "found_ms": mine["applied_offset_ns"] / 1e6, "error_ms": mine["applied_offset_ns"] / 1e6 - ahead_ms,
           "bound_ms": mine["residual_ns"] / 1e6, "straggler_rank": None if found is None else found["rank"],
           "cost_over_delay": None if found is None else found["ms_per_step"] / 20.0}
    print(f"clock {ahead_ms:g} ms ahead on rank {skewed} ({backend}, {nproc} ranks): found {row['found_ms']:.3f} "
          f"ms (error {row['error_ms']:+.3f}, bound {row['bound_ms']:.3f}); straggler rank {row['straggler_rank']}, "
          f"cost/D {_f(row['cost_over_delay'])}", flush=True)
    return row


def alternating(tmp: Path, backend: str, nproc: int, delay: float, steps: list[str], bind: bool) -> dict:
    """The straggler job with rank 1 slept before every other backward: each delayed iteration's step without
    the delay (that iteration alone replayed, rank 1's own time as the others') over the mean measured step of
    the balanced iterations on either side of it, a control from the same moment of the machine; beside it, a
    balanced iteration over the balanced ones two away on either side (the same comparison with nothing to
    take away)."""
    name = f"{backend}-alternating{delay:g}"
    profiled(tmp, name, backend, nproc, "straggler_train.py", *steps, "--delay-ms", str(delay), "--delay-every", "2",
             bind=bind)
    row = {"case": "straggler_alternating", "backend": backend, "nproc": nproc, "delay_ms": delay,
           **alternating_ratios(str(tmp / name), delay, 1)}
    print(f"straggler every other step, D={delay:g} ms ({backend}, {nproc} ranks): {row['pairs']} delayed "
          f"iterations, step without ÷ its balanced neighbours {_f(row['without_over_neighbours'])} "
          f"{row['without_over_neighbours_ci95']}; balanced ÷ balanced {_f(row['balanced_over_neighbours'])}",
          flush=True)
    return row


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


if __name__ == "__main__":
    main()
