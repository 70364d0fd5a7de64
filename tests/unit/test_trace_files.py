"""Trace files without a job: every flush of a per-rank file leaves whole JSON and a write cut short still
loads (an older commprof's file too), the merge's flows start at the last rank to arrive, and the Trace
Event Format validator (tests/support/trace_format.py) names what is wrong with an event."""

import json
import time

import pytest
from support import trace_format

from commprof.record import merge, trace
from commprof.record.annotate import ANNOTATOR


def test_every_write_leaves_whole_json_and_a_cut_write_still_loads(tmp_path):
    clocks = {"epoch_ns": time.perf_counter_ns(), "ranks": [
        {"rank": 0, "host": "h", "measured_offset_ns": 0, "bound_ns": 0, "applied_offset_ns": 0, "residual_ns": 0}]}
    rec = trace.TraceRecorder(tmp_path / "rank0.trace.json", rank=0, world_size=1, clocks=clocks)
    label = ANNOTATOR.label("forward", "compute")
    sizes = []
    for k in range(3):
        for _ in range(k + 1):
            rec.begin(label, time.perf_counter_ns())
            rec.end(time.perf_counter_ns())
        rec.flush()
        text = rec.path.read_text()
        sizes.append(len(text))
        assert sum(e["ph"] == "X" for e in json.loads(text)) == (k + 1) * (k + 2) // 2
    rec.close()
    events = json.loads(rec.path.read_text())
    trace_format.check(events)
    assert events[0]["pid"] == 1 and events[-1]["name"] == "trace_end"
    # a kill inside the last write's syscall: that write cut short anywhere, the earlier ones whole
    text = rec.path.read_text()
    for cut in range(sizes[1] - 3, len(text)):
        rec.path.write_text(text[:cut])
        assert sum(e["ph"] == "X" for e in trace.load(rec.path)) >= 3, cut


def test_a_file_of_an_older_commprof_cut_short_still_loads(tmp_path):
    path = tmp_path / "rank0.trace.json"
    path.write_text('[\n{"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":"rank 0 (h)"}},\n'
                    '{"name":"forward","cat":"compute","ph":"X","pid":0,"tid":1,"ts":1.0,"dur":2.0},\n')
    assert [e["name"] for e in trace.load(path)] == ["process_name", "forward"]


def _op(rank: int, name: str, ts: float, dur: float, thread: str = "comm (world)") -> list[dict]:
    return [{"name": "thread_name", "ph": "M", "pid": rank + 1, "tid": 7, "args": {"name": thread,
                                                                                  "members": [0, 1, 2]}},
            {"name": f"{name} (world)", "cat": "comm", "ph": "X", "pid": rank + 1, "tid": 7, "ts": ts, "dur": dur,
             "args": {"bytes": 8, "group_size": 3, "seq": 0}}]


def test_flows_start_at_the_last_rank_to_arrive():
    # rank 2 issues last; rank 0 (a broadcast root) finished before that and waited for nobody. Rank 1's op
    # ran on a CUDA stream: its span is on the stream's thread
    events = (_op(0, "broadcast", 10.0, 2.0) + _op(1, "broadcast", 11.0, 9.0, "stream: comm (world)")
              + _op(2, "broadcast", 15.0, 5.0))
    drawn = merge.flows(events)
    trace_format.check(events + drawn)
    starts = [(e["pid"], e["ts"]) for e in drawn if e["ph"] == "s"]
    ends = [(e["pid"], e["ts"]) for e in drawn if e["ph"] == "f"]
    assert starts == [(3, 15.0)] and ends == [(2, 19.999)]
    assert merge.flows(events[:-2]) == []  # a member that never traced the op: nobody to point from


