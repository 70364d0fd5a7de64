"""One short session of commprof's CUDA checks on one GPU, each step a process of its own that records what
it found into OUT/gpu-session.json (a step that fails records its error; the others still run):

  tests      `python3 -m pytest -m gpu`: passed, failed, skipped, and each failure's name and message
  truth      `benchmarks/gpu_truth.py --quick`, a run per part (OUT/gpu-truth-<part>.json; its worst figures here)
  hta        Holistic Trace Analysis on a real CUDA Kineto trace: `commprof run --torch-profiler` of a
             ResNet-18 DDP job (2 gloo ranks on CUDA tensors; NCCL at 1 rank), HTA's temporal breakdown and
             comm/compute overlap beside commprof's own split of the same run
  straggler  `commprof profile` of a CUDA DDP script whose rank 1 runs a calibrated torch.cuda._sleep kernel
             before every backward (2 gloo ranks on CUDA tensors): the rank the findings name, and the cost
             they give it against the delay injected (and against the delay as the device ran it)
  cost       what `commprof profile` costs DDP and FSDP2 on CUDA tensors (benchmarks/profile_cost.py's jobs:
             plain, plain again, profiled, interleaved): per-round ratios and the A/A ratio
  idioms     tests/scripts/modern_train.py's compiled modes on CUDA (NCCL, one rank): plain and profiled,
             the losses to the bit and what profile counted and left unseen
  nsys       `nsys profile --trace=cuda,nvtx` of a `commprof run` (DDP, 2 gloo ranks on CUDA tensors), with
             the CLI carried as .nsys-target/nsys-target.tar.xz (tools/pack_nsys_target.sh): the raw
             report (.qdstrm, xz) comes back as OUT/nsys-run.qdstrm.xz, imported where nsys's host part is

    OUT=out python3 benchmarks/gpu_checks.py tests --budget 150     # one step; benchmarks/gpu_session.sh runs all
    OUT=out python3 benchmarks/gpu_checks.py hta --device cpu       # the same steps on CPU tensors, no CUDA
    python3 benchmarks/gpu_checks.py --quick --json out.json          # the straggler step (exit 77 without a GPU)

--budget S: the step's wall-time allowance; it starts nothing it cannot finish within it, and stops what
runs past it. --device cpu (or GPU_CHECKS_DEVICE=cpu): CPU tensors where a step can use them, the CUDA-only
parts recorded as skipped. Each step is a module of benchmarks/gpu_steps/; this file is their command line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from gpu_steps.harness import RESULTS, SCRIPT, STEPS, Budget, clean, log, on_term, record


def quick(argv: list[str]) -> None:
    """`--quick --json PATH`, as every benchmark takes it: the straggler step alone on a GPU, its record written
    to PATH; without a CUDA GPU, one line and exit 77 (benchmarks/common.py's SKIP)."""
    from commprof.base.backends import cuda_devices

    if not cuda_devices():
        sys.exit(print("gpu_checks: no CUDA GPU is visible: it runs on a GPU machine "
                       "(benchmarks/gpu_session.sh)", file=sys.stderr) or 77)
    path = Path(argv[argv.index("--json") + 1]) if "--json" in argv else Path("gpu-checks.json")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, str(SCRIPT), "straggler", "--out", tmp, "--budget", "90"], check=True)
        path.write_text((Path(tmp) / RESULTS).read_text())


def child(argv: list[str]) -> bool:
    """The processes a step starts from this script again, ahead of its command line: True when argv was one."""
    if argv[:1] == ["--straggler-script"]:
        from gpu_steps.straggler import straggler_script

        straggler_script(argv[1:])
    elif argv[:1] == ["--calibrate"]:
        from gpu_steps.straggler import calibrate_worker

        calibrate_worker()
    elif len(argv) > 1 and argv[0] == "--hta-analyze":
        from gpu_steps.hta import analyze

        print(json.dumps(clean(analyze(argv[1]))), flush=True)
    else:
        return False
    return True


def main() -> None:
    if "--quick" in sys.argv[1:2]:
        return quick(sys.argv[1:])
    if child(sys.argv[1:]):
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=(*STEPS, "env", "note", "summary"))
    p.add_argument("text", nargs="*", help="note: the step, then what to record of it")
    p.add_argument("--out", default=os.environ.get("OUT"), help="results folder (default: $OUT)")
    p.add_argument("--budget", type=float, default=120.0, help="seconds the step may take (default 120)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=os.environ.get("GPU_CHECKS_DEVICE", "cuda"))
    p.add_argument("--steps", type=int, default=8, help="hta: the run's steps, 3 of them warm-up (default 8)")
    p.add_argument("--straggler-steps", type=int, default=14, help="straggler: the script's steps (default 14)")
    p.add_argument("--rounds", type=int, default=3, help="cost: interleaved rounds (default 3)")
    p.add_argument("--cost-steps", type=int, default=12, help="cost: steps per workload per job (default 12)")
    p.add_argument("--cost-warmup", type=int, default=3, help="cost: of them untimed (default 3)")
    args = p.parse_args()
    if not args.out:
        p.error("no results folder: set OUT or give --out")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.step == "note":
        if len(args.text) < 2:
            p.error("note: STEP TEXT")
        record(out, args.text[0], session_note=" ".join(args.text[1:]))
        return
    if args.step in ("summary", "env"):
        from gpu_steps.summary import environment, headline

        path = out / RESULTS
        doc = json.loads(path.read_text()) if path.exists() else {}
        if args.step == "summary":
            print("\n".join(headline(doc)), flush=True)
            return
        doc["env"] = clean(environment(args))
        path.write_text(json.dumps(doc, indent=1) + "\n")
        log("env:", json.dumps(doc["env"]))
        return
    signal.signal(signal.SIGTERM, on_term)
    budget = Budget(args.budget)
    t0 = time.monotonic()
    log(f"step {args.step}: device {args.device}, budget {args.budget:.0f} s")
    record(out, args.step, started=time.strftime("%H:%M:%S"), budget_s=args.budget)
    try:
        importlib.import_module(f"gpu_steps.{args.step}").run(args, out, budget)
    except BaseException as exc:  # the step says why it stopped; the session goes on to the next
        record(out, args.step, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
        log(f"step {args.step} failed: {type(exc).__name__}: {exc}")
    finally:
        record(out, args.step, wall_s=round(time.monotonic() - t0, 1))
        log(f"step {args.step} done in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
