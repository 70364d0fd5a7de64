"""What gpu_checks.py's steps share: the results file every step adds its key to, and child processes under the
step's deadline (common.capture, logged as they end). Exercised by `OUT=out python3 benchmarks/gpu_checks.py
straggler --device cpu`."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import common

ROOT = common.ROOT
BENCH = ROOT / "benchmarks"
SCRIPT = BENCH / "gpu_checks.py"
"""The entry the steps start again in a child: `--calibrate`, `--straggler-script`, `--hta-analyze`."""
RESULTS = "gpu-session.json"
STEPS = ("tests", "truth", "hta", "straggler", "cost", "idioms", "nsys")


def log(*parts) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


# ---- the results file: every step adds its own key, written whole each time -------------------------------
def clean(x):
    """JSON without NaN or infinities (HTA gives NaN where it finds no communication kernel)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):  # numpy scalars
        try:
            return clean(x.item())
        except (TypeError, ValueError):
            pass
    return x


def record(out: Path, step: str, **values) -> None:
    """Merge `values` into OUT/gpu-session.json under `step`: what a step has found survives its later failure."""
    path = out / RESULTS
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        doc = {}
    doc.setdefault("steps", {}).setdefault(step, {}).update(clean(values))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


# ---- child processes under a deadline ---------------------------------------------------------------------
class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def on_term(signum, _frame) -> None:
    # the session's timeout stops this step: its children go with it, and the step says so
    common.stop(list(common.RUNNING), group=True)
    raise SystemExit(f"stopped by signal {signum}")


def sh(argv: list[str], timeout_s: float, env: dict | None = None) -> dict:
    """Run argv (its own session, output to files) for at most timeout_s: rc (None when stopped at the deadline),
    wall_s, stdout, stderr. Its output goes to the log as well."""
    env = dict(os.environ if env is None else env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    log("$", " ".join(argv), f"(≤ {timeout_s:.0f} s)")
    # a step may reckon a deadline already past: the child still gets a second to say why it cannot start
    res = common.capture(argv, timeout_s=max(1.0, timeout_s), env=env, cwd=ROOT)
    for name in ("stdout", "stderr"):
        lines = res[name].splitlines()
        if lines:
            print(f"  --- {name} ({len(lines)} lines{', last 80' if len(lines) > 80 else ''})")
            print("\n".join("  | " + line for line in lines[-80:]), flush=True)
    log(f"  rc {res['rc'] if res['rc'] is not None else 'stopped at the deadline'}, {res['wall_s']:.1f} s")
    return res


def failed(res: dict) -> dict:
    """What a failed command leaves in the results: its status and the tail of its stderr."""
    return {"rc": res["rc"], "wall_s": res["wall_s"], "timed_out": res["rc"] is None,
            "stderr_tail": res["stderr"][-2500:], "stdout_tail": res["stdout"][-1000:]}


def env_with_root() -> dict:
    """This checkout first on PYTHONPATH, and none of a launcher's variables: a child starts a job of its own."""
    env = common.with_root()
    env["PYTHONUNBUFFERED"] = "1"
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def commprof(*argv: str, timeout_s: float) -> dict:
    return sh([sys.executable, "-m", "commprof", *argv], timeout_s, env_with_root())


def last_json_line(text: str):
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON line in the output")
