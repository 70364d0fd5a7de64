"""Start-up: whole-process wall time of short commprof commands, this checkout against an older commit,
interleaved round by round on the same machine (medians; the machine is shared and noisy).

    python benchmarks/startup.py [--baseline REV] [--rounds 7] [--json benchmarks/results/startup-results.json]

REV (default: the commit before the start-up work) is checked out into a temporary git worktree; each
command runs with PYTHONPATH set to one checkout or the other (the worktree also gets a commprof/kernels
link, so the package resolves there rather than in the installed checkout). Commands:
  help    commprof --help
  bench   commprof bench all_reduce --nproc 2 -b 8 -e 8 -n 1 -w 0        one 8-byte op on 2 gloo ranks
  run     commprof run --strategy ddp --model mnist-cnn --steps 1 --warmup 0 --eval-samples 0 --nproc 2
Prints seconds per command and checkout and their ratio; also the launcher's peak memory for `help`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
COMMANDS = {
    "help": ["--help"],
    "bench": ["bench", "all_reduce", "--backend", "gloo", "--nproc", "2", "-b", "8", "-e", "8", "-n", "1", "-w", "0"],
    "run": ["run", "--strategy", "ddp", "--model", "mnist-cnn", "--backend", "gloo", "--steps", "1", "--warmup", "0",
            "--eval-samples", "0", "--nproc", "2"],
}
BASELINE = "2e0c679"
"""The commit before the start-up work (lazy subcommands, a launcher without torch)."""


def timed(checkout: Path, argv: list[str]) -> float:
    """Seconds end to end for one command."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.perf_counter()
    # run from the checkout: `python -m` puts the working directory first on sys.path
    proc = subprocess.run([sys.executable, "-m", "commprof", *argv], env=env, capture_output=True, text=True,
                          cwd=checkout)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{checkout}: commprof {' '.join(argv)} exited {proc.returncode}: {proc.stderr[-500:]}")
    return seconds


def help_rss(checkout: Path) -> int:
    """Peak RSS (KiB) of `commprof --help`, measured in a fresh process of its own."""
    probe = ("import resource, subprocess, sys; subprocess.run([sys.executable, '-m', 'commprof', '--help'], "
             "capture_output=True); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(checkout)},
                         capture_output=True, text=True, check=True, cwd=checkout)
    return int(out.stdout.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", default=str(HERE / "benchmarks" / "results" / "startup-results.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", str(base), args.baseline],
                       check=True, capture_output=True)
        try:
            (base / "commprof" / "kernels").symlink_to("../kernels")
            checkouts = {"before": base, "after": HERE}
            times = {(c, k): [] for c in checkouts for k in COMMANDS}
            for r in range(args.rounds):
                order = list(checkouts.items()) if r % 2 == 0 else list(reversed(checkouts.items()))
                for name, argv in COMMANDS.items():
                    for label, checkout in order:
                        times[(label, name)].append(timed(checkout, argv))
            rss = {label: help_rss(checkout) for label, checkout in checkouts.items()}
        finally:
            subprocess.run(["git", "-C", str(HERE), "worktree", "remove", "--force", str(base)], capture_output=True)
    summary = {}
    print(f"{'command':8} {'before (s)':>11} {'after (s)':>10} {'after/before':>13}")
    for name in COMMANDS:
        before, after = (statistics.median(times[(c, name)]) for c in ("before", "after"))
        summary[name] = {"before_s": round(before, 3), "after_s": round(after, 3), "ratio": round(after / before, 3)}
        print(f"{name:8} {before:11.2f} {after:10.2f} {after / before:13.2f}")
    print(f"commprof --help peak RSS: before {rss['before'] / 1024:.0f} MiB, after {rss['after'] / 1024:.0f} MiB")
    Path(args.json).write_text(json.dumps({
        "baseline": args.baseline, "rounds": args.rounds, "summary": summary,
        "help_peak_rss_kib": rss, "times_s": {f"{c}/{k}": v for (c, k), v in times.items()},
        "argv": ["python", *sys.argv]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
