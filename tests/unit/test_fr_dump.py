"""Flight records in torch's dump format (commprof/comm/failure/fr_dump.py), read by torch's own analyser in this
process: fr_trace's loader and builder (`python -m torch.distributed.flight_recorder.fr_trace DIR -p
fr_trace_rank_` without the process) on files flight.dump wrote from hand-made snapshots. Agreeing ranks
match everywhere; an extra 16 B all_reduce on rank 1 against rank 0's 75 KiB bucket is the mismatch fr_trace
names, at that seq, whichever rank it reads first, however far the rings have wrapped."""

import json
import logging
import pickle

import pytest
from torch.distributed.flight_recorder.components.builder import build_db
from torch.distributed.flight_recorder.components.config_manager import JobConfig
from torch.distributed.flight_recorder.components.loader import read_dir, read_dump
from torch.distributed.flight_recorder.components.types import MatchState

from commprof.comm.failure import flight, fr_dump

BUCKET = 75 * 1024  # DDP's bucket in tests/scripts/ddp_train.py: 19,200 floats


def snap(rank, ring, groups=None, busy=None):
    seqs = {}
    for label, seq, *_ in ring:
        seqs[label] = max(seqs.get(label, 0), seq)
    return {"rank": rank, "reason": "test", "busy": busy, "groups": groups or {"world": [0, 1]}, "seqs": seqs,
            "ring": ring}


def steps(first, last, extra_at=None):
    """A DDP loop's world ring from seq `first`: one bucket all_reduce a step, and (extra_at) one 16 B
    all_reduce of 4 floats before the bucket at that seq."""
    ring, seq = [], first
    while seq <= last:
        if seq == extra_at:
            ring.append(["world", seq, "all_reduce", 16, "float32"])
            seq += 1
        ring.append(["world", seq, "all_reduce", BUCKET, "float32"])
        seq += 1
    return ring


def analyse(folder, order=None):
    """fr_trace's main, in this process: its database, and what it logged. `order`: the ranks' files in this
    order (fr_trace takes them as os.walk lists them, and starts matching from the first)."""
    args = JobConfig().parse_args([str(folder), "-p", fr_dump.PREFIX])
    if order is None:
        details, version = read_dir(args)
    else:
        details = {f"{fr_dump.PREFIX}{r}": read_dump(fr_dump.PREFIX, str(fr_dump.path_of(folder, r))) for r in order}
        version = details[f"{fr_dump.PREFIX}{order[0]}"]["version"]
    return build_db(details, args, version)


def failed(db):
    return [c for c in db.collectives if not c.pass_check]


