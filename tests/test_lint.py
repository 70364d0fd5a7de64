"""The code keeps the habits pyproject.toml's [tool.ruff] names: lines of at most 120 characters, sorted
imports, no unused names, no undefined ones — in commprof/, kernels/, tests/, tools/ and benchmarks/."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "commprof", "kernels", "tests",
                           "tools", "benchmarks"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
