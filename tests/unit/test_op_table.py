"""The per-op time table (report/op_table.py) from recorded jobs' traces (tests/recorded/: three profiles and a
pipeline run of two groups): a row per op and group whose count and bytes are the volume table's over the
measured iterations, and whose min / median / p99 / max are numpy's of the same ops read straight from rank 0's
trace file; only that file is read, whatever the world size."""

from __future__ import annotations

import io
import json
import shutil
from collections import defaultdict

import numpy as np
import pytest
from rich.console import Console

from commprof.profile.results import op_times
from commprof.report.op_table import key, op_table

FIXTURES = [("slowed", "profile.json"), ("balanced", "profile.json"), ("per-param", "profile.json"),
            ("pipeline", "run.json")]


def _rank0_ops(trace) -> tuple[dict[tuple[str, str], list[tuple[int, float]]], int]:
    """({(op, group): [(payload bytes, µs from issue to completion)]} of rank 0's ops issued in its measured
    iterations, their count), read from its trace file as the trace writes it (record/trace.py), without
    commprof's readers."""
    events = json.loads((trace / "rank0.trace.json").read_text())
    threads = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    training = next(t for t, name in threads.items() if name == "training")
    spans = [e for e in events if e.get("ph") == "X" and e.get("tid") == training and e.get("cat") == "iteration"]
    measured = next((e["ts"] for e in spans if e["name"] == "measured"), float("-inf"))
    iterations = [(e["ts"], e["ts"] + e["dur"]) for e in spans
                  if e["name"] != "measured" and e["ts"] >= measured and not e["name"].endswith("(aligned)")]
    out = defaultdict(list)
    for e in events:
        thread = threads.get(e.get("tid"), "")
        if e.get("ph") == "X" and e.get("cat") == "comm" and thread.startswith("comm ("):
            if any(t0 <= e["ts"] <= t1 for t0, t1 in iterations):
                group = thread[len("comm ("):-1]
                out[e["name"].rsplit(" (", 1)[0], group].append((e["args"]["bytes"], e["dur"]))
    return out, len(iterations)


@pytest.mark.parametrize("name,document", FIXTURES)
def test_counts_and_bytes_are_the_volume_tables_and_times_numpys(recorded, name, document):
    folder = recorded(name)
    doc = json.loads((folder / document).read_text())
    rows = op_times(str(folder / "trace"), doc["env"]["world_size"])
    ops, iterations = _rank0_ops(folder / "trace")
    assert iterations == doc["steps"]["measured"] > 0
    assert {key(r["op"], r["group"]) for r in rows} == set(doc["volume"]), (rows, doc["volume"])
    assert {(r["op"], r["group"]) for r in rows} == set(ops)
    for r in rows:
        v = doc["volume"][key(r["op"], r["group"])]
        assert r["count"] == v["calls_per_step"] * iterations, (r, v)
        assert r["payload_bytes"] == pytest.approx(v["payload_bytes_per_step"] * iterations, abs=iterations), (r, v)
        assert r["min_us"] <= r["median_us"] <= r["p99_us"] <= r["max_us"], r
        mine = ops[r["op"], r["group"]]
        us = np.array([t for _, t in mine])
        assert (r["count"], r["payload_bytes"]) == (len(mine), sum(b for b, _ in mine))
        assert [r["min_us"], r["median_us"], r["p99_us"], r["max_us"]] == pytest.approx(
            [us.min(), np.median(us), np.percentile(us, 99), us.max()], rel=1e-9), r
        assert r["rank"] == 0


def test_only_rank_0s_own_file_is_read_at_any_world_size(recorded, tmp_path):
    folder = recorded("slowed")
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(folder / "trace" / "rank0.trace.json", alone)  # no merged trace, no other rank's file
    assert op_times(str(alone), 16_384) == op_times(str(folder / "trace"), 2) != []
    assert op_times(str(tmp_path / "none"), 2) == []  # no trace (a --live job without --trace): no rows


def test_the_table_names_each_op_and_its_scope_at_80_columns(recorded):
    folder = recorded("pipeline")
    doc = json.loads((folder / "run.json").read_text())
    rows = op_times(str(folder / "trace"), doc["env"]["world_size"])
    buf = io.StringIO()
    Console(file=buf, width=80, color_system=None).print(op_table(rows, iterations=doc["steps"]["measured"]))
    shown = buf.getvalue()
    assert all(len(x) <= 80 for x in shown.splitlines()), shown
    assert "time per op" in shown and "rank 0's own ops over its 3 measured iterations" in " ".join(shown.split())
    for r in rows:
        assert key(r["op"], r["group"]) in shown and f" {r['count']} " in shown, (r, shown)