def test_ranks_that_agree_match_in_every_collective_and_group(tmp_path, caplog):
    groups = {"world": [0, 1], "dp": [[0, 1]]}  # members as ranks, and as runs (a ring file's)
    ring = [["world", 1, "broadcast", 4096, "float32"], ["world", 1, "send", 64, "float32"],
            ["dp", 1, "all_gather", 2048, "bfloat16"], ["world", 2, "all_reduce", BUCKET, "float32"],
            ["dp", 2, "reduce_scatter", 4096, "float32"], ["world", 3, "barrier", 0, None],
            ["world", 4, "all_to_all", 1024, "int64"], ["world", 4, "recv", 64, "float32"],
            ["world", 5, "reduce", 8, "float64"]]
    for rank in (0, 1):
        flight.dump(tmp_path, snap(rank, ring, groups))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fr_trace_rank_0", "fr_trace_rank_1",
                                                          "rank0.flight.json", "rank1.flight.json"]
    with caplog.at_level(logging.INFO, logger="Flight Recorder"):
        db = analyse(tmp_path)
    # every collective matched across both ranks; the point-to-point ops (no peer in the ring) left out
    assert [(c.group_id, c.collective_seq_id, c.collective_name) for c in db.collectives] == [
        ("world", 1, "nccl:broadcast"), ("dp", 1, "nccl:all_gather"), ("world", 2, "nccl:all_reduce"),
        ("dp", 2, "nccl:reduce_scatter"), ("world", 3, "nccl:barrier"), ("world", 4, "nccl:all_to_all"),
        ("world", 5, "nccl:reduce")]
    assert not failed(db) and "error" not in caplog.text.lower() and "mismatch" not in caplog.text.lower()
    assert {g.desc: g.size for g in db.groups} == {"default_pg": 2, "undefined": 2}
    # sizes in elements as torch's gloo recorder writes them: all_gather's output is [group size, input]
    gather = next(c for c in db.collectives if c.collective_name.endswith("all_gather"))
    assert (gather.input_sizes, gather.output_sizes) == ([[512]], [[2, 512]])
    scatter = next(c for c in db.collectives if c.collective_name.endswith("reduce_scatter"))
    assert (scatter.input_sizes, scatter.output_sizes) == ([[1024]], [[512]])
    dump = pickle.loads(fr_dump.path_of(tmp_path, 0).read_bytes())
    assert dump["version"] == "2.10" and dump["pg_config"]["world"] == {"name": "world", "desc": "default_pg",
                                                                         "ranks": "[0, 1]"}
    assert [e["input_dtypes"] for e in dump["entries"][:2]] == [["Float"], ["BFloat16"]]
    assert [e["record_id"] for e in dump["entries"]] == list(range(7))  # collectives counted over both groups


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_an_extra_all_reduce_on_rank_1_is_the_mismatch_fr_trace_names(tmp_path, caplog, order):
    k = 4
    flight.dump(tmp_path, snap(0, steps(1, 6), busy="all_reduce (world)"))
    flight.dump(tmp_path, snap(1, steps(1, 7, extra_at=k)))
    with caplog.at_level(logging.INFO, logger="Flight Recorder"):
        db = analyse(tmp_path, order)
    first = failed(db)[0]
    assert (first.group_id, first.collective_seq_id, first.collective_name) == ("world", k, "nccl:all_reduce")
    assert all(c.pass_check for c in db.collectives if c.collective_seq_id < k)
    # the other rank's call at seq k, and why it does not match: 4 floats against the bucket's 19,200
    (other, theirs), = first.mismatch_collectives.items()
    assert other == order[1] and theirs.type_of_mismatch.state == MatchState.SIZE_OR_SYNTAX_MISMATCH
    assert sorted([first.input_sizes, theirs.input_sizes]) == [[[4]], [[19200]]]
    assert f"Collective sequence number: {k} has errors" in caplog.text
    assert "'[[4]]' does not match found input sizes" in caplog.text or "'[[19200]]' does not match" in caplog.text


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_rings_that_wrapped_are_compared_where_both_hold_them(tmp_path, order):
    # the last ops only: rank 1's extra call moved its window one op on, so rank 0 alone still holds seq 10;
    # the record ids (collectives counted) make fr_trace drop it, where the ring's places would not
    flight.dump(tmp_path, snap(0, steps(10, 20)))
    flight.dump(tmp_path, snap(1, steps(11, 21, extra_at=15)))
    firsts = [pickle.loads(fr_dump.path_of(tmp_path, r).read_bytes())["entries"][0]["record_id"] for r in (0, 1)]
    assert firsts == [9, 10]
    db = analyse(tmp_path, order)
    assert failed(db)[0].collective_seq_id == 15 and db.collectives[0].collective_seq_id == 11
    # and agreeing rings holding different windows match throughout
    for rank, first in ((0, 10), (1, 12)):
        flight.dump(tmp_path, snap(rank, steps(first, 20)))
    assert not failed(analyse(tmp_path, order))


def test_the_backend_names_the_ops_and_a_failure_to_write_costs_the_json_nothing(tmp_path, monkeypatch):
    record = fr_dump.record(snap(0, steps(1, 2)), "gloo")
    assert [e["profiling_name"] for e in record["entries"]] == ["gloo:all_reduce"] * 2
    assert fr_dump.backend_in_use() == "nccl"  # no torch.distributed group in this process

    def broken(folder, snapshot):
        raise KeyError("ring")

    monkeypatch.setattr(fr_dump, "write", broken)
    path = flight.dump(tmp_path, snap(1, steps(1, 2)))
    assert json.loads(path.read_text())["rank"] == 1 and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