@pytest.mark.parametrize("bad,why", [
    ({"name": "a", "ph": "X", "pid": 0, "tid": 1, "ts": 1, "dur": 1}, "pid 0"),
    ({"name": "a", "ph": "X", "pid": 1, "ts": 1, "dur": 1}, "no tid"),
    ({"name": "a", "ph": "X", "pid": 1, "tid": 1, "ts": -1, "dur": 1}, "negative"),
    ({"name": "a", "ph": "X", "pid": 1, "tid": 1, "ts": 1}, "X with dur"),
    ({"name": "a", "ph": "B", "pid": 1, "tid": 1, "ts": 1}, "B never ended"),
    ({"name": "a", "ph": "C", "pid": 1, "tid": 1, "ts": 1, "args": {"n": "x"}}, "C without numeric"),
    ({"name": "process_name", "ph": "M", "pid": 1, "tid": 1, "args": {}}, "without args.name"),
    ({"name": "a", "cat": "c", "ph": "f", "bp": "e", "id": 9, "pid": 1, "tid": 1, "ts": 2}, "0 start(s)"),
    ({"name": "a", "cat": "c", "ph": "s", "id": 5, "pid": 1, "tid": 1, "ts": 2.5}, "f at 2 before s at 2.5"),
    ({"name": "a", "cat": "c", "ph": "s", "id": 5, "pid": 1, "tid": 2, "ts": 1}, "binds to no slice"),
    ({"name": "b", "ph": "X", "pid": 1, "tid": 1, "ts": 2, "dur": 2}, "overlaps the one enclosing its start"),
])
def test_the_validator_names_what_is_wrong(bad, why):
    good = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "rank 0"}},
            {"name": "a", "ph": "X", "pid": 1, "tid": 1, "ts": 1, "dur": 2},
            {"name": "a", "cat": "c", "ph": "s", "id": 5, "pid": 1, "tid": 1, "ts": 1.5},
            {"name": "a", "cat": "c", "ph": "f", "bp": "e", "id": 5, "pid": 1, "tid": 1, "ts": 2}]
    assert trace_format.problems(good) == []
    if bad.get("id") == 5:  # replaces the good flow's start
        good = [e for e in good if not (e.get("id") == 5 and e["ph"] == "s")]
    found = trace_format.problems({"traceEvents": good + [bad]})
    assert any(why in p for p in found), found


class _Comm:
    class clock:  # noqa: N801 - what TraceRecorder.op reads of a Comm
        kind = "cpu"

    members = [0, 1]


def test_ops_in_flight_at_once_get_a_track_each(tmp_path):
    # DDP issues a bucket's all_reduce while the last one runs, FSDP prefetches its all_gathers: on one track
    # they overlapped partly, and Perfetto dropped those slices (16 in a 4-bucket DDP trace)
    clocks = {"epoch_ns": 0, "ranks": [
        {"rank": 0, "host": "h", "measured_offset_ns": 0, "bound_ns": 0, "applied_offset_ns": 0, "residual_ns": 0}]}
    rec = trace.TraceRecorder(tmp_path / "rank0.trace.json", rank=0, world_size=2, clocks=clocks)
    spans = [(0, 10), (5, 15), (8, 12), (12, 20), (16, 30), (21, 25), (40, 50)]  # µs; 3 in flight at 8-10
    for k, (t0, t1) in enumerate(spans):
        rec.op(("all_reduce", 4096, 2, t0 * 1000, t1 * 1000, True, "world"), _Comm)
        if k == 3:
            rec.flush()  # an op completes after a write: its track is still the right one
    rec.close()
    events = json.loads(rec.path.read_text())
    trace_format.check(events)
    names = {e["tid"]: e["args"] for e in events if e.get("name") == "thread_name"}
    ops = [e for e in events if e.get("ph") == "X"]
    assert sorted((e["ts"], e["ts"] + e["dur"]) for e in ops) == [tuple(map(float, s)) for s in sorted(spans)]
    tracks = {e["tid"] for e in ops}
    assert len(tracks) == 3 and all(names[t]["name"] == "comm (world)" and names[t]["members"] == [0, 1]
                                    for t in tracks)
    assert sorted(names[t].get("slot", 0) for t in tracks) == [0, 1, 2]
    # what reads the trace back sees one group's ops, whichever track each is on
    assert sorted(len(v) for v in merge.comm_ops(events).values()) == [1] * 7


