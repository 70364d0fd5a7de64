"""Launch `python -m commprof bench|run …` with random invalid argv and check how each ends: exit 2, one
`commprof: error:` line on stderr, no traceback, no process left behind.

    python tests/support/fuzz_launch.py [-n 24] [--seed S] [--timeout 60]

The argv come from tests/cli_fuzz.py's grammar, the one tests/unit/test_cli_grammar.py fuzzes in-process, and
are kept only when that in-process check rejects them: no launch should get as far as starting a rank.
Every process carries a tag in its environment, so that one left behind is found (and killed) however
it was started. The launches run one at a time from an empty temporary folder; the same --seed draws
the same argv. Prints one line per launch, then a summary; exit 1 if any launch failed.
Exercised by: `python tests/support/fuzz_launch.py`.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for cli_fuzz

from cli_fuzz import TAG, invalid_argv, leftovers, problem  # noqa: E402
from spawn import commprof, env_for_tests  # noqa: E402


def launch(argv: list[str], timeout: float) -> tuple[str | None, str]:
    """(what went wrong or None, the stderr line) for one real `python -m commprof <argv>`."""
    tag = uuid.uuid4().hex
    try:
        proc = commprof(*argv, env=env_for_tests(**{TAG: tag}), timeout=timeout)
        wrong = problem(proc.returncode, proc.stderr)
        if wrong is None and proc.returncode != 2:  # 0: the in-process check and the real command disagree
            wrong = f"exit {proc.returncode}: accepted, though rejected in-process"
        said = proc.stderr.strip()
    except subprocess.TimeoutExpired:
        wrong, said = f"still running after {timeout:g} s", ""
    left = leftovers(tag)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        wrong = f"{wrong + '; ' if wrong else ''}{len(left)} process(es) left behind: {left}"
    return wrong, said


def shown(argv: list[str]) -> str:
    """argv as a Python list (newlines and control characters escaped), long words cut short."""
    return "[" + ", ".join(repr(w) if len(w) <= 40 else f"{w[:20]!r}…({len(w)} chars)" for w in argv) + "]"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=24, help="launches (default 24)")
    p.add_argument("--seed", type=int, help="draws the argv (default: a random one, printed)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds one launch may take (default 60)")
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    print(f"seed {seed}: drawing {args.n} invalid argv", flush=True)
    argvs = invalid_argv(args.n, seed_value=seed)
    failures = []
    with tempfile.TemporaryDirectory(prefix="commprof-fuzz-") as where:
        os.chdir(where)  # a launch that wrongly went on would write its files here, not into the checkout
        for i, argv in enumerate(argvs, 1):
            start = time.monotonic()
            wrong, said = launch(argv, args.timeout)
            print(f"[{i:2d}/{len(argvs)}] {'FAIL' if wrong else 'ok  '} {time.monotonic() - start:5.1f} s  "
                  f"{shown(argv)}\n          {(wrong or said)[:200]!r}", flush=True)
            if wrong:
                failures.append((argv, wrong))
    print(f"\nlaunches: {len(argvs)}, passed: {len(argvs) - len(failures)}, failed: {len(failures)} (seed {seed})")
    for argv, wrong in failures:
        print(f"  {shown(argv)}: {wrong}")
    return 1 if failures or len(argvs) < args.n else 0


if __name__ == "__main__":
    sys.exit(main())
