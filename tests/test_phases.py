"""The phase recorder: interval arithmetic, and a calibrated 2-rank workload whose true compute, comm,
overlap and exposed time are known."""

import json
import statistics
import sys
from pathlib import Path

import pytest
from spawn import spawn

from commprof.record import hooks
from commprof.record.clock import CpuClock
from commprof.record.phases import breakdown, intersect, length, subtract, union
from commprof.record.recorder import OpRecorder
from commprof.record.volume import step_volume, volume_table, wire_factor

HERE = Path(__file__).parent


def test_interval_arithmetic():
    u = union([(5, 7), (0, 2), (1, 3), (7, 9), (10, 10)])
    assert u == [(0, 3), (5, 9)]
    assert length(u) == 7
    assert intersect(u, [(2, 6), (8, 20)]) == [(2, 3), (5, 6), (8, 9)]
    assert subtract([(0, 10)], [(2, 3), (5, 7), (9, 12)]) == [(0, 2), (3, 5), (7, 9)]
    assert subtract([(0, 4)], []) == [(0, 4)]


def test_breakdown_blocking_op_inside_a_phase_is_not_compute():
    # backward 0..100 with a blocking op 40..60 inside it, an async op 70..130 waited on 100..130.
    ops = [("all_gather", 8, 2, 40, 60, False, "world"), ("all_reduce", 8, 2, 70, 130, True, "world")]
    b = breakdown(start=0, end=140, phases=[("data", 0, 0), ("backward", 0, 100), ("step", 130, 140)],
                  ops=ops, waits=[("all_reduce", 100, 130)])
    assert b.wall_ns == 140
    assert b.compute_ns == 100 - 20 + 10
    assert b.comm_ns == 20 + 60
    assert b.overlap_ns == 30  # 70..100
    assert b.exposed_comm_ns == 20 + 30
    assert b.bubble_ns == 0
    assert b.comm_by_group_ns == {"world": 80}


def test_breakdown_on_the_device_a_stream_ordered_op_blocks_and_an_async_one_overlaps():
    # GPU (waits None): an all_gather on the training stream 40..60 inside backward 0..100 (HOST False), an
    # all_reduce on a stream of its own 70..130 (HOST None), hidden by backward up to 100, then exposed.
    ops = [("all_gather", 8, 2, 40, 60, False, "world"), ("all_reduce", 8, 2, 70, 130, None, "world")]
    b = breakdown(start=0, end=140, phases=[("backward", 0, 100), ("step", 130, 140)], ops=ops, waits=None)
    assert b.compute_ns == 100 - 20 + 10
    assert b.comm_ns == 20 + 60
    assert b.overlap_ns == 30  # 70..100: the async op under compute
    assert b.exposed_comm_ns == 20 + 30


def test_breakdown_blocked_send_recv_is_bubble_not_exposed_comm():
    # a stage: recv blocks 0..30 (waiting on its neighbour), forward 30..50, send 50..52, a dp
    # all_reduce issued 60, waited on 60..70.
    ops = [("recv", 8, 2, 0, 30, False, "pp"), ("send", 8, 2, 50, 52, False, "pp"),
           ("all_reduce", 8, 2, 60, 70, True, "dp")]
    b = breakdown(start=0, end=80, phases=[("forward", 30, 50), ("step", 70, 80)], ops=ops,
                  waits=[("all_reduce", 60, 70)])
    assert b.bubble_ns == 32
    assert b.exposed_comm_ns == 10
    assert b.compute_ns == 30
    assert b.comm_by_group_ns == {"dp": 10, "pp": 32}
    assert b.schedule_ns == 52  # recv issued at 0 … send done at 52


def test_an_op_logged_as_an_iteration_is_taken_is_never_lost(monkeypatch):
    # An async op completes on a backend's thread whenever it does: here one lands while the tracker
    # reads the iteration's ops, and one between the take of set-up's ops and the iteration's start.
    recorder = OpRecorder(CpuClock)
    tracker = hooks.Tracker(recorder, warmup=0)
    log = recorder.ops.append

    def op(name: str, nbytes: int) -> None:
        now = CpuClock.now()
        log((name, nbytes, 2, now, now + 1, True, "world"))

    op("broadcast", 4)  # set-up
    begin = tracker.phases.begin
    monkeypatch.setattr(tracker.phases, "begin", lambda *a, **k: (op("all_gather", 16), begin(*a, **k)))
    tracker.begin()
    op("all_reduce", 8)
    measured = recorder.ops[-1:]
    volume = hooks.step_volume
    monkeypatch.setattr(hooks, "step_volume", lambda ops: (op("reduce_scatter", 32), volume(ops))[1])
    tracker.end()
    assert tracker.volumes == [step_volume(measured)]
    tracker.finish()
    assert sorted(o[0] for o in tracker.outside) == ["all_gather", "broadcast", "reduce_scatter"]
    assert recorder.ops == []


