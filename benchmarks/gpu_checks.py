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
parts recorded as skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
RESULTS = "gpu-session.json"
STEPS = ("tests", "truth", "hta", "straggler", "cost", "idioms", "nsys")
DELAY_MS = 20.0
"""The straggler's injected delay, as tests/test_findings.py injects it on CPU."""
TOLERANCE = 0.15

_children: list[subprocess.Popen] = []


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


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the child's whole session (commprof's launcher passes it on to its ranks), SIGKILL after 5 s."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass


def _on_term(signum, _frame) -> None:
    # the session's timeout stops this step: its children go with it, and the step says so
    for proc in list(_children):
        _stop(proc)
    raise SystemExit(f"stopped by signal {signum}")


def sh(argv: list[str], timeout_s: float, env: dict | None = None) -> dict:
    """Run argv (its own session, output to files) for at most timeout_s: rc (None when stopped at the deadline),
    wall_s, stdout, stderr. Its output goes to the log as well."""
    env = dict(os.environ if env is None else env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    log("$", " ".join(argv), f"(≤ {timeout_s:.0f} s)")
    with tempfile.TemporaryDirectory(prefix="gpu-checks-") as tmp:
        out, err = open(Path(tmp) / "out", "w+"), open(Path(tmp) / "err", "w+")
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        _children.append(proc)
        try:
            rc = proc.wait(max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            _stop(proc)
            rc = None
        finally:
            _children.remove(proc)
        wall = time.monotonic() - t0
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
        out.close(), err.close()
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        lines = text.splitlines()
        if lines:
            print(f"  --- {name} ({len(lines)} lines{', last 80' if len(lines) > 80 else ''})")
            print("\n".join("  | " + line for line in lines[-80:]), flush=True)
    log(f"  rc {rc if rc is not None else 'stopped at the deadline'}, {wall:.1f} s")
    return {"rc": rc, "wall_s": round(wall, 2), "stdout": stdout, "stderr": stderr}


def failed(res: dict) -> dict:
    """What a failed command leaves in the results: its status and the tail of its stderr."""
    return {"rc": res["rc"], "wall_s": res["wall_s"], "timed_out": res["rc"] is None,
            "stderr_tail": res["stderr"][-2500:], "stdout_tail": res["stdout"][-1000:]}


def env_with_root() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
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


# ---- step: the repo's GPU tests ---------------------------------------------------------------------------
def step_tests(args, out: Path, budget: Budget) -> None:
    import xml.etree.ElementTree as ET

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


# ---- step: gpu_truth.py --quick ---------------------------------------------------------------------------
TRUTH_PARTS = ("split", "run", "timing")
"""gpu_truth's parts, each its own run and file, so one that runs out of time loses only itself; the split on
calibrated kernels first."""


def truth_brief(part: str, doc: dict) -> dict:
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


def step_truth(args, out: Path, budget: Budget) -> None:
    for i, part in enumerate(TRUTH_PARTS):
        later = 20 * (len(TRUTH_PARTS) - 1 - i)  # the parts after this one start, at least
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
            got.update(truth_brief(part, json.loads(target.read_text())))
        except (KeyError, TypeError, ValueError) as exc:
            got["brief_error"] = repr(exc)
        record(out, "truth", **{part: got})


# ---- step: Holistic Trace Analysis on a CUDA trace --------------------------------------------------------
def hta_analyze(trace_dir: str) -> dict:
    """HTA's own figures for one trace folder (run in a child process: HTA parses with a pool of workers)."""
    import hta
    from hta.trace_analysis import TraceAnalysis
    from hta.utils.utils import KernelType, get_kernel_type, merge_kernel_intervals

    t0 = time.monotonic()
    analysis = TraceAnalysis(trace_dir=trace_dir)
    got: dict = {"hta_version": hta.__version__, "parse_s": round(time.monotonic() - t0, 2),
                 "ranks": sorted(int(r) for r in analysis.t.traces)}
    for name, call in (("temporal_breakdown", analysis.get_temporal_breakdown),
                       ("comm_comp_overlap", analysis.get_comm_comp_overlap)):
        try:
            got[name] = call(visualize=False).to_dict(orient="records")
        except Exception as exc:  # HTA fails on a rank with no kernel of a kind: say so, keep the rest
            got[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
    # the same classification HTA uses (kernel names: nccl* communication, Memcpy/Memset memory, the rest
    # compute), totalled in µs per rank, so its figures can be put per iteration beside commprof's
    sym = analysis.t.symbol_table.get_sym_table()
    per_rank = {}
    for rank, df in analysis.t.traces.items():
        kernels = df[df["stream"].ne(-1)].copy()
        kernels["kernel_type"] = [get_kernel_type(sym[int(n)]) for n in kernels["name"]]
        merged = {kind: merge_kernel_intervals(kernels[kernels["kernel_type"].eq(kind.name)].copy())
                  for kind in (KernelType.COMMUNICATION, KernelType.COMPUTATION, KernelType.MEMORY)}
        busy = {kind.name.lower(): float((m["end"] - m["ts"]).sum()) for kind, m in merged.items()}
        comm, comp = merged[KernelType.COMMUNICATION], merged[KernelType.COMPUTATION]
        overlap, j = 0.0, 0
        comp_rows = list(zip(comp["ts"], comp["end"]))
        for a, b in zip(comm["ts"], comm["end"]):  # both lists sorted and disjoint within themselves
            while j < len(comp_rows) and comp_rows[j][1] <= a:
                j += 1
            k = j
            while k < len(comp_rows) and comp_rows[k][0] < b:
                overlap += max(0.0, min(b, comp_rows[k][1]) - max(a, comp_rows[k][0]))
                k += 1
        names = kernels[kernels["kernel_type"].eq(KernelType.COMMUNICATION.name)]["name"]
        steps = sorted({int(i) for i in df["iteration"].unique() if int(i) >= 0}) if "iteration" in df else []
        per_rank[int(rank)] = {
            "kernels": {k.lower(): int(v) for k, v in kernels["kernel_type"].value_counts().items()},
            "busy_us": busy, "comm_compute_overlap_us": overlap, "iterations": steps,
            "comm_kernel_names": sorted({sym[int(n)] for n in names})[:8],
            "span_us": float(kernels["ts"].add(kernels["dur"]).max() - kernels["ts"].min()) if len(kernels) else 0.0,
        }
    got["per_rank"] = per_rank
    return got


def compare_split(doc: dict, hta_got: dict) -> list[dict]:
    """Per rank: commprof's per-iteration split (its JSON) beside HTA's kernel totals divided by the measured
    iterations (the Kineto trace holds exactly those), and their ratio where both are non-zero."""
    measured = doc["steps"]["measured"]
    rows = []
    overlap_pct = {int(r["rank"]): r.get("comp_comm_overlap_pctg") for r in hta_got.get("comm_comp_overlap", [])}
    for own in doc["summary"]["per_rank"]:
        rank = int(own["rank"])
        theirs = hta_got["per_rank"].get(rank) or hta_got["per_rank"].get(str(rank))
        if theirs is None:
            continue
        per_it = {"comm_kernel_ms": theirs["busy_us"]["communication"] / 1e3 / measured,
                  "compute_kernel_ms": theirs["busy_us"]["computation"] / 1e3 / measured,
                  "memory_kernel_ms": theirs["busy_us"]["memory"] / 1e3 / measured,
                  "overlap_ms": theirs["comm_compute_overlap_us"] / 1e3 / measured,
                  "exposed_comm_ms": (theirs["busy_us"]["communication"] - theirs["comm_compute_overlap_us"])
                  / 1e3 / measured,
                  "overlap_pct": overlap_pct.get(rank)}
        mine = {k: own.get(k) for k in ("wall_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "overlap_ms",
                                         "overlap_pct")}
        pairs = {"comm": ("comm_kernel_ms", "comm_ms"), "exposed_comm": ("exposed_comm_ms", "exposed_comm_ms"),
                 "overlap": ("overlap_ms", "overlap_ms"), "overlap_pct": ("overlap_pct", "overlap_pct"),
                 "compute": ("compute_kernel_ms", "compute_ms")}
        ratio = {k: (per_it[a] / mine[b] if per_it[a] and mine[b] else None) for k, (a, b) in pairs.items()}
        rows.append({"rank": rank, "measured_iterations": measured, "hta_per_iteration": per_it,
                     "commprof_per_iteration": mine, "hta_over_commprof": ratio})
    return rows


def step_hta(args, out: Path, budget: Budget) -> None:
    try:
        import hta  # noqa: F401  (only to say early that it is missing; the analysis runs in a child)
    except ImportError as exc:
        record(out, "hta", hta_import_error=repr(exc))
    cuda = args.device == "cuda"
    model = ["--model", "resnet18", "--batch-size", "32"] if cuda else ["--model", "mnist-cnn", "--batch-size", "8"]
    runs = [("gloo-cuda-2ranks" if cuda else "gloo-cpu-2ranks",
             ["--backend", "gloo", "--device", args.device, "--nproc", "2"])]
    if cuda:
        runs.append(("nccl-1rank", ["--backend", "nccl", "--nproc", "1"]))
    else:
        record(out, "hta", skipped_nccl="no CUDA (--device cpu)")
    tmp = Path(tempfile.mkdtemp(prefix="gpu-hta-"))
    for i, (label, flags) in enumerate(runs):
        if budget.left() < 30:
            record(out, "hta", **{label: {"skipped": f"{budget.left():.0f} s left of the step's budget"}})
            continue
        kin, js = tmp / f"kineto-{label}", tmp / f"{label}.json"
        later = 35 * (len(runs) - 1 - i)  # a run and its analysis after this one
        res = commprof("run", "--strategy", "ddp", *flags, *model, "--steps", str(args.steps), "--warmup", "3",
                       "--eval-samples", "0", "--json", str(js), "--torch-profiler", str(kin),
                       timeout_s=budget.left() - 20 - later)
        if res["rc"] != 0 or not js.exists():
            record(out, "hta", **{label: {"run": failed(res)}})
            continue
        doc = json.loads(js.read_text())
        traces = sorted(p.name for p in kin.glob("*.json"))
        entry = {"run": {"wall_s": res["wall_s"], "config": {k: doc["config"].get(k) for k in
                                                               ("strategy", "model", "backend", "device",
                                                                "batch_size", "steps", "warmup", "bucket_mb")},
                         "steps": doc["steps"], "summary": {k: v for k, v in doc["summary"].items()
                                                            if k not in ("across_ranks",)},
                         "clock": doc["env"].get("clock")},
                 "traces": traces}
        for name in traces:  # what the trace holds for HTA: its distributedInfo and the ProfilerSteps
            trace = json.loads((kin / name).read_text())
            ev = trace.get("traceEvents", [])
            kernels = [str(e.get("name")) for e in ev if e.get("cat") == "kernel"]
            entry.setdefault("trace_facts", {})[name] = {
                "distributedInfo": trace.get("distributedInfo"),
                "profiler_steps": sorted({e["name"] for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")}),
                "kernels": len(kernels), "nccl_kernels": sum(1 for k in kernels if k.startswith("nccl")),
                "gpu_memcpy": sum(1 for e in ev if e.get("cat") == "gpu_memcpy")}
        record(out, "hta", **{label: entry})
        analysed = sh([sys.executable, __file__, "--hta-analyze", str(kin)], min(60.0, budget.left() - 3 - later),
                      env_with_root())
        if analysed["rc"] != 0:
            entry["hta"] = failed(analysed)
        else:
            try:
                entry["hta"] = last_json_line(analysed["stdout"])
                entry["comparison"] = compare_split(doc, entry["hta"])
            except Exception as exc:
                entry["hta_error"] = f"{type(exc).__name__}: {exc}"
                entry["hta_stdout_tail"] = analysed["stdout"][-1500:]
        record(out, "hta", **{label: entry})
    record(out, "hta", note="HTA counts GPU kernels by name: nccl* is communication. gloo moves CUDA tensors "
                            "through host memory (Memcpy DtoH/HtoD), so a gloo run has no communication kernel for "
                            "HTA; commprof's comm there is the gloo op on the host. HTA figures are totals over the "
                            "trace divided by the measured iterations it holds.")


# ---- step: a straggler on CUDA ----------------------------------------------------------------------------
def calibrate_worker() -> None:
    """Cycles of torch.cuda._sleep per ms, timed with CUDA events, and a DELAY_MS sleep timed back."""
    import torch

    torch.cuda.init()
    for _ in range(100):  # ~0.2 s of work first: the GPU's clock up before the calibration
        torch.cuda._sleep(2_000_000)
    torch.cuda.synchronize()

    def timed(cycles: int) -> float:
        out = []
        for _ in range(7):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1_000_000)  # queued ahead, so the host's launch is not between the events
            a.record()
            torch.cuda._sleep(cycles)
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        return statistics.median(out)

    per_ms = 10_000_000 / timed(10_000_000)
    check = timed(int(DELAY_MS * per_ms))
    print(json.dumps({"cycles_per_ms": per_ms, "delay_ms_requested": DELAY_MS, "delay_ms_timed": check,
                      "gpu": torch.cuda.get_device_name(0)}))


def straggler_script(argv: list[str]) -> None:
    """What `commprof profile` runs: tests/scripts/straggler_train.py's DDP job on CUDA tensors over gloo, rank
    --slow-rank's delay a torch.cuda._sleep kernel ahead of its backward (a time.sleep on CPU), each timed with
    CUDA events into --truth-out.rank<r>.json."""
    import gc

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--device", default="cuda")
    p.add_argument("--cycles-per-ms", type=float, default=0.0)
    p.add_argument("--host-wait", action="store_true", help="the host waits for the sleep kernel (as time.sleep)")
    p.add_argument("--truth-out")
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).to(device)
    ddp = DDP(model, bucket_cap_mb=0.5, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 256, generator=g).to(device), torch.randint(0, 10, (64,), generator=g).to(device)
    slow = rank == args.slow_rank and args.delay_ms > 0
    cycles = int(args.delay_ms * args.cycles_per_ms)
    timed, host_ms = [], []
    for _ in range(args.steps):
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        if slow:
            t0 = time.perf_counter()
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                torch.cuda._sleep(cycles)
                b.record()
                timed.append((a, b))
                if args.host_wait:
                    b.synchronize()
            else:
                time.sleep(args.delay_ms / 1e3)
            host_ms.append((time.perf_counter() - t0) * 1e3)
        loss.backward()
        opt.step()
    if cuda:
        torch.cuda.synchronize()
    if args.truth_out:
        device_ms = [a.elapsed_time(b) for a, b in timed]
        Path(f"{args.truth_out}.rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "slow": slow, "device_sleep_ms": device_ms, "host_ms": host_ms,
             "device_sleep_ms_median": statistics.median(device_ms) if device_ms else None}))
    del ddp, opt, loss  # before the group goes (gloo's threads abort a process left holding it)
    gc.collect()
    dist.destroy_process_group()



def _findings_of(stdout: str) -> str:
    """The findings block of a profile's stdout: it closes the output, after the tables."""
    at = stdout.rfind("\nfindings")
    return stdout[at + 1:] if at >= 0 else ""

def step_straggler(args, out: Path, budget: Budget) -> None:
    cuda = args.device == "cuda"
    per_ms = 0.0
    if cuda:
        res = sh([sys.executable, __file__, "--calibrate"], min(40.0, budget.left() - 3), env_with_root())
        if res["rc"] != 0:
            record(out, "straggler", calibration=failed(res))
            return
        cal = last_json_line(res["stdout"])
        per_ms = cal["cycles_per_ms"]
        record(out, "straggler", calibration=cal)
    tmp = Path(tempfile.mkdtemp(prefix="gpu-straggler-"))
    jobs = [("slowed", ["--delay-ms", str(DELAY_MS)]), ("balanced", [])]
    if cuda:  # the same kernel with the host held until it ends: the delay as time.sleep puts it on the host
        jobs.append(("slowed-host-wait", ["--delay-ms", str(DELAY_MS), "--host-wait"]))
    for i, (label, extra) in enumerate(jobs):
        if budget.left() < 25:
            record(out, "straggler", **{label: {"skipped": f"{budget.left():.0f} s left of the step's budget"}})
            continue
        js, truth = tmp / f"{label}.json", tmp / f"{label}-truth"
        res = commprof("profile", "--backend", "gloo", "--nproc", "2", "--json", str(js), "--", __file__,
                       "--straggler-script", "--steps", str(args.straggler_steps), "--device", args.device,
                       "--cycles-per-ms", str(per_ms), "--truth-out", str(truth), *extra,
                       timeout_s=budget.left() - 3 - (20 if i + 1 < len(jobs) else 0))
        if res["rc"] != 0 or not js.exists():
            record(out, "straggler", **{label: failed(res)})
            continue
        doc = json.loads(js.read_text())
        found = doc.get("findings") or {}
        items = found.get("items") or []
        truths = {}
        for path in tmp.glob(f"{label}-truth.rank*.json"):
            t = json.loads(path.read_text())
            truths[t["rank"]] = {k: t[k] for k in ("slow", "device_sleep_ms_median", "host_ms")}
            if t["host_ms"]:
                truths[t["rank"]]["host_ms"] = statistics.median(t["host_ms"])
        entry = {"wall_s": res["wall_s"], "steps": doc["steps"], "clock": doc["env"].get("clock"),
                 "summary": {k: doc["summary"].get(k) for k in ("wall_ms", "compute_ms", "comm_ms",
                                                                "exposed_comm_ms", "overlap_ms")},
                 "per_rank": doc["summary"].get("per_rank"), "findings_top": items[:4],
                 "findings_by_rank": found.get("by_rank"), "truth": truths,
                 "findings_text": _findings_of(res["stdout"])}
        stragglers = [f for f in items if f.get("kind") == "straggler"]
        entry["straggler_named"] = [{"rank": f.get("rank"), "ms_per_step": f.get("ms_per_step")} for f in stragglers]
        if label.startswith("slowed"):
            top = items[0] if items else {}
            entry["top_is_rank1_straggler"] = (top.get("kind"), top.get("rank")) == ("straggler", 1)
            if stragglers:
                cost = stragglers[0]["ms_per_step"]
                device_ms = (truths.get(1) or {}).get("device_sleep_ms_median")
                e = stragglers[0].get("evidence") or {}
                # tests/test_findings.py's control: what else the slow rank's own time exceeds its peer's by
                besides = ((e["busy_ms"] - DELAY_MS) - e["others_busy_ms"]
                           if {"busy_ms", "others_busy_ms"} <= set(e) else None)
                entry["cost_vs_delay"] = {
                    "injected_ms": DELAY_MS, "device_timed_ms": device_ms, "cost_ms": cost,
                    "error_vs_injected": (cost - DELAY_MS) / DELAY_MS,
                    "error_vs_device_timed": (cost - device_ms) / device_ms if device_ms else None,
                    "within_15pct_of_injected": abs(cost - DELAY_MS) <= TOLERANCE * DELAY_MS,
                    "besides_ms": besides,
                    "within_15pct_beside_control": (abs(cost - DELAY_MS) <= TOLERANCE * DELAY_MS + abs(besides)
                                                    if besides is not None else None)}
        record(out, "straggler", **{label: entry})


# ---- step: today's idioms on CUDA ---------------------------------------------------------------------------
IDIOMS = ("compile_ddp", "compiled_autograd", "compile_fsdp", "ddp_static")


def step_idioms(args, out: Path, budget: Budget) -> None:
    """Each compiled mode of tests/scripts/modern_train.py on the GPU with NCCL at one rank, plain and under
    `commprof profile`: exit codes, losses, and what profile counted (ops on NCCL's streams) and left unseen."""
    script = str(ROOT / "tests" / "scripts" / "modern_train.py")
    env = {**env_with_root(), "MODERN_DEVICE": args.device, "MODERN_BACKEND": "nccl" if args.device == "cuda"
           else "gloo"}
    for mode in IDIOMS:
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
        record(out, "idioms", **{mode: entry})


# ---- step: nsys beside the CUDA kernels ---------------------------------------------------------------------
def step_nsys(args, out: Path, budget: Budget) -> None:
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
    run = ["-m", "commprof", "run", "--strategy", "ddp", "--model", "resnet18", "--backend", "gloo", "--nproc", "2",
           "--device", args.device, "--steps", "6", "--warmup", "2", "--batch-size", "32", "--eval-samples", "0"]
    res = sh([str(nsys), "profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "-o", str(report),
              "--force-overwrite", "true", sys.executable, *run], budget.left() - 25, env_with_root())
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


# ---- step: what profile costs on CUDA tensors -------------------------------------------------------------
def step_cost(args, out: Path, budget: Budget) -> None:
    sys.path.insert(0, str(BENCH))
    import profile_cost as pc

    cuda = args.device == "cuda"
    model = "resnet18" if cuda else "small"
    # one job per arm runs every workload in turn (as profile_cost's --quick does): half the jobs of one
    # job per workload, and a job's start-up is most of its time here
    plan = [("gloo", ["ddp", "fsdp2"])]
    record(out, "cost", device=args.device, model=model, steps=args.cost_steps, warmup=args.cost_warmup,
           arms=list(pc.ARMS), note="each job runs its workloads one after another; ratio = arm / plain per round")
    rows: dict[str, list] = {}
    errors = []
    round_s = None
    for r in range(args.rounds):
        if round_s is not None and budget.left() < round_s * 1.15 + 5:
            record(out, "cost", stopped_after_rounds=r, why=f"{budget.left():.0f} s left, a round took {round_s:.0f} s")
            break
        t0 = time.monotonic()
        queue = list(plan)
        while queue:
            backend, workloads = queue.pop(0)
            key = f"{backend}:{','.join(workloads)}"
            try:
                got = {}
                for arm in pc.ORDERS[r % 6]:
                    log(f"cost round {r + 1}: {arm}, {backend}, {', '.join(workloads)}")
                    got[arm] = pc.run(arm, workloads, args.cost_steps, args.cost_warmup, model, args.device, backend,
                                      timeout_s=max(10.0, budget.left() - 5))
            except (SystemExit, Exception) as exc:  # common.run_all says why a job failed by exiting
                errors.append({"round": r + 1, "jobs": key, "error": str(exc)[-1500:]})
                log(f"  failed: {str(exc)[-300:]}")
                plan.remove((backend, workloads))
                if len(workloads) > 1:  # apart, so one workload's failure keeps the other's figures
                    parts = [(backend, [w]) for w in workloads]
                elif backend == "gloo" and cuda:  # NCCL at one rank: where two ranks cannot share the GPU over gloo
                    parts = [("nccl", workloads)]
                else:
                    parts = []
                plan.extend(parts)
                queue = parts + queue
                if budget.left() < 20:
                    break
                continue
            for w in workloads:
                ms = {arm: got[arm][w] for arm in pc.ARMS}
                rows.setdefault(f"{w} ({backend}, {pc.nproc(args.device, backend)} rank(s))", []).append(
                    {"round": r + 1, "order": list(pc.ORDERS[r % 6]), "ms": ms,
                     "ratio": {arm: ms[arm] / ms["plain"] for arm in pc.ARMS[1:]}})
        round_s = time.monotonic() - t0
        summary = {}
        for name, rs in rows.items():
            summary[name] = {"rounds": len(rs),
                             "ms_median": {arm: statistics.median(x["ms"][arm] for x in rs) for arm in pc.ARMS},
                             "profiled_over_plain": statistics.median(x["ratio"]["profiled"] for x in rs),
                             "aa_plain_again_over_plain": statistics.median(x["ratio"]["plain again"] for x in rs),
                             "per_round": rs}
        record(out, "cost", results=summary, errors=errors, round_s=round_s)
        log(f"cost round {r + 1} done in {round_s:.0f} s: " + "; ".join(
            f"{k}: profiled/plain {v['profiled_over_plain']:.3f}, A/A {v['aa_plain_again_over_plain']:.3f}"
            for k, v in summary.items()))


# ---- the session's headline figures, printed last (the log's tail is what a reader sees first) ----------
def headline(doc: dict) -> list[str]:
    steps, lines = doc.get("steps", {}), [f"env: {json.dumps(doc.get('env', {}))}"]

    def err(name: str, d: dict) -> None:
        for key in ("error", "session_note", "hta_import_error"):
            if d.get(key):
                lines.append(f"{name}: {key}: {str(d[key])[:300]}")

    t = steps.get("tests", {})
    lines.append(f"tests: {t.get('summary')} counts {t.get('counts')}")
    lines += [f"  {x['kind']}: {x['test']}: {x['message'][:200]}" for x in t.get("not_passed", [])
              if x["kind"] != "skipped"]
    err("tests", t)
    tr = steps.get("truth", {})
    if tr.get("skipped"):
        lines.append(f"truth: skipped (rc {tr.get('rc')}): {tr['skipped']}")
    for part in TRUTH_PARTS:
        d = tr.get(part, {})
        if "split" in d:
            lines += [f"truth split {s['comm']}: worst {s['worst']:+.3f} error {s['error']}" for s in d["split"]]
        elif "timing" in d:
            lines += [f"truth timing {x['backend']}: worst {x['worst']}, wall ratio {x['wall_ratio']}"
                      for x in d["timing"]]
        elif "run" in d:
            lines += [f"truth run {k}: peak/plain {v.get('peak_over_plain')}" for k, v in d["run"].items()]
        elif d:
            lines.append(f"truth {part}: rc {d.get('rc')} {d.get('skipped', '')} {d.get('stderr_tail', '')[-200:]}")
    err("truth", tr)
    h = steps.get("hta", {})
    for label, d in h.items():
        if isinstance(d, dict) and ("comparison" in d or "run" in d or "hta" in d):
            for row in d.get("comparison", []):
                lines.append(f"hta {label} rank {row['rank']}: HTA/iteration {json.dumps(row['hta_per_iteration'])}")
                lines.append(f"  commprof {json.dumps(row['commprof_per_iteration'])}")
                lines.append(f"  HTA/commprof {json.dumps(row['hta_over_commprof'])}")
            for key in ("temporal_breakdown_error", "comm_comp_overlap_error"):
                if key in d.get("hta", {}):
                    lines.append(f"hta {label}: {key}: {d['hta'][key][:200]}")
            if "rc" in d.get("hta", {}) or "rc" in d.get("run", {}):
                bad = d["hta"] if "rc" in d.get("hta", {}) else d["run"]
                lines.append(f"hta {label}: failed rc {bad['rc']}: {bad.get('stderr_tail', '')[-300:]}")
    err("hta", h)
    st = steps.get("straggler", {})
    if "calibration" in st:
        lines.append(f"straggler calibration: {json.dumps(st['calibration'])[:300]}")
    for label in ("slowed", "balanced", "slowed-host-wait"):
        d = st.get(label)
        if d is None:
            continue
        if "findings_top" not in d:
            lines.append(f"straggler {label}: {json.dumps(d)[:400]}")
            continue
        top = [(f.get("kind"), f.get("rank", f.get("op")), round(f.get("ms_per_step", 0), 2))
               for f in d["findings_top"]]
        lines.append(f"straggler {label}: findings {top}; named {d['straggler_named']}; truth {d['truth']}")
        if "cost_vs_delay" in d:
            lines.append(f"  cost vs delay {json.dumps(d['cost_vs_delay'])}")
    err("straggler", st)
    c = steps.get("cost", {})
    for name, v in (c.get("results") or {}).items():
        lines.append(f"cost {name}: {v['rounds']} rounds, profiled/plain {v['profiled_over_plain']:.3f}, "
                     f"A/A {v['aa_plain_again_over_plain']:.3f}, ms {json.dumps(v['ms_median'])}")
    lines += [f"cost error: {e['jobs']} round {e['round']}: {e['error'][-200:]}" for e in c.get("errors", [])]
    if "stopped_after_rounds" in c:
        lines.append(f"cost: stopped after {c['stopped_after_rounds']} round(s): {c.get('why')}")
    err("cost", c)
    return lines


# ---- the command line -------------------------------------------------------------------------------------
def environment(args) -> dict:
    env = {"python": sys.version.split()[0], "device_flag": args.device, "argv": sys.argv[1:],
           "cores": os.cpu_count(), "install": os.environ.get("GPU_SESSION_INSTALL")}
    try:
        import torch

        env["torch"] = torch.__version__
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:
        env["torch_error"] = repr(exc)
    try:
        import hta

        env["hta"] = hta.__version__
    except Exception as exc:
        env["hta_error"] = repr(exc)
    return env


def quick(argv: list[str]) -> None:
    """`--quick --json PATH`, as every benchmark takes it: the straggler step alone on a GPU, its record written
    to PATH; without a CUDA GPU, one line and exit 77 (benchmarks/common.py's SKIP)."""
    from commprof.base.backends import cuda_devices

    if not cuda_devices():
        sys.exit(print("gpu_checks: no CUDA GPU is visible: it runs on a GPU machine "
                       "(benchmarks/gpu_session.sh)", file=sys.stderr) or 77)
    path = Path(argv[argv.index("--json") + 1]) if "--json" in argv else Path("gpu-checks.json")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, __file__, "straggler", "--out", tmp, "--budget", "90"], check=True)
        path.write_text((Path(tmp) / RESULTS).read_text())


