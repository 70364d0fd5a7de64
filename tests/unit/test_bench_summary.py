"""The bench summary names a slowest rank only when it stands out: the slowest in at least two thirds of a
collective's rows, and by at least STANDS_OUT over the other ranks; each reduction of -o all has its row; at 120
columns each row is one line, its ranks a count under "ranks"."""

import io

import pytest
from rich.console import Console

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


def test_a_row_is_one_line_at_120_columns_its_ranks_a_count():
    # three algorithms and two dtypes, each with a slowest rank named: 6 rows, each told apart by its name and type
    records = [{**r, "algo": algo, "dtype": dtype} for algo in ("library", "ring", "rabenseifner")
               for dtype in ("float32", "bfloat16") for r in _rows(1, over=2 * STANDS_OUT)]
    rows = summarize(records)
    fitting = summary_table(rows)
    assert [row[1] for row in _cells(fitting.table)] == ["2"] * 6  # under "ranks": "2", not "2 ranks" on two lines
    console = Console(width=120, file=io.StringIO(), color_system=None)
    console.print(fitting)
    text = console.file.getvalue()
    lines = [line for line in text.splitlines() if line.startswith("│")]
    assert len(lines) == 6 and "…" not in text, text
    for row, line in zip(rows, lines):
        assert line.startswith(f"│ {row['name']} ") and row["dtype"] in line, text
        assert f"1 (+{row['slowest']['over_pct']:.0f} % in 6 of 6 sizes)" in line, text