def test_volume_wire_factors_and_prediction_table():
    assert wire_factor("all_reduce", 4) == pytest.approx(1.5)
    assert wire_factor("all_gather", 4) == pytest.approx(0.75)
    assert wire_factor("all_reduce", 1) == 0
    per = step_volume([("all_reduce", 100, 4, 0, 1, False, "world"), ("all_reduce", 60, 4, 1, 2, True, "world"),
                       ("all_gather", 40, 4, 2, 3, False, "world"), ("all_reduce", 10, 2, 3, 4, False, "dp")])
    assert per["all_reduce (dp)"] == {"calls": 1, "payload_bytes": 10, "wire_bytes": 10.0}
    assert per["all_reduce"] == {"calls": 2, "payload_bytes": 160, "wire_bytes": 240.0}
    table = volume_table(per, {"all_reduce": 160, "reduce_scatter": 8}, group_sizes={"world": 4}, steps_per_epoch=10)
    assert table["all_reduce"]["bytes_per_epoch"] == 1600
    assert table["all_reduce"]["predicted_wire_bytes_per_step"] == 240
    assert table["reduce_scatter"]["payload_bytes_per_step"] == 0
    assert table["all_gather"]["predicted_payload_bytes_per_step"] == 0


@pytest.fixture(scope="module")
def calibrated():
    proc = spawn([sys.executable, str(HERE / "phases_worker.py")], nproc=2, backend="gloo")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    by_case = {}
    for row in rows:
        by_case.setdefault(row["case"], []).append(row)
    return {case: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k not in ("case",)}
            for case, rs in by_case.items()}


def close(got, want, rel=0.10, abs_ms=2.0):
    return abs(got - want) <= max(rel * want, abs_ms)


LATE_MS = 12.0
"""How late an async op's completion may be stamped on this 2-core machine: gloo's callback needs a core
and the GIL while rank 0 spins (seen: 1-7 ms, up to 9.8 ms before the worker shortened the switch
interval). A blocking op is stamped by the thread it returns to: within the 10 %."""


def hidden_until_join(c) -> bool:
    """The op ends when rank 1 joins (not before: from its issue, which a busy machine may delay), stamped at
    most LATE_MS later on an idle machine — more on a busy one, by as much as a plain thread woken at the join
    was late in the same run (the worker's control). Where rank 0 is still computing at the join, the stamp
    may wait for a core as long as it stays nearer the join than the wait: on a busy machine gloo's callback
    was seen 20 ms late while the control's thread was 2 ms late; a stamp taken at the wait instead, the
    fault this looks for, is ~70 ms late."""
    late = max(LATE_MS + c["wake_late_ms"], (c["issue_to_wait_min_ms"] - c["join_ms"]) / 2)
    return c["join_ms"] - c["issued_ms"] - 1.0 <= c["comm_ms"] <= c["join_ms"] + late


def forward_measured(c) -> bool:
    """The recorder's compute lies between the spin's own duration and the time around the phase."""
    return c["forward_min_ms"] - 0.5 <= c["compute_ms"] <= c["forward_max_ms"] + 0.5


def test_calibrated_blocking_comm_has_no_overlap(calibrated):
    c = calibrated["blocking"]  # compute 60 ms, then a blocking op that completes when rank 1 joins
    assert c["forward_min_ms"] >= 60 and forward_measured(c), c
    assert close(c["comm_ms"], c["join_ms"] - c["forward_end_ms"]), c
    assert close(c["exposed_comm_ms"], c["join_ms"] - c["forward_end_ms"]), c
    assert c["overlap_ms"] < 1.0, c


def test_calibrated_async_comm_hidden_behind_compute(calibrated):
    c = calibrated["overlap"]  # issued at 0, joined at ~80 ms, compute 150 ms: all hidden
    assert c["forward_min_ms"] >= 150 and forward_measured(c), c
    assert hidden_until_join(c), c
    # all of the op but the stretch from its issue to the phase's start (µs when idle; a busy machine may
    # pause the rank there for ms) lies inside the compute, and only that stretch is exposed. Held per
    # repeat: the medians keep the order
    assert c["comm_outside_compute_ms"] <= c["issue_to_phase_max_ms"] + 0.5, c
    assert c["exposed_comm_ms"] <= c["issue_to_phase_max_ms"] + 0.5, c


def test_calibrated_async_comm_partly_exposed(calibrated):
    c = calibrated["partial"]  # issued at 0, compute 60 ms, joined at ~150 ms
    assert c["forward_min_ms"] >= 60 and forward_measured(c), c
    assert hidden_until_join(c), c
    assert close(c["overlap_ms"], c["compute_ms"]), c
    # waited on while in flight: the op completes when the wait returns, so comm − exposed is the time from
    # its issue to the wait (the compute and the statements around it); 2 ms for the wait's own stamp
    assert c["issue_to_wait_min_ms"] - 0.5 <= c["comm_minus_exposed_ms"] <= c["issue_to_wait_max_ms"] + 2.0, c
    assert c["comm_minus_exposed_ms"] >= c["compute_ms"] - 0.5, c
    assert c["exposed_comm_ms"] <= c["comm_ms"]
