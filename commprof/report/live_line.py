"""The live log's line: a combined window with every field named, so that pandas and jq read it as records.

In memory and between ranks a window keeps its compact form: each rank's ops keyed by "op|group|size bucket"
with a list of figures as the value, and a finding's per-peer figures keyed by the peer's rank. Data in keys
and unlabelled lists make `pandas.json_normalize` turn every op and every peer into a column of its own. The
log (`--live-log`) therefore holds each window in this form:

    ranks[i].ops             [{"op", "group", "size_bucket", "count", "bytes", "seconds", "duration_buckets",
                               "group_size"}, …]   (duration_buckets: counts per live/window.py's
                               DURATION_BUCKETS_S bound, then above the last)
    findings[j].evidence.K   for a map keyed by rank ids (peers_wait_ms): [{"rank", "value"}, …]

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
    if "findings" in job:
        out["findings"] = [_named_finding(f) for f in job["findings"]]
    return out


def from_line(doc: dict) -> dict:
    """A log line back in the compact form (a line of the compact form stays as it is)."""
    if isinstance(doc.get("ranks"), list):
        doc["ranks"] = [_compact_rank(r) for r in doc["ranks"]]
    for f in doc.get("findings") or ():
        evidence = f.get("evidence")
        if isinstance(evidence, dict):
            f["evidence"] = {k: _by_rank(v) if _is_by_rank(v) else v for k, v in evidence.items()}
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


def _named_finding(f: dict) -> dict:
    evidence = f.get("evidence")
    if not isinstance(evidence, dict):
        return f
    return {**f, "evidence": {k: _as_records(v) if _keyed_by_rank(v) else v for k, v in evidence.items()}}


def _keyed_by_rank(value) -> bool:
    return isinstance(value, dict) and bool(value) and all(
        isinstance(k, int) or isinstance(k, str) and k.isdigit() for k in value)  # ints in memory, str in JSON


def _as_records(value: dict) -> list[dict]:
    return [{"rank": int(k), "value": v} for k, v in value.items()]


def _is_by_rank(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) and v.keys() == {"rank", "value"}
                                                           for v in value)


def _by_rank(value: list[dict]) -> dict:
    return {str(v["rank"]): v["value"] for v in value}
