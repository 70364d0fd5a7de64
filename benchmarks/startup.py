"""Start-up: whole-process wall time and CPU time of short commprof commands, this checkout against an older
commit, interleaved round by round on the same machine (medians; the machine is shared and noisy).

    python benchmarks/startup.py [--quick] [--baseline REV] [--rounds 7] [--commands help,bench,run]
                                 [--json benchmarks/results/startup-results.json]

REV (default: the commit before the start-up work) is checked out into a temporary git worktree; each
command runs with PYTHONPATH set to one checkout or the other (the worktree also gets a commprof/kernels
link, so the package resolves there rather than in the installed checkout). REV `.` is this checkout
itself, on both sides and with no worktree: an A/A comparison. --quick: `.`, one round of help;
seconds, to see that it runs. Commands:
  help    commprof --help
  bench   commprof bench all_reduce --nproc 2 -b 8 -e 8 -n 1 -w 0        one 8-byte op on 2 gloo ranks
  bench4  the same on 4 gloo ranks (more ranks than this machine's 2 cores)
  run     commprof run --strategy ddp --model mnist-cnn --steps 1 --warmup 0 --eval-samples 0 --nproc 2
Prints seconds per command and checkout and their ratio (of the medians), the median of the per-round
ratios with its 95 % CI (benchmarks/common.py's ratio_ci), for wall time and for CPU time (user + system of
the command and every process it waited for, its ranks included); also the launcher's peak memory for `help`.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, order, parse, parser, ratio_ci

COMMANDS = {
    "help": ["--help"],
    "bench": ["bench", "all_reduce", "--backend", "gloo", "--nproc", "2", "-b", "8", "-e", "8", "-n", "1", "-w", "0"],
    "bench4": ["bench", "all_reduce", "--backend", "gloo", "--nproc", "4", "-b", "8", "-e", "8", "-n", "1", "-w",
               "0"],
    "run": ["run", "--strategy", "ddp", "--model", "mnist-cnn", "--backend", "gloo", "--steps", "1", "--warmup", "0",
            "--eval-samples", "0", "--nproc", "2"],
}
BASELINE = "2e0c679"
"""The commit before the start-up work (lazy subcommands, a launcher without torch)."""
THIS = "."
"""--baseline's name for this checkout as it is: both sides the same code, no second checkout."""
QUICK = {"baseline": THIS, "rounds": 1, "commands": "help"}
"""--quick: this checkout against itself, one round of help."""
COMMAND_TIMEOUT_S = 300


def timed(checkout: Path, argv: list[str]) -> tuple[float, float]:
    """Seconds end to end for one command, and the CPU seconds it and the processes it waited for took."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # run from the checkout: `python -m` puts the working directory first on sys.path
    try:
        proc = subprocess.run([sys.executable, "-m", "commprof", *argv], env=env, capture_output=True, text=True,
                              cwd=checkout, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        sys.exit(f"startup: {checkout}: commprof {' '.join(argv)} gave no result within {COMMAND_TIMEOUT_S} s")
    seconds = time.perf_counter() - start
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [""])[-1]
        sys.exit(f"startup: {checkout}: commprof {' '.join(argv)} exited {proc.returncode}: {last}")
    return seconds, now.ru_utime - used.ru_utime + now.ru_stime - used.ru_stime


def help_rss(checkout: Path) -> int:
    """Peak RSS (KiB) of `commprof --help`, measured in a fresh process of its own."""
    probe = ("import resource, subprocess, sys; subprocess.run([sys.executable, '-m', 'commprof', '--help'], "
             "capture_output=True); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(checkout)},
                         capture_output=True, text=True, check=True, cwd=checkout, timeout=COMMAND_TIMEOUT_S)
    return int(out.stdout.strip())


def measure(checkouts: dict[str, Path], commands: list[str], rounds: int) -> tuple[dict, dict]:
    """(wall seconds, CPU seconds) per (checkout, command) over the rounds, the checkouts' order flipping every
    round; and each checkout's peak RSS for `help`."""
    times = {(c, k): [] for c in checkouts for k in commands}
    for r in range(rounds):
        for name in commands:
            for label, checkout in order(checkouts.items(), r):
                times[(label, name)].append(timed(checkout, COMMANDS[name]))
    return times, {label: help_rss(checkout) for label, checkout in checkouts.items()}


def main() -> int:
    p = parser(__doc__, json="startup-results.json")
    p.add_argument("--baseline", default=BASELINE, help=f"a git revision, or {THIS} for this checkout itself")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--commands", default=",".join(COMMANDS), help=f"of {', '.join(COMMANDS)}")
    args = parse(p, QUICK)
    commands = args.commands.split(",")
    if args.rounds < 1 or not set(commands) <= set(COMMANDS):
        p.error(f"--rounds must be at least 1, --commands of {', '.join(COMMANDS)}")
    if args.baseline == THIS:
        times, rss = measure({"before": ROOT, "after": ROOT}, commands, args.rounds)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp) / "baseline"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline],
                           check=True, capture_output=True)
            try:
                (base / "commprof" / "kernels").symlink_to("../kernels")
                times, rss = measure({"before": base, "after": ROOT}, commands, args.rounds)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                               capture_output=True)
    summary = {}
    print(f"{'command':8} {'':4} {'before (s)':>11} {'after (s)':>10} {'after/before':>13} {'per round, 95 % CI':>24}")
    for name in commands:
        summary[name] = {}
        for i, kind in enumerate(("wall", "cpu")):
            taken = {c: [t[i] for t in times[(c, name)]] for c in ("before", "after")}
            before, after = (statistics.median(taken[c]) for c in ("before", "after"))
            paired = ratio_ci(taken["after"], taken["before"])
            key = "" if kind == "wall" else "cpu_"  # wall time's keys as they were before CPU time was measured
            summary[name] |= {f"{key}before_s": round(before, 3), f"{key}after_s": round(after, 3),
                              f"{key}ratio": round(after / before, 3), f"{key}paired_ratio": round(paired["ratio"], 3),
                              f"{key}paired_ratio_ci95": paired["ci95"]}
            lo, hi = paired["ci95"]
            print(f"{name:8} {kind:4} {before:11.2f} {after:10.2f} {after / before:13.2f} "
                  f"{paired['ratio']:9.2f} [{lo:.2f}, {hi:.2f}]")
    print(f"commprof --help peak RSS: before {rss['before'] / 1024:.0f} MiB, after {rss['after'] / 1024:.0f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "baseline": args.baseline, "rounds": args.rounds, "summary": summary,
            "help_peak_rss_kib": rss, "times_s": {f"{c}/{k}": v for (c, k), v in times.items()},
            "argv": ["python", *sys.argv]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
