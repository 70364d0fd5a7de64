"""The phase recorder's arithmetic, without ranks: intervals; an iteration's breakdown into compute, comm,
overlap, exposed comm and bubble, on the host and on the device; no op lost between the tracker's takes;
the per-step volume, its wire factors and its prediction table."""

import random

import pytest

from commprof.record import hooks
from commprof.record.clock import CpuClock
from commprof.record.phases import breakdown, intersect, length, subtract, union
from commprof.record.recorder import OpRecorder
from commprof.record.volume import step_volume, volume_table, wire_factor


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


def test_host_work_between_the_phases_is_other_and_the_columns_sum_to_wall():
    # a batch fetched between forward and backward (no data phase), gradient clipping after backward, a
    # sleep before the step: in no phase, so in no column but `other`
    ops = [("all_reduce", 8, 2, 50, 90, True, "world")]
    b = breakdown(start=0, end=150, phases=[("data", 0, 10), ("forward", 10, 30), ("backward", 40, 80),
                                            ("step", 130, 150)], ops=ops, waits=[("all_reduce", 80, 90)])
    assert (b.data_ns, b.compute_ns, b.exposed_comm_ns, b.bubble_ns) == (10, 20 + 40 + 20, 10, 0)
    assert b.other_ns == 10 + 40  # 30..40 and 90..130
    assert b.data_ns + b.compute_ns + b.exposed_comm_ns + b.bubble_ns + b.other_ns == b.wall_ns
    figures = b.figures()
    assert figures["other_ms"] == pytest.approx(50e-6) and figures["wall_ms"] == pytest.approx(150e-6)
    # an iteration of only phases leaves nothing to other
    assert breakdown(start=0, end=20, phases=[("forward", 0, 20)], ops=[], waits=[]).other_ns == 0


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


def test_interval_operations_match_a_unit_by_unit_count_on_random_intervals():
    rng = random.Random(7)

    def cover(spans):  # the integer units [t, t+1) the intervals cover
        return {t for a, b in spans for t in range(a, b)}

    def spans_of(units):
        return union([(t, t + 1) for t in units])

    for _ in range(300):
        a = [(x, x + rng.randint(0, 12)) for x in (rng.randint(0, 80) for _ in range(rng.randint(0, 9)))]
        b = [(x, x + rng.randint(0, 12)) for x in (rng.randint(0, 80) for _ in range(rng.randint(0, 9)))]
        ua, ub = union(a), union(b)
        assert ua == spans_of(cover(a)) and all(x1 < y0 for (_, x1), (y0, _) in zip(ua, ua[1:]))
        assert length(ua) == len(cover(a))
        assert intersect(ua, ub) == spans_of(cover(a) & cover(b))
        assert subtract(ua, ub) == spans_of(cover(a) - cover(b))
