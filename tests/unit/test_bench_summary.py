"""The bench summary names a slowest rank only when it stands out: the slowest in at least two thirds of a
collective's rows, and by at least STANDS_OUT over the other ranks."""

import pytest

from commprof.report.bench_summary import STANDS_OUT, summarize, summary_table


def _rows(slow_rank: int, over: float, n: int = 6, slowest_in: int = 6) -> list[dict]:
    rows = []
    for i in range(n):
        late = slow_rank if i < slowest_in else 1 - slow_rank
        per_rank = [{"rank": r, "mean_us": 100.0 * (1 + over if r == late else 1)} for r in (0, 1)]
        rows.append({"collective": "all_reduce", "dtype": "float32", "redop": "sum", "world_size": 2, "inplace": False,
                     "nbytes": 8 << i, "time_us": 100.0, "busbw_GBps": 0.1 * (i + 1), "wrong": 0,
                     "slowest_rank": late, "per_rank": per_rank})
    return rows


def test_a_slowest_rank_is_named_only_when_it_stands_out():
    named = summarize(_rows(1, over=2 * STANDS_OUT))[0]["slowest"]
    assert named["rank"] == 1 and named["rows"] == 6 and named["over_pct"] == pytest.approx(200 * STANDS_OUT)
    assert summarize(_rows(1, over=STANDS_OUT / 2))[0]["slowest"] is None  # slowest, by too little
    assert summarize(_rows(1, over=1.0, slowest_in=3))[0]["slowest"] is None  # slowest in half the rows only


def _cells(table) -> list[list[str]]:
    columns = table.columns
    return [[str(c._cells[i]) for c in columns] for i in range(table.row_count)]


def test_each_reduction_of_o_all_has_its_op_in_its_row():
    # -o sum,max: two rows of all_reduce float32, which were identical but for their figures
    records = [{**r, "redop": op} for op in ("sum", "max") for r in _rows(0, over=0.0)]
    table = summary_table(summarize(records)).table
    kinds = [row[2] for row in _cells(table)]
    assert kinds == ["float32 sum", "float32 max"]
    one_op = summary_table(summarize(_rows(0, over=0.0))).table
    assert [row[2] for row in _cells(one_op)] == ["float32"]  # one reduction: the dtype alone, as before
