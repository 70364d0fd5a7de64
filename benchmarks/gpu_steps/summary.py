"""What gpu_checks.py says of a whole session: the environment it records first (`gpu_checks.py env`) and the
headline figures it prints last (`gpu_checks.py summary`: the log's tail is what a reader sees first).
`OUT=out python3 benchmarks/gpu_checks.py summary` prints them from OUT/gpu-session.json."""

from __future__ import annotations

import json
import os
import sys

from gpu_steps.truth import PARTS as TRUTH_PARTS


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
    lines += _truth(steps.get("truth", {}))
    err("truth", steps.get("truth", {}))
    lines += _hta(steps.get("hta", {}))
    err("hta", steps.get("hta", {}))
    lines += _straggler(steps.get("straggler", {}))
    err("straggler", steps.get("straggler", {}))
    c = steps.get("cost", {})
    for name, v in (c.get("results") or {}).items():
        lines.append(f"cost {name}: {v['rounds']} rounds, profiled/plain {v['profiled_over_plain']:.3f}, "
                     f"A/A {v['aa_plain_again_over_plain']:.3f}, ms {json.dumps(v['ms_median'])}")
    lines += [f"cost error: {e['jobs']} round {e['round']}: {e['error'][-200:]}" for e in c.get("errors", [])]
    if "stopped_after_rounds" in c:
        lines.append(f"cost: stopped after {c['stopped_after_rounds']} round(s): {c.get('why')}")
    err("cost", c)
    return lines


def _truth(tr: dict) -> list[str]:
    lines = []
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
    return lines


def _hta(h: dict) -> list[str]:
    lines = []
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
    return lines


def _straggler(st: dict) -> list[str]:
    lines = []
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
    return lines
