"""gpu_checks.py's `truth` step: `benchmarks/gpu_truth.py --quick`, a run per part into OUT/gpu-truth-<part>.json,
and each part's worst figures in the session's results. `OUT=out python3 benchmarks/gpu_checks.py truth`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpu_steps.harness import BENCH, Budget, env_with_root, failed, record, sh

PARTS = ("split", "run", "timing")
"""gpu_truth's parts, each its own run and file, so one that runs out of time loses only itself; the split on
calibrated kernels first."""


def brief(part: str, doc: dict) -> dict:
    """The worst figures of one part of gpu_truth's results (the whole file comes back beside this one)."""
    if part == "timing":
        return {"timing": [{"backend": t["backend"], "nproc": t["nproc"], "worst": t["worst"],
                            "wall_ratio": t["wall_ratio"],
                            "ratios": {f"{r['collective']} {r['nbytes']} {'in' if r['inplace'] else 'out'}": r["ratio"]
                                       for r in t["rows"]}} for t in doc["timing"]]}
    if part == "split":
        return {"split": [{"comm": s["comm"], "error": s["error"], "worst": s["worst"]} for s in doc["split"]]}
    runs = doc["run"]["runs"]
    return {"run": {k: {"summary": v["summary"], "peak_over_plain": v.get("peak_over_plain"),
                        "syncs": v.get("syncs")} for k, v in runs.items()},
            "plain": {k: v for k, v in doc["run"]["plain"].items() if k != "syncs"}}


def run(args, out: Path, budget: Budget) -> None:
    for i, part in enumerate(PARTS):
        later = 20 * (len(PARTS) - 1 - i)  # the parts after this one start, at least
        if budget.left() - later < 15:
            record(out, "truth", **{part: {"skipped": f"{budget.left():.0f} s left of the step's budget"}})
            continue
        target = out / f"gpu-truth-{part}.json"
        res = sh([sys.executable, str(BENCH / "gpu_truth.py"), "--quick", "--parts", part, "--json", str(target)],
                 budget.left() - 3 - later, env_with_root())
        if res["rc"] == 77:
            record(out, "truth", skipped=res["stderr"].strip()[-300:], rc=77)
            return
        if res["rc"] != 0 or not target.exists():
            record(out, "truth", **{part: failed(res)})
            continue
        got = {"rc": 0, "wall_s": res["wall_s"], "file": target.name}
        try:
            got.update(brief(part, json.loads(target.read_text())))
        except (KeyError, TypeError, ValueError) as exc:
            got["brief_error"] = repr(exc)
        record(out, "truth", **{part: got})