def main() -> None:
    if "--quick" in sys.argv[1:2]:
        return quick(sys.argv[1:])
    if len(sys.argv) > 1 and sys.argv[1] == "--straggler-script":
        return straggler_script(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "--calibrate":
        return calibrate_worker()
    if len(sys.argv) > 2 and sys.argv[1] == "--hta-analyze":
        print(json.dumps(clean(hta_analyze(sys.argv[2]))), flush=True)
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
    if args.step == "summary":
        path = out / RESULTS
        print("\n".join(headline(json.loads(path.read_text()) if path.exists() else {})), flush=True)
        return
    if args.step == "env":
        path = out / RESULTS
        doc = json.loads(path.read_text()) if path.exists() else {}
        doc["env"] = clean(environment(args))
        path.write_text(json.dumps(doc, indent=1) + "\n")
        log("env:", json.dumps(doc["env"]))
        return
    signal.signal(signal.SIGTERM, _on_term)
    budget = Budget(args.budget)
    t0 = time.monotonic()
    log(f"step {args.step}: device {args.device}, budget {args.budget:.0f} s")
    record(out, args.step, started=time.strftime("%H:%M:%S"), budget_s=args.budget)
    try:
        globals()[f"step_{args.step}"](args, out, budget)
    except BaseException as exc:  # the step says why it stopped; the session goes on to the next
        record(out, args.step, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
        log(f"step {args.step} failed: {type(exc).__name__}: {exc}")
    finally:
        record(out, args.step, wall_s=round(time.monotonic() - t0, 1))
        log(f"step {args.step} done in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
