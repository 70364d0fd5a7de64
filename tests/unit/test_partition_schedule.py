"""Pipelines as pure functions: GPipe and 1F1B schedules (their order, the micro-batches each stage holds,
the bubble fraction) and the partition of layers into stages (balanced on the largest stage, or given)."""

import pytest

from commprof.base.errors import UsageError
from commprof.parallel.partition import balanced_starts, describe, explicit_starts
from commprof.parallel.schedule import bubble_fraction, gpipe, one_f_one_b, peak_in_flight


def test_schedule_orders_and_memory_bound():
    assert gpipe(3, 2, 0) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    assert one_f_one_b(4, 2, 0) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    assert one_f_one_b(4, 2, 1) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    for p in (2, 3, 4):
        for s in range(p):
            for m in (1, 2, 5, 8):
                actions = one_f_one_b(m, p, s)
                assert sorted(actions) == sorted(gpipe(m, p, s))  # every micro-batch once each way
                assert peak_in_flight(actions) == min(p - s, m)
                assert peak_in_flight(gpipe(m, p, s)) == m
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert bubble_fraction(1, 2) == pytest.approx(0.5)


def test_partition_minimises_the_largest_stage():
    assert balanced_starts([1, 1, 1, 1], 2) == [0, 2]
    assert balanced_starts([10, 1, 1, 1, 10], 3) == [0, 1, 4]
    assert balanced_starts([5, 1, 1, 1, 1, 1], 2) == [0, 1]
    assert describe([0, 1, 4], 5) == [[0, 0], [1, 3], [4, 4]]
    assert explicit_starts((2, 3), 3, 5) == [0, 2, 3]
    with pytest.raises(UsageError, match="more stages than the 4 layers"):
        balanced_starts([1, 1, 1, 1], 5)
    with pytest.raises(UsageError, match="must increase strictly"):
        explicit_starts((3, 2), 3, 5)
    with pytest.raises(UsageError, match="2 stages need 1"):
        explicit_starts((1, 2), 2, 5)
