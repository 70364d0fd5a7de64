"""gpu_checks.py's `tests` step: `python3 -m pytest -m gpu`, its passed, failed and skipped, and each failure's name
and message, from pytest's JUnit report. `OUT=out python3 benchmarks/gpu_checks.py tests --budget 150`."""

from __future__ import annotations

import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from gpu_steps.harness import Budget, env_with_root, failed, record, sh


def run(args, out: Path, budget: Budget) -> None:
    junit = Path(tempfile.mkdtemp(prefix="gpu-junit-")) / "junit.xml"
    # a test module that fails to import elsewhere in the suite does not stop the GPU tests from running
    res = sh([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rfEs",
              "--continue-on-collection-errors", f"--junitxml={junit}"], budget.left() - 3, env_with_root())
    summary = next((line.strip("= ") for line in reversed(res["stdout"].splitlines()) if " in " in line
                    and any(w in line for w in ("passed", "failed", "skipped", "error", "deselected"))), None)
    got = {"rc": res["rc"], "pytest_wall_s": res["wall_s"], "summary": summary}
    if junit.exists():
        cases = ET.parse(junit).getroot().iter("testcase")
        counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        bad, durations = [], {}
        for case in cases:
            name = f"{case.get('classname')}::{case.get('name')}"
            durations[name] = float(case.get("time") or 0)
            kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
            kind = {"failure": "failed"}.get(kinds[0], kinds[0]) if kinds else "passed"
            counts[kind] += 1
            if kind in ("failed", "error"):
                child = next(c for c in case if c.tag in ("failure", "error"))
                bad.append({"test": name, "kind": kind, "message": (child.get("message") or "")[:600],
                            "detail_tail": (child.text or "")[-1500:]})
            elif kind == "skipped":
                why = case.find("skipped").get("message") or ""
                bad.append({"test": name, "kind": "skipped", "message": why[:300]})
        got.update(counts=counts, not_passed=bad, durations_s=durations)
    else:
        got.update(failed(res), note="no junit report: pytest did not finish")
    record(out, "tests", **got)
