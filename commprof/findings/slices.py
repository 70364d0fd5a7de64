"""The split by cause drawn in the merged trace: each rank gets a row "blocked, by cause" under its training
thread, whose slices cover every stretch its thread was blocked on an op — `waiting for rank k` while a peer
had not yet issued it, `transfer <op> (<group>)` once every party had — the same cut the findings count
(findings/arrivals.py). With the flow arrows from the last rank to arrive (record/merge.py), a user sees in
Perfetto who made each rank wait, and for how long.

    commprof run --strategy ddp --nproc 2 --trace t/        (t/trace.json)

Exercised by: `pytest tests/unit/test_findings_recorded.py tests/test_findings.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

from commprof.base.files import write_atomic
from commprof.findings.arrivals import blocked_by_cause
from commprof.perfmodel.timeline import Measured

TID = 999_999
"""The row's thread id in each rank's process: below the comm rows' (1,000,000 up), above any real thread's."""
ROW = "blocked, by cause"


def mark(directory: str | Path, m: Measured) -> int:
    """Put the slices in DIR/trace.json, in place of any drawn before, for the ranks it holds; returns how
    many."""
    path = Path(directory) / "trace.json"
    doc = json.loads(path.read_text())
    events = doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("tid") != TID]
    held = (doc.get("otherData") or {}).get("held")  # a merged trace of some ranks: theirs only
    ranks = set()
    added = 0
    for rank, t0, t1, who, on in blocked_by_cause(m, set(held["ranks"]) if held else None):
        if t1 <= t0:
            continue
        name = f"waiting for rank {who}" if who is not None else f"transfer {on.name} ({on.label})"
        args = {} if on is None else {"op": f"{on.name} ({on.label})", "bytes": on.nbytes}
        events.append({"name": name, "cat": "cause", "ph": "X", "pid": rank + 1, "tid": TID,
                       "ts": round(t0, 3), "dur": round(t1 - t0, 3), "args": args})
        ranks.add(rank)
        added += 1
    for rank in sorted(ranks):
        events.append({"name": "thread_name", "ph": "M", "pid": rank + 1, "tid": TID, "args": {"name": ROW}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": rank + 1, "tid": TID,
                       "args": {"sort_index": 1}})
    write_atomic(path, json.dumps(doc, separators=(",", ":")) + "\n")
    return added
