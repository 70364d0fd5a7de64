"""NVTX from `commprof run`, seen by a real injection library: every iteration, phase, comm op and wait
is one balanced range in domain `commprof`, with the category that says what it is; and every op is also
an in-flight start/end range in domain `commprof comm (world)`, as long as the op log says it was."""

import json
import shutil
import statistics
import sys
from collections import Counter
from pathlib import Path

import pytest
from spawn import commprof, env_for_tests
from test_nsys import trace_ops
from test_trace import trace_spans

from commprof.record import trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
import nvtx_recorder  # noqa: E402


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the NVTX recorder")
def test_iterations_phases_ops_and_waits_are_ranges(tmp_path):
    lib = nvtx_recorder.build(tmp_path)
    prefix = tmp_path / "rec"
    env = env_for_tests(**nvtx_recorder.recorder_env(lib, prefix, {}))
    # mnist-cnn's 87,360 gradient bytes in 40 KiB buckets: 3 all_reduces per step
    proc = commprof("run", "--strategy", "ddp", "--nproc", "2", "--steps", "3", "--warmup", "1",
                    "--bucket-mb", "0.04", "--batch-size", "8", "--eval-samples", "0", env=env)
    assert proc.returncode == 0, proc.stderr
    records = [r for r in nvtx_recorder.read_records(prefix) if r["domain"] == "commprof"]
    assert not nvtx_recorder.unbalanced(records)
    pids = {r["pid"] for r in records}
    assert len(pids) == 2
    for pid in pids:
        pushes = [r for r in records if r["pid"] == pid and r["kind"] == "push"]
        count = Counter((r["category"], r["message"].split(" ")[0]) for r in pushes)
        assert count[("iteration", "iteration")] == 3
        for phase in ("forward", "backward"):
            assert count[("compute", phase)] == 3
        assert count[("optimizer", "step")] == 3
        assert count[("data", "data")] == 3
        assert count[("comm", "all_reduce")] == 3 * 3
        assert count[("wait", "wait")] == 3 * 3
        assert all(r["depth"] >= 1 for r in pushes if r["category"] in ("comm", "wait", "compute", "data"))
        ops = [r for r in pushes if r["category"] == "comm"]
        assert all(r["message"].startswith("all_reduce (world) ") and r["message"].endswith(" float32") for r in ops)
        assert sum(r["payload"] for r in ops) == 3 * 87_360  # the bytes ride along as the NVTX payload
        assert {r["color"] for r in ops} == {0xFFF44336}


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the NVTX recorder")
def test_every_op_is_in_flight_from_issue_to_completion(tmp_path):
    lib = nvtx_recorder.build(tmp_path)
    prefix, traced = tmp_path / "rec", tmp_path / "trace"
    env = env_for_tests(**nvtx_recorder.recorder_env(lib, prefix, {}))
    # 3 buckets a step: the first completes during backward, on gloo's thread, while the others are issued
    proc = commprof("run", "--strategy", "ddp", "--nproc", "2", "--steps", "4", "--warmup", "1",
                    "--bucket-mb", "0.04", "--batch-size", "8", "--eval-samples", "0", "--trace", str(traced), env=env)
    assert proc.returncode == 0, proc.stderr
    records = nvtx_recorder.read_records(prefix)
    clocks = json.loads((traced / "trace.json").read_text())["otherData"]["clock_sync"]
    assert {r["applied_offset_ns"] for r in clocks["ranks"]} == {0}  # one host: one clock
    epoch = clocks["epoch_ns"]
    for rank in range(2):
        events = trace.load(traced / f"rank{rank}.trace.json")
        pid, _ = trace_spans(events)  # the training thread's native id: its process's id
        mine = [r for r in records if r["pid"] == pid]
        flights = [r for r in nvtx_recorder.start_end_ranges(mine) if r["message"].startswith("all_reduce ")]
        issued = [r for r in mine if r["kind"] == "push" and r["category"] == "comm"]
        assert len(flights) == len(issued) == 4 * 3
        for flight, push in zip(flights, issued):
            assert flight["domain"] == "commprof comm (world)" and flight["dur_ns"] is not None
            assert [flight[k] for k in ("category", "message", "color", "payload")] == \
                [push[k] for k in ("category", "message", "color", "payload")]
            assert flight["ts_ns"] >= push["ts_ns"] and flight["tid"] == push["tid"]  # issued inside the call
        # the op log's spans of the measured steps (the Chrome trace's comm thread) are the last 9 ranges, each
        # inside its range on the one clock both use (CLOCK_MONOTONIC: the trace's µs since rank 0's epoch):
        # the range starts just before the op's start stamp and ends just after its end stamp, by an NVTX call
        # and whatever the scheduler adds to one: the typical overhang is a small part of a typical op (a range
        # that ended at the wait, not at completion, would overhang by the wait's distance, milliseconds)
        ops = trace_ops(events)
        assert len(ops) == 3 * 3
        overhang = []
        for flight, op in zip(flights[-len(ops):], ops):
            start, end = epoch + round(op["ts"] * 1e3), epoch + round((op["ts"] + op["dur"]) * 1e3)
            assert flight["ts_ns"] <= start + 1 and flight["ts_ns"] + flight["dur_ns"] >= end - 1, (flight, op)
            overhang.append(flight["ts_ns"] + flight["dur_ns"] - end)
        assert statistics.median(overhang) <= 0.5 * statistics.median(op["dur"] * 1e3 for op in ops), overhang
