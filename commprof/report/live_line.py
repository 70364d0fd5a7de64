"""The live log's line: a combined window with every field named, so that pandas and jq read it as records.

In memory and between ranks a window keeps its compact form: each rank's ops keyed by "op|group|size bucket"
with a list of figures as the value. Data in keys and unlabelled lists make `pandas.json_normalize` turn every
op into a column of its own (findings name their fields where they are made: findings/kinds.py's per_peer). The
log (`--live-log`) therefore holds each window in this form:

    ranks[i].ops             [{"op", "group", "size_bucket", "count", "bytes", "seconds", "duration_buckets",
                               "group_size"}, …]   (duration_buckets: counts per live/window.py's
                               DURATION_BUCKETS_S bound, then above the last)

    pandas.json_normalize(windows, record_path=["ranks", "ops"], meta=["window", ["ranks", "rank"]])

`to_line` makes the line's form, `from_line` reads either form back into the compact one (a log written
before this form was its first). Written by live/export.py's LiveLog, read by report/live_log.py.
Exercised by: `pytest tests/unit/test_live.py`.
"""

from __future__ import annotations

FIGURES = ("count", "bytes", "seconds", "duration_buckets", "group_size")
"""The names of an op's figures, in the order of the compact form's list."""


def to_line(job: dict) -> dict:
    """`job` (a combined window) with named fields; `job` itself is left as it is."""
    out = dict(job)
    if "ranks" in job and isinstance(job["ranks"], list):
        out["ranks"] = [_named_rank(r) for r in job["ranks"]]
    return out


def from_line(doc: dict) -> dict:
    """A log line back in the compact form (a line of the compact form stays as it is)."""
    if isinstance(doc.get("ranks"), list):
        doc["ranks"] = [_compact_rank(r) for r in doc["ranks"]]
    return doc


def _named_rank(r: dict) -> dict:
    ops = r.get("ops")
    if not isinstance(ops, dict):
        return r
    named = []
    for key, figures in ops.items():
        name, group, size = key.rsplit("|", 2)  # live/window.py's op_key
        named.append({"op": name, "group": group, "size_bucket": int(size), **dict(zip(FIGURES, figures))})
    return {**r, "ops": named}


def _compact_rank(r: dict) -> dict:
    ops = r.get("ops")
    if not isinstance(ops, list):
        return r
    return {**r, "ops": {f"{o['op']}|{o['group']}|{o['size_bucket']}": [o[k] for k in FIGURES] for o in ops}}
