"""torch's own flight record set against commprof's counts (commprof/profile/torch_record.py), on a real dump: rank 0
of 2 gloo ranks (tests/recorded/fr/, made by its fr_script.py), three stamped iterations each of an all_reduce, an
all_gather_into_tensor, a subgroup's broadcast, a functional all_reduce, a C++ `pg.allreduce`, a reduce_scatter,
a send/recv and a gather, with an all_reduce before and after them. commprof's side is written here as commprof
counts it: where both saw an op the counts are equal, the C++ call commprof did not count is counted from the
record, and what is in neither is said. No process starts."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from rich.console import Console

from commprof.profile import torch_record
from commprof.profile.results import with_record
from commprof.report.script_table import profile_tables, record_note, summary_text

FR = Path(__file__).resolve().parents[1] / "recorded" / "fr"
DUMP = json.loads((FR / "dump.json").read_text())
META = json.loads((FR / "spans.json").read_text())
SPANS = [tuple(s) for s in META["spans"]]
GROUPS = {name: tuple(v) for name, v in META["groups"].items()}
CPP = 50 * 4
"""The C++ `pg.allreduce` of 50 floats each iteration."""


def commprof_step(*, cpp: bool = False) -> dict:
    """One iteration of the script as commprof counts it on rank 0: the Python calls and the functional all_reduce
    (1,024 + 64 floats), the all_gather by its output, the reduce_scatter by its input, the send; with `cpp`, the
    C++ `pg.allreduce` too (commprof's backend in front of gloo sees it, torch 2.12 on; on NCCL nothing of
    commprof's does). The gather is no op of commprof's: it counts it as unseen."""
    step = {"all_reduce": {"calls": 2, "payload_bytes": 4 * (1024 + 64)},
            "all_gather": {"calls": 1, "payload_bytes": 2 * 256 * 4},
            "broadcast (ranks0-1)": {"calls": 1, "payload_bytes": 400},
            "reduce_scatter": {"calls": 1, "payload_bytes": 16 * 4},
            "send": {"calls": 1, "payload_bytes": 20}}
    if cpp:
        step["all_reduce"] = {"calls": 3, "payload_bytes": 4 * (1024 + 64) + CPP}
    return step


def rows(block: dict) -> dict:
    return {r["key"]: (r["status"], r["commprof_calls"], r["commprof_payload_bytes"], r["record_calls"],
                       r["record_payload_bytes"]) for r in block["rows"]}


def test_the_record_holds_each_iterations_ops_and_none_outside_them():
    tallied = torch_record.tally(DUMP, SPANS, GROUPS)
    assert tallied["entries"] == len(DUMP["entries"]) == 3 * 7 + 2 and not tallied["wrapped"]
    assert tallied["first"] == 0
    for step in tallied["steps"]:  # the 8-float all_reduces before and after are in no iteration
        assert step == {"all_reduce": [4096, 256, CPP, 64], "all_gather": [2048], "broadcast (ranks0-1)": [400],
                        "gather": [12]}
    assert tallied["sizes"]["broadcast (ranks0-1)"] == 2


def test_counts_are_equal_where_both_saw_an_op_and_the_cpp_call_is_counted_from_the_record():
    block = torch_record.reconcile(torch_record.tally(DUMP, SPANS, GROUPS), [commprof_step()] * 3,
                                   unseen={"gather": 6}, unseen_steps=[{"gather": 1}] * 3)
    assert rows(block) == {
        "all_gather": ("agree", 3, 6144, 3, 6144),
        "broadcast (ranks0-1)": ("agree", 3, 1200, 3, 1200),
        # the record's all_reduces are commprof's two a step and the C++ one it did not count
        "all_reduce": ("record more", 6, 3 * 4352, 9, 3 * (4352 + CPP)),
        "gather": ("record only", 0, 0, 3, 36),
        # gloo records its reduce_scatter as the all_reduce it runs: those are moved back, call for call
        "reduce_scatter": ("agree", 3, 192, 3, 192),
        "send": ("commprof only", 3, 60, 0, 0),  # gloo's record holds no point-to-point op
    }
    assert block["iterations"] == block["measured"] == 3 and not block["agree"]
    # in the volume table's form, per iteration: the C++ all_reduce beside commprof's, and the gather
    assert block["volume"] == {
        "all_reduce": {"calls_per_step": 1.0, "payload_bytes_per_step": CPP, "wire_bytes_per_step": CPP,
                       "bytes_per_epoch": CPP, "wire_bytes_per_epoch": CPP},
        "gather": {"calls_per_step": 1.0, "payload_bytes_per_step": 12, "wire_bytes_per_step": None,
                   "bytes_per_epoch": 12, "wire_bytes_per_epoch": None}}
    # rank 0's three gathers are the record's; rank 1's are in neither
    assert block["in_neither"] == {"gather": 3}


def test_where_commprof_counted_the_cpp_call_too_only_the_unseen_gather_is_the_records():
    block = torch_record.reconcile(torch_record.tally(DUMP, SPANS, GROUPS), [commprof_step(cpp=True)] * 3,
                                   steps_per_epoch=10)
    statuses = {key: r[0] for key, r in rows(block).items()}
    assert statuses == {"all_gather": "agree", "broadcast (ranks0-1)": "agree", "all_reduce": "agree",
                        "gather": "record only", "reduce_scatter": "agree", "send": "commprof only"}
    assert list(block["volume"]) == ["gather"] and block["volume"]["gather"]["bytes_per_epoch"] == 120
    explained = {r["key"]: r["why"] for r in block["rows"] if "why" in r}
    assert explained == {"reduce_scatter": "gloo records a reduce_scatter as the all_reduce it runs",
                         "send": "torch's gloo record holds no point-to-point op"}
    assert "in_neither" not in block  # no unseen calls given: nothing to say of them


def test_every_count_agreeing_is_said_so():
    tallied = torch_record.tally(DUMP, SPANS, GROUPS)
    for step in tallied["steps"]:
        del step["gather"]
    block = torch_record.reconcile(tallied, [commprof_step(cpp=True)] * 3)
    assert block["agree"] and block["volume"] == {}


def test_a_ring_that_wrapped_is_reconciled_over_the_iterations_it_still_holds():
    dump = copy.deepcopy(DUMP)
    dump["entries"] = dump["entries"][10:]  # as a ring of 13 would hold them: the second iteration's from its broadcast
    tallied = torch_record.tally(dump, SPANS, GROUPS)
    assert tallied["wrapped"] and tallied["first"] == 2 and len(tallied["steps"]) == 1
    block = torch_record.reconcile(tallied, [commprof_step()] * 3)
    assert block["iterations"] == 1 and block["measured"] == 3
    assert rows(block)["all_reduce"] == ("record more", 2, 4352, 3, 4352 + CPP)
    assert block["volume"]["all_reduce"]["calls_per_step"] == 1.0
    note = record_note({"buffer_size": 13, "set_by": "commprof", **block})
    assert "the last 1 of 3 measured iterations (its ring of 13 ops reaches back no further)" in note


def test_iterations_before_the_stamped_ones_are_left_out():
    # rank 0 stamps no more iterations than the ring holds ops: commprof's older ones have no span, and are not set
    # against the record
    older = {"all_reduce": {"calls": 7, "payload_bytes": 1}}
    block = torch_record.reconcile(torch_record.tally(DUMP, SPANS, GROUPS), [older] * 2 + [commprof_step(cpp=True)] * 3)
    assert block["iterations"] == 3 and block["measured"] == 5
    assert rows(block)["all_reduce"] == ("agree", 9, 3 * (4352 + CPP), 9, 3 * (4352 + CPP))


def test_an_iteration_the_ring_reaches_into_is_left_out_whole():
    dump = copy.deepcopy(DUMP)
    dump["entries"] = dump["entries"][7:]  # from the first iteration's gather on: its other ops were dropped
    tallied = torch_record.tally(dump, SPANS, GROUPS)
    assert tallied["first"] == 1 and len(tallied["steps"]) == 2


def test_bytes_follow_commprofs_convention():
    gathered = {"profiling_name": "gloo:all_gather", "input_sizes": [[256]], "input_dtypes": ["Float"],
                "output_sizes": [[2, 256]], "output_dtypes": ["Float"]}
    assert torch_record.entry_bytes(gathered, "all_gather") == 2 * 256 * 4  # world size × the per-rank count
    coalesced = {"input_sizes": [[3, 4], [5]], "input_dtypes": ["BFloat16", "Long"]}
    assert torch_record.entry_bytes(coalesced, "all_reduce") == 12 * 2 + 5 * 8
    assert torch_record.entry_bytes({"input_sizes": [], "input_dtypes": []}, "barrier") == 0


@pytest.mark.parametrize("raw,name", [("gloo:all_reduce", "all_reduce"), ("nccl:send 0->1", "send"),
                                      ("nccl:_allgather_base", "all_gather"), ("allreduce", "all_reduce"),
                                      ("functional all_reduce", "all_reduce"), ("ddp broadcast", "broadcast"),
                                      ("reduce_scatter_tensor", "reduce_scatter"), ("gather", "gather")])
def test_torchs_names_are_commprofs(raw, name):
    assert torch_record.op_name(raw) == name


def test_the_record_is_turned_on_unless_the_user_sized_it():
    env: dict = {}
    assert torch_record.turn_on(env) == {"buffer_size": torch_record.BUFFER_SIZE, "set_by": "commprof"}
    assert env == {"TORCH_FR_BUFFER_SIZE": str(torch_record.BUFFER_SIZE)}
    assert torch_record.turn_on({"TORCH_FR_BUFFER_SIZE": "0"}) == {"buffer_size": 0, "set_by": "TORCH_FR_BUFFER_SIZE"}
    old = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"}
    assert torch_record.turn_on(old) == {"buffer_size": 500, "set_by": "TORCH_NCCL_TRACE_BUFFER_SIZE"}
    assert "TORCH_FR_BUFFER_SIZE" not in old


def test_torchs_record_is_read_in_this_process_whatever_it_holds():
    got = torch_record.read()  # no process group made here: both of torch's rings are empty, and read all the same
    assert isinstance(got["entries"], list)
    assert all(e["recorder"] in ("cpu", "nccl") for e in got["entries"])


def test_a_record_of_no_op_is_set_against_nothing():
    tallied = torch_record.tally({"entries": []}, SPANS, GROUPS)
    record = {"buffer_size": 2000, "set_by": "commprof", "tallied": tallied, "unseen_steps": [{}] * 3}
    block = with_record(record, [commprof_step()] * 3, {"backend": "mpi"}, 3, {})
    assert block == {"buffer_size": 2000, "set_by": "commprof",
                     "why": "torch's record holds no op of this job's groups (backend mpi)"}


def _doc(block: dict) -> dict:
    """The recorded `fused` profile's report with `block` as its torch_record."""
    doc = json.loads((Path(__file__).resolve().parents[1] / "recorded" / "fused" / "profile.json").read_text())
    doc["torch_record"] = block
    return doc


def _shown(doc: dict) -> str:
    console = Console(record=True, width=200, color_system=None)
    for table in profile_tables(doc):
        console.print(table)
    return console.export_text()


def test_the_volume_table_marks_what_the_record_counted_and_the_unseen_line_is_what_is_in_neither():
    record = {"buffer_size": 2000, "set_by": "commprof", "tallied": torch_record.tally(DUMP, SPANS, GROUPS),
              "unseen_steps": [{"gather": 1}] * 3}
    block = with_record(record, [commprof_step()] * 3, {"backend": "gloo"}, 12, {"gather": 6})
    assert block["buffer_size"] == 2000 and block["set_by"] == "commprof"
    doc = _doc(block)
    doc["unseen"] = {"gather": 6}
    shown = _shown(doc)
    marked = [line.split("│")[1].strip() for line in shown.splitlines() if line.startswith("│") and " *" in line]
    assert marked == ["all_reduce *", "gather *"], shown
    gather = next(line for line in shown.splitlines() if "gather *" in line)
    assert "12 B" in gather and "?" in gather  # no wire bytes for gather in commprof's measurement model
    words = " ".join(shown.split())
    assert "* counted from torch's flight record of rank 0" in words
    assert "torch's record of rank 0 over its 3 measured iterations: it holds every call commprof counted but send " \
           "(torch's gloo record holds no point-to-point op), and more (*): all_reduce, gather" in words, words
    line = summary_text(doc).plain
    assert "unseen (in neither commprof's count nor torch's record of rank 0's measured iterations; all ranks): " \
           "gather ×3" in line


def test_a_record_that_is_off_is_said_and_an_older_report_shows_none():
    doc = _doc(with_record({"buffer_size": 0, "set_by": "TORCH_FR_BUFFER_SIZE", "why": "off: TORCH_FR_BUFFER_SIZE=0"},
                           [], {}, 1, {}))
    assert "torch's flight record: none (off: TORCH_FR_BUFFER_SIZE=0)" in " ".join(_shown(doc).split())
    del doc["torch_record"]
    assert "torch's" not in _shown(doc)
