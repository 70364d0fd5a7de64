"""gpu_checks.py's `nsys` step: `nsys profile --trace=cuda,nvtx` of a `commprof run` (DDP, 2 gloo ranks on CUDA
tensors), with the CLI carried as .nsys-target/nsys-target.tar.xz (tools/pack_nsys_target.sh): the raw report
(.qdstrm, xz) comes back as OUT/nsys-run.qdstrm.xz, imported where nsys's host part is.
`OUT=out python3 benchmarks/gpu_checks.py nsys --budget 120`."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from gpu_steps.harness import ROOT, Budget, env_with_root, failed, record, sh


def run(args, out: Path, budget: Budget) -> None:
    packed = ROOT / ".nsys-target" / "nsys-target.tar.xz"
    if not packed.exists():
        record(out, "nsys", skipped=f"{packed.relative_to(ROOT)} was not carried (tools/pack_nsys_target.sh)")
        return
    where = Path(tempfile.mkdtemp(prefix="nsys-target-"))
    res = sh(["tar", "-xJf", str(packed), "-C", str(where)], 60.0)
    nsys = next(where.glob("*/bin/nsys"), None)
    if res["rc"] != 0 or nsys is None:
        record(out, "nsys", unpack=failed(res))
        return
    version = sh([str(nsys), "--version"], 20.0)
    # the packed nsys (2023.4) brings CUPTI 12.4, which records no kernel of a CUDA 13 process: the machine's
    # own CUPTI in its place (seen on an H200 with CUDA 13.0: the kernels recorded, NVTX as before)
    own = sorted(Path("/usr/local").glob("cuda*/targets/x86_64-linux/lib/libcupti.so.*"))
    if own:
        (nsys.parent.parent / "target-linux-x64" / "libcupti.so.12.4").write_bytes(own[-1].read_bytes())
    record(out, "nsys", version=version["stdout"].strip()[:200], cupti=str(own[-1]) if own else "packed 12.4")
    report = Path(tempfile.mkdtemp(prefix="nsys-run-")) / "run"
    job = ["-m", "commprof", "run", "--strategy", "ddp", "--model", "resnet18", "--backend", "gloo", "--nproc", "2",
           "--device", args.device, "--steps", "6", "--warmup", "2", "--batch-size", "32", "--eval-samples", "0"]
    res = sh([str(nsys), "profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "-o", str(report),
              "--force-overwrite", "true", sys.executable, *job], budget.left() - 25, env_with_root())
    got = {"rc": res["rc"], "wall_s": res["wall_s"], "stdout_tail": res["stdout"][-1500:],
           "stderr_tail": res.get("stderr", "")[-1500:]}
    raw = next(report.parent.glob("*.qdstrm"), None) or next(report.parent.glob("*.nsys-rep"), None)
    if raw is not None:
        sh(["xz", "-T0", "-6", str(raw)], budget.left() - 3)
        packed_out = raw.with_name(raw.name + ".xz")
        if packed_out.exists() and packed_out.stat().st_size < 16 * 2**20:
            target = out / f"nsys-run{raw.suffix}.xz"
            target.write_bytes(packed_out.read_bytes())
            got["report"] = target.name
        got["report_bytes"] = packed_out.stat().st_size if packed_out.exists() else None
    record(out, "nsys", **got)
