"""Exit stress: run whole `commprof` jobs (MPI and gloo) many times and count the ones that did not exit 0.

A profiler that crashes at exit one run in fifty fails a CI run in three; this counts such failures
over many complete jobs, each a fresh set of processes, and keeps the stderr of every failed one.

    python benchmarks/stress.py [--quick] [--runs 200] [--parallel 2] [--case NAME ...] [--json PATH]

--quick: one bench3 job; seconds, to see that it runs.

Cases (cycled in order until --runs jobs have run):
  bench3       commprof bench --backend mpi --nproc 3 (every collective, 8 B - 4 KiB)
  bench4       commprof bench --backend mpi --nproc 4
  bench3-algo  the same with --algo all (every hand-written algorithm beside the library's)
  bench4-algo
  run2         commprof run --backend mpi --nproc 2 --strategy mpi-dp --steps 4
  run3         commprof run --backend mpi --nproc 3 --strategy ddp --steps 4
  run3-gloo    commprof run --backend gloo --nproc 3 --strategy fsdp --steps 4 (gloo's worker threads)

--parallel jobs run at once, oversubscribing the cores on purpose: exit-order races show up under load.
The table gives runs and failures per case; --json keeps every failure's exit code and stderr tail.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from common import parse, parser

SMALL = ["-b", "8", "-e", "4K", "-f", "8", "-n", "3", "-w", "1", "--timeout", "120"]
CASES = {
    "bench3": ["bench", "--backend", "mpi", "--nproc", "3", *SMALL],
    "bench4": ["bench", "--backend", "mpi", "--nproc", "4", *SMALL],
    "bench3-algo": ["bench", "--backend", "mpi", "--nproc", "3", "--algo", "all", *SMALL],
    "bench4-algo": ["bench", "--backend", "mpi", "--nproc", "4", "--algo", "all", *SMALL],
    "run2": ["run", "--backend", "mpi", "--nproc", "2", "--strategy", "mpi-dp", "--steps", "4",
             "--eval-samples", "0", "--timeout", "120"],
    "run3": ["run", "--backend", "mpi", "--nproc", "3", "--strategy", "ddp", "--steps", "4",
             "--eval-samples", "0", "--timeout", "120"],
    "run3-gloo": ["run", "--backend", "gloo", "--nproc", "3", "--strategy", "fsdp", "--steps", "4",
                  "--eval-samples", "0", "--timeout", "120"],
}
JOB_TIMEOUT_S = 600
QUICK = {"runs": 1}
"""--quick: one job, of bench3 unless --case names others."""


def one(case: str) -> dict:
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "commprof", *CASES[case]], capture_output=True, text=True,
                              timeout=JOB_TIMEOUT_S)
        code, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, err = "timeout", (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
    return {"case": case, "rc": code, "wall_s": round(time.monotonic() - start, 2),
            "stderr_tail": err[-2000:] if code != 0 else ""}


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--case", action="append", choices=sorted(CASES), help="default: every case")
    args = parse(p, QUICK)
    cases = args.case or (["bench3"] if args.quick else list(CASES))
    order = [cases[i % len(cases)] for i in range(args.runs)]
    runs, fails = Counter(), Counter()
    failures = []
    start = time.monotonic()
    with ThreadPoolExecutor(args.parallel) as pool:
        for i, res in enumerate(pool.map(one, order), 1):
            runs[res["case"]] += 1
            if res["rc"] != 0:
                fails[res["case"]] += 1
                failures.append(res)
                last = res["stderr_tail"].strip().splitlines()[-1:] or [""]
                print(f"[{i}/{args.runs}] {res['case']}: rc {res['rc']}: {last[0][:200]}", flush=True)
            elif i % 20 == 0:
                print(f"[{i}/{args.runs}] {sum(fails.values())} failed so far", flush=True)
    wall = time.monotonic() - start
    print(f"\n{'case':<12} {'runs':>5} {'non-zero':>9}")
    for case in cases:
        print(f"{case:<12} {runs[case]:>5} {fails[case]:>9}")
    print(f"{'all':<12} {sum(runs.values()):>5} {sum(fails.values()):>9}   ({wall:.0f} s, {args.parallel} at once)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": dict(runs), "failures": failures, "wall_s": wall, "parallel": args.parallel}, f,
                      indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
