"""The what-if replays of findings/whatif.py on programs built by hand: fusing small ops, and pricing the ops a
straggler made late by their aligned instances."""

import pytest


def test_fusing_small_ops_replays_them_as_one_op_at_the_last_and_drops_their_sync_points():
    from commprof.findings import whatif
    from commprof.perfmodel.replay import replay
    from commprof.perfmodel.timeline import Op, Program

    def op(k, nbytes=100):
        return Op(key=("world", (0, 1), "all_reduce", k), name="all_reduce", label="world", members=(0, 1),
                  nbytes=nbytes, measured_ms=1.0)
    small, big = [op(k) for k in range(3)], op(3, nbytes=10**6)
    busy = ((1.0, 3.0, 1.0), (3.0, 1.0, 1.0))  # each rank's time before each small op: the same 5 ms in all
    programs = tuple(Program(r, 0, tuple(s for b, o in zip(busy[r], small) for s in (("busy", b), ("issue", o),
                                                                                     ("wait", o, 0.0)))
                             + (("issue", big), ("wait", big, 0.0))) for r in (0, 1))
    cost = {o.key: 2.0 for o in small} | {big.key: 4.0}
    # measured: each small op waits for the later rank, 3 + 3 + 1 ms of busy and 2 ms each, then the big one
    assert replay(programs, lambda o: cost[o.key])[0] == pytest.approx(7 + 3 * 2 + 4)
    edit, fused_cost = whatif.fused({o.key: ("all_reduce", "world", (0, 1)) for o in small},
                                    lambda o: 0.5 + o.nbytes / 1e3, lambda o: cost[o.key])
    step = replay(edit(programs), fused_cost)[0]
    # fused: one sync point after each rank's own 5 ms, one op of 300 bytes by the model, the big op untouched
    assert step == pytest.approx(5 + 0.8 + 4)
    assert [s[1].nbytes for s in edit(programs)[0].steps if s[0] == "issue"] == [300, 10**6]

def test_ops_a_straggler_made_late_cost_their_aligned_transfer_without_it():
    from commprof.findings import whatif
    from commprof.findings.arrivals import Analysis, Arrival
    from commprof.perfmodel.timeline import Op

    def arrival(k, nbytes, last, spread, transfer):
        op = Op(key=("world", (0, 1), "all_reduce", k), name="all_reduce", label="world", members=(0, 1),
                nbytes=nbytes, measured_ms=spread + transfer)
        return Arrival(op=op, parties=(0, 1), last=last, spread_ms=spread, transfer_ms=transfer)
    # 1 MiB: met together twice (3.0, 3.4 ms); rank 1 late by 20 ms once, when it took 2.6 ms after arriving,
    # and rank 0 late once; a size never met together keeps its own
    ops = [arrival(0, 1 << 20, 0, 0.1, 3.0), arrival(1, 1 << 20, 1, 0.2, 3.4), arrival(2, 1 << 20, 1, 20.0, 2.6),
           arrival(3, 1 << 20, 0, 20.0, 2.0), arrival(4, 1 << 19, 1, 20.0, 1.9), arrival(5, 1 << 20, 1, 20.0, 3.9)]
    a = Analysis(iterations=1, step_ms=30.0, arrivals=tuple(ops), per_iteration=(), ranks=(), exposed_by_op={})
    cost = whatif.aligned_costs(a, late=1)
    assert [cost(x.op) for x in ops] == pytest.approx([3.0, 3.4, 3.2, 2.0, 1.9, 3.9])
    assert [whatif.measured_costs(a)(x.op) for x in ops] == [x.transfer_ms for x in ops]
    # of the three ops rank 1 made late, the 512 KiB one has no aligned instance: a lower bound
    assert whatif.priced_aligned(a, 1) == pytest.approx(2 / 3) and whatif.priced_aligned(a, 2) == 1.0


def test_a_message_a_straggler_made_late_costs_what_it_took():
    # a pipeline stage posts each micro-batch's irecv ahead: instances of a message whose parties "met together"
    # then complete long after both issues, and pricing the late ones at their median lengthened the step
    # without the straggler past the balanced job's (1.47 of it); nor was any message priced (a lower bound)
    from commprof.findings import whatif
    from commprof.findings.arrivals import Analysis, Arrival
    from commprof.perfmodel.timeline import Op

    def message(k, name, last, spread, transfer):
        op = Op(key=("world", "send-recv", 1, 0, k), name=name, label="world", members=(0, 1), nbytes=8192,
                measured_ms=spread + transfer)
        return Arrival(op=op, parties=(1, 0), last=last, spread_ms=spread, transfer_ms=transfer)
    # met together with long transfers twice; rank 1, the sender, late by 20 ms twice, each 0.2 ms once sent
    ops = [message(0, "recv", 0, 0.1, 6.0), message(1, "recv", 1, 0.2, 7.0), message(2, "recv", 1, 20.0, 0.2),
           message(3, "send", 1, 20.0, 0.3)]
    a = Analysis(iterations=1, step_ms=30.0, arrivals=tuple(ops), per_iteration=(), ranks=(), exposed_by_op={})
    assert [whatif.aligned_costs(a, late=1)(x.op) for x in ops] == pytest.approx([6.0, 7.0, 0.2, 0.3])
    assert whatif.priced_aligned(a, 1) == 1.0


def test_a_cause_taken_away_never_lengthens_the_step():
    # an op priced higher without the cause (its aligned transfer above the one it took late) made the replay
    # of the edited iteration end later: the "step without it" was printed above the step
    from commprof.findings import whatif
    from commprof.findings.arrivals import Analysis, Arrival
    from commprof.perfmodel.timeline import Measured, Op, Program

    op = Op(key=("world", (0, 1), "all_reduce", 0), name="all_reduce", label="world", members=(0, 1),
            nbytes=1 << 20, measured_ms=2.0)
    programs = tuple(Program(r, 12.0, (("busy", 10.0), ("issue", op), ("wait", op, 0.0))) for r in (0, 1))
    m = Measured(source="by hand", strategy="ddp", backend="gloo", world_size=2, hosts=("h", "h"),
                 global_batch=None, iterations=(programs,), measured_wall_ms=12.0)
    a = Analysis(iterations=1, step_ms=12.0, arrivals=(Arrival(op=op, parties=(0, 1), last=1, spread_ms=0.0,
                                                               transfer_ms=2.0),),
                 per_iteration=(), ranks=(), exposed_by_op={})
    assert whatif.step_without(m, a, cost=lambda o: 2.0) == pytest.approx(12.0)
    assert whatif.step_without(m, a, cost=lambda o: 0.5) == pytest.approx(10.5)
    assert whatif.step_without(m, a, cost=lambda o: 5.0) == pytest.approx(12.0)  # dearer: saves nothing
