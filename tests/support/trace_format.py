"""A validator of the Trace Event Format (the JSON that chrome://tracing and Perfetto import), for the
files `--trace DIR` writes: what each phase needs, and what Perfetto's importer would drop or misplace.

Checked per event: a known phase; pid and tid present, pid not 0 (Perfetto treats pid 0 as the
kernel's idle process); ts numeric and ≥ 0 (metadata may leave it out); X with a numeric dur ≥ 0; B/E
balanced per thread, each E at or after its B; i with a known scope; C with numeric args; M with args
(a name for process_name and thread_name); s/t/f with an id. Per flow id: one s, then any t, then one f,
in time order (Perfetto drops a flow end without an earlier start), each bound to a slice of its thread
— s and t to the one enclosing them, f to the one enclosing it with bp "e", else the next one to start. Per
thread: no two slices overlap partly (Perfetto drops the second).

    python tests/support/trace_format.py trace/trace.json trace/rank0.trace.json

Used by tests/unit/test_trace_files.py and tests/test_trace.py.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

PHASES = set("XBEiIsftMCbenNODPR")
"""Every phase of the format; those not listed in the checks below only need pid, tid and ts."""
TIMED = set("XBEiIstfC")
"""Phases whose ts must be there."""
NAMED_METADATA = ("process_name", "thread_name")


def problems(doc) -> list[str]:
    """Every way `doc` (the array form or {"traceEvents": [...]}) breaks the format; [] when none."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        return ["no event array: neither a JSON array nor an object with traceEvents"]
    out: list[str] = []
    stacks: dict[tuple, list[dict]] = defaultdict(list)
    flows: dict[object, list[dict]] = defaultdict(list)
    for e in events:
        bad = _event(e)
        out += [f"{b}: {json.dumps(e)[:200]}" for b in bad]
        if bad:
            continue
        ph = e["ph"]
        if ph == "B":
            stacks[(e["pid"], e["tid"])].append(e)
        elif ph == "E":
            stack = stacks[(e["pid"], e["tid"])]
            if not stack:
                out.append(f"E with no B open on its thread: {json.dumps(e)}")
            elif stack.pop()["ts"] > e["ts"]:
                out.append(f"E before its B: {json.dumps(e)}")
        elif ph in "stf":
            flows[(e["id"], e.get("cat"), e.get("name"))].append(e)
    out += [f"B never ended: {json.dumps(s[-1])}" for s in stacks.values() if s]
    slices = _slices(events)
    for (pid, tid), spans in slices.items():
        out += [f"pid {pid} tid {tid}: {p}" for p in _overlaps(spans)]
    for ident, chain in flows.items():
        out += [f"flow {ident[0]}: {p}" for p in _flow(chain, slices)]
    return out


def check(doc) -> None:
    """AssertionError naming the first problems of `doc`, if it has any."""
    found = problems(doc)
    assert not found, f"{len(found)} problem(s) in the trace:\n" + "\n".join(found[:10])


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _event(e) -> list[str]:
    if not isinstance(e, dict):
        return ["an event that is not an object"]
    ph = e.get("ph")
    if ph not in PHASES:
        return [f"unknown phase {ph!r}"]
    bad = [f"no {key}" for key in ("pid", "tid") if key not in e]
    if e.get("pid") == 0:
        bad.append("pid 0")
    if ph in TIMED or "ts" in e:
        if not _number(e.get("ts")) or e["ts"] < 0:
            bad.append("ts missing, not a number or negative")
    if ph not in "ME" and not isinstance(e.get("name"), str):
        bad.append("no name")
    if ph == "X" and (not _number(e.get("dur")) or e["dur"] < 0):
        bad.append("X with dur missing, not a number or negative")
    if ph in "iI" and e.get("s", "t") not in ("g", "p", "t"):
        bad.append(f"instant scope {e.get('s')!r}")
    if ph == "C" and (not isinstance(e.get("args"), dict) or not all(_number(v) for v in e["args"].values())):
        bad.append("C without numeric args")
    if ph == "M":
        if not isinstance(e.get("name"), str) or not isinstance(e.get("args"), dict):
            bad.append("M without name and args")
        elif e["name"] in NAMED_METADATA and not isinstance(e["args"].get("name"), str):
            bad.append(f"{e['name']} without args.name")
    if ph in "stf" and not isinstance(e.get("id"), int | str):
        bad.append("flow event without id")
    if ph == "f" and e.get("bp", "e") != "e":
        bad.append(f"flow end with bp {e['bp']!r}")
    return bad


def _slices(events: list) -> dict[tuple, list[tuple[float, float]]]:
    """(pid, tid) -> [(start, end)] of its X slices and matched B/E pairs."""
    out: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    open_: dict[tuple, list[float]] = defaultdict(list)
    for e in sorted((e for e in events if isinstance(e, dict) and e.get("ph") in ("X", "B", "E")
                     and _number(e.get("ts"))), key=lambda e: e["ts"]):
        key = (e.get("pid"), e.get("tid"))
        if e["ph"] == "X" and _number(e.get("dur")):
            out[key].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "B":
            open_[key].append(e["ts"])
        elif open_[key]:
            out[key].append((open_[key].pop(), e["ts"]))
    return out


def _overlaps(spans: list[tuple[float, float]]) -> list[str]:
    """Slices of one thread that overlap partly, which Perfetto drops: each must nest inside the one that
    encloses its start, or start after it ends (within NS: ts and dur are written in µs to 3 decimals, each
    rounded on its own)."""
    out, open_ = [], []
    for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
        while open_ and open_[-1] <= start + NS:
            open_.pop()
        if open_ and end > open_[-1] + NS:
            out.append(f"a slice [{start}, {end}] overlaps the one enclosing its start, which ends at {open_[-1]}")
        open_.append(end)
    return out


NS = 0.0015
"""One rounding step of a µs figure written to 3 decimals, and a half of another, in µs."""


def _flow(chain: list[dict], slices: dict) -> list[str]:
    phases = "".join(e["ph"] for e in sorted(chain, key=lambda e: "stf".index(e["ph"])))
    if phases.count("s") != 1 or phases.count("f") != 1:
        return [f"{phases.count('s')} start(s) and {phases.count('f')} end(s), not one of each"]
    ordered = sorted(chain, key=lambda e: ("stf".index(e["ph"]), e["ts"]))
    out = [f"{b['ph']} at {b['ts']} before {a['ph']} at {a['ts']}"
           for a, b in zip(ordered, ordered[1:]) if b["ts"] < a["ts"]]
    for e in chain:
        spans = slices.get((e["pid"], e["tid"]), [])
        if e["ph"] == "f" and e.get("bp") != "e":
            bound = any(start >= e["ts"] for start, _ in spans)
        else:
            bound = any(start <= e["ts"] <= end for start, end in spans)
        if not bound:
            out.append(f"{e['ph']} at {e['ts']} on pid {e['pid']} tid {e['tid']} binds to no slice")
    return out


if __name__ == "__main__":
    failed = False
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            found = problems(json.load(f))
        print(f"{path}: {'valid' if not found else f'{len(found)} problem(s)'}")
        for line in found[:20]:
            print(f"  {line}")
        failed |= bool(found)
    sys.exit(1 if failed else 0)
