"""gpu_checks.py's `hta` step: Holistic Trace Analysis on a real CUDA Kineto trace. `commprof run --torch-profiler`
of a ResNet-18 DDP job (2 gloo ranks on CUDA tensors; NCCL at 1 rank), HTA's temporal breakdown and comm/compute
overlap beside commprof's own split of the same run. `OUT=out python3 benchmarks/gpu_checks.py hta --device cpu`
runs it on CPU tensors (HTA's analysis runs in a child: `gpu_checks.py --hta-analyze DIR`)."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from gpu_steps.harness import SCRIPT, Budget, commprof, env_with_root, failed, last_json_line, record, sh


def analyze(trace_dir: str) -> dict:
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


def trace_facts(trace: dict) -> dict:
    """What a Kineto trace holds for HTA: its distributedInfo, the ProfilerSteps, its kernels and copies."""
    ev = trace.get("traceEvents", [])
    kernels = [str(e.get("name")) for e in ev if e.get("cat") == "kernel"]
    return {"distributedInfo": trace.get("distributedInfo"),
            "profiler_steps": sorted({e["name"] for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")}),
            "kernels": len(kernels), "nccl_kernels": sum(1 for k in kernels if k.startswith("nccl")),
            "gpu_memcpy": sum(1 for e in ev if e.get("cat") == "gpu_memcpy")}


def run(args, out: Path, budget: Budget) -> None:
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
        for name in traces:
            entry.setdefault("trace_facts", {})[name] = trace_facts(json.loads((kin / name).read_text()))
        record(out, "hta", **{label: entry})
        analysed = sh([sys.executable, str(SCRIPT), "--hta-analyze", str(kin)], min(60.0, budget.left() - 3 - later),
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