def _world_from_recorded(n: int) -> list[list[dict]]:
    """n ranks' events from the recorded slowed job: rank n-1 its slowed rank 1, every other its rank 0, each
    with its own pid, rank, host (4 ranks a host) and the world group written as record/trace.py writes it."""
    import copy

    from conftest import RECORDED

    from commprof.base.measurement import member_args

    recorded = [merge.load(RECORDED / "slowed" / "trace" / f"rank{r}.trace.json") for r in (0, 1)]
    out = []
    for rank in range(n):
        events = copy.deepcopy(recorded[1 if rank == n - 1 else 0])
        for e in events:
            e["pid"] = rank + 1
            if e.get("name") == "clock_sync":
                e["args"].update(rank=rank, world_size=n, host=f"h{rank // 4}")
            if e.get("name") == "thread_name" and "members" in e["args"]:
                del e["args"]["members"]
                e["args"].update(member_args(range(n)))
        out.append(events)
    return out


def test_a_large_jobs_merged_trace_holds_the_ranks_that_tell_its_story_and_says_where_the_rest_are(tmp_path):
    from commprof.findings.kinds import of_trace

    n = 100
    world = _world_from_recorded(n)
    for rank, events in enumerate(world):
        (tmp_path / f"rank{rank}.trace.json").write_text(json.dumps(events))
    merge.merge(tmp_path)
    doc = json.loads((tmp_path / "trace.json").read_text())
    held = doc["otherData"]["held"]
    ranks = {e["args"]["rank"] for e in doc["traceEvents"] if e.get("name") == "clock_sync"}
    assert held["of"] == n and sorted(ranks) == held["ranks"] and len(ranks) <= merge.MERGED_RANKS
    assert {0, n - 1} <= ranks and "rank<r>.trace.json" in held["rest"]
    assert {f"h{r // 4}" for r in ranks} >= {f"h{h}" for h in range(20)}  # a rank of each host, as room allows
    # arrows join the held ranks' collectives: from the slowed rank, the last to arrive
    starts = {e["pid"] - 1 for e in doc["traceEvents"] if e.get("ph") == "s"}
    assert starts and n - 1 in starts and starts <= ranks
    assert {c["rank"] for c in doc["otherData"]["clock_sync"]["ranks"]} == ranks  # the clocks of those held
    # the findings read every rank's own file: the straggler and its cost as the 2-rank job's
    block = of_trace(str(tmp_path))
    two = of_trace(str(_recorded_copy(tmp_path)))
    mine = [f for f in block["items"] if f["kind"] == "straggler"]
    ref = [f for f in two["items"] if f["kind"] == "straggler"][0]
    assert [f["rank"] for f in mine] == [n - 1] and abs(mine[0]["ms_per_step"] - ref["ms_per_step"]) <= 0.15 * ref[
        "ms_per_step"]
    assert mine[0]["evidence"]["peers"]["count"] == n - 1 and len(mine[0]["evidence"]["peers_wait_ms"]) == 8
    assert len(block["by_rank"]) == n
    # the slices by cause are drawn for the held ranks only
    doc = json.loads((tmp_path / "trace.json").read_text())
    assert {e["pid"] - 1 for e in doc["traceEvents"] if e.get("cat") == "cause"} <= ranks
    assert json.loads((tmp_path / f"rank{n - 1}.trace.json").read_text()) == world[n - 1]  # each rank's file kept


def _recorded_copy(tmp_path):
    import shutil

    from conftest import RECORDED

    return shutil.copytree(RECORDED / "slowed" / "trace", tmp_path / "two")
