"""gpu_checks.py's `idioms` step: tests/scripts/modern_train.py's compiled modes on CUDA (NCCL, one rank), plain and
under `commprof profile`: exit codes, the losses to the bit, what profile counted (ops on NCCL's streams) and left
unseen, and how its count stands against torch's own flight record.
`OUT=out python3 benchmarks/gpu_checks.py idioms --device cpu --budget 150` runs them on gloo."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from gpu_steps.harness import ROOT, Budget, env_with_root, failed, record, sh

MODES = ("compile_ddp", "compiled_autograd", "compile_fsdp", "ddp_static")


def run(args, out: Path, budget: Budget) -> None:
    script = str(ROOT / "tests" / "scripts" / "modern_train.py")
    env = {**env_with_root(), "MODERN_DEVICE": args.device, "MODERN_BACKEND": "nccl" if args.device == "cuda"
           else "gloo"}
    for mode in MODES:
        if budget.left() < 30:
            record(out, "idioms", **{mode: {"skipped": f"{budget.left():.0f} s left"}})
            continue
        plain = sh([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", script, "--mode", mode],
                   min(90.0, budget.left() / 2), env)
        js = Path(tempfile.mkdtemp(prefix="gpu-idioms-")) / "out.json"
        prof = sh([sys.executable, "-m", "commprof", "profile", "--nproc", "1", "--json", str(js), script, "--mode",
                   mode], min(90.0, budget.left() - 3), env)
        entry = {"plain_rc": plain["rc"], "profiled_rc": prof["rc"],
                 "plain_loss": [x for x in plain["stdout"].split("\n") if " loss " in x],
                 "profiled_loss": [x for x in prof["stdout"].split("\n") if " loss " in x]}
        entry["same_loss"] = bool(entry["plain_loss"]) and entry["plain_loss"] == entry["profiled_loss"]
        if prof["rc"] != 0:
            entry["profiled"] = failed(prof)
        if plain["rc"] != 0:
            entry["plain"] = failed(plain)
        if js.exists():
            doc = json.loads(js.read_text())
            entry.update(clock=doc["env"].get("clock"), steps=doc["steps"], unseen=doc["unseen"],
                         volume={k: v["calls_per_step"] for k, v in doc["volume"].items()},
                         outside={k: v["calls"] for k, v in doc["outside_iterations"].items()})
            # what torch's own flight record holds beside commprof's count (profile/torch_record.py): every NCCL
            # op counted from the record, the unseen ones too, is what the record is there for
            fr = doc.get("torch_record") or {}
            entry["torch_record"] = {k: fr.get(k) for k in ("agree", "why", "in_neither", "volume")} if fr else None
        record(out, "idioms", **{mode: entry})
