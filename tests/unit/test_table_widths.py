"""What a user's terminal shows, on recorded results (tests/recorded/bench-2, ddp): bench and run tables at 80,
120 and 200 columns never cut a number and never run past the width, saying which columns a narrow one left
out; `commprof report` honours COLUMNS; the bench summary's figures follow from the records. On records built
as a 64M sweep writes them (three algorithms; two dtypes), bench's tables and summary at 80 and 120 columns keep
every number whole and the columns that tell rows apart (type, the algorithm's name), and the summary is a line
a row. The same on a real terminal: tests/test_terminal_widths.py."""

import json
import os
import re
from pathlib import Path

import pytest
from rich.console import Console

from commprof.cli import main as cli
from commprof.report.bench_summary import summarize, summary_table
from commprof.report.bench_table import bench_table
from commprof.report.compare import run_rows, run_table
from commprof.report.run_table import run_tables

RECORDED = Path(__file__).resolve().parents[1] / "recorded"
WIDTHS = (80, 120, 200)
COLLECTIVES = ("all_reduce", "all_gather", "broadcast")


@pytest.fixture(scope="module")
def bench_doc() -> dict:
    return json.loads((RECORDED / "bench-2" / "bench.json").read_text())


@pytest.fixture(scope="module")
def run_doc() -> dict:
    return json.loads((RECORDED / "ddp" / "run.json").read_text())


def drawn(renderable, width: int) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None)
    console.print(renderable, crop=False)
    return console.export_text()


def whole_at(text: str, width: int) -> None:
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= width, text


@pytest.mark.parametrize("width", WIDTHS)
def test_bench_tables_keep_every_number_whole(bench_doc, width):
    for collective in COLLECTIVES:
        records = [r for r in bench_doc["results"] if r["collective"] == collective]
        text = drawn(bench_table(collective, records), width)
        whole_at(text, width)
        for r in records:  # what every width keeps: each size, each mode's time and busbw
            assert f"{r['time_us']:.2f}" in text and f"{r['busbw_GBps']:.2f}" in text and str(r["nbytes"]) in text
        if width == 200:
            assert "left out" not in text and f"{records[0]['p99_us']:.2f}" in text
        elif width == 80 or "left out" in text:  # at 120 a one-mode table (all_reduce on gloo) fits whole
            assert re.search(rf"left out at {width} columns: count, ", text), text
        modes = {r["inplace"] for r in records}
        assert ("in place only" in text) is (modes == {True}), text


@pytest.mark.parametrize("width", WIDTHS)
def test_run_tables_keep_every_number_whole(run_doc, width):
    grid = run_table(run_rows([{"label": "ddp", "config": {}, "error": None, "result": run_doc}]))
    text = "".join(drawn(t, width) for t in [*run_tables(run_doc), grid])
    whole_at(text, width)
    s = run_doc["summary"]
    assert f"{s['across_ranks']['wall_ms']['avg']:.2f}" in text
    assert f"{s['across_ranks']['exposed_comm_ms']['avg']:.2f}" in text


def test_piped_output_honours_columns(capsys, monkeypatch):
    path = str(RECORDED / "bench-2" / "bench.json")
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["report", path]) == 0
    narrow = capsys.readouterr().out
    whole_at(narrow, 80)
    assert "left out at 80 columns" in narrow
    monkeypatch.delenv("COLUMNS")
    assert cli.main(["report", path]) == 0  # no COLUMNS: a log file gets every column
    wide = capsys.readouterr().out
    assert "left out" not in wide and max(map(len, wide.splitlines())) > 120


def test_the_summary_follows_from_the_records(bench_doc):
    rows = {r["collective"]: r for r in summarize(bench_doc["results"])}
    assert set(rows) == set(COLLECTIVES)
    for name, row in rows.items():
        mine = [r for r in bench_doc["results"] if r["collective"] == name]
        oop = [r for r in mine if not r["inplace"]] or mine  # torch's all_reduce is in place only
        assert row["latency_us"] == min(oop, key=lambda r: r["nbytes"])["time_us"]
        peak = max(oop, key=lambda r: r["busbw_GBps"])
        assert (row["peak_busbw_GBps"], row["peak_nbytes"]) == (peak["busbw_GBps"], peak["nbytes"])
        half = [r["nbytes"] for r in oop if r["busbw_GBps"] >= peak["busbw_GBps"] / 2]
        assert row["half_peak_nbytes"] == min(half) and row["wrong"] == 0
    text = drawn(summary_table(list(rows.values())), 80)
    whole_at(text, 80)
    assert f"{rows['all_reduce']['peak_busbw_GBps']:.3f}" in text


ELEMENT = {"float32": 4, "bfloat16": 2}
SIZES = [1024 << 2 * k for k in range(9)]  # 1K ... 64M, -f 4
FIT = {"alpha_us": 377.65, "beta_ns_per_B": 1.4142, "bandwidth_GBps": 0.71, "points": 9, "max_rel_err": 0.85}


def built(collective: str, algo: str = "library", dtypes=("float32",), modes=(False, True)) -> list[dict]:
    """Records in the shape bench writes them (2 gloo ranks, one per size, dtype and mode), their figures as wide
    as a 64M sweep on CPU gives: sizes of 8 digits, times of 9 characters (100463.28 us)."""
    slower = {"library": 1.0, "ring": 1.1, "rabenseifner": 1.05}[algo]
    factor = 1.0 if collective in ("all_reduce", "sendrecv") else 0.5
    out = []
    for dtype in dtypes:
        for i, nbytes in enumerate(SIZES):
            for inplace in modes:
                time = (300 + nbytes / 670) * slower + 0.28 + 0.01 * i + (0.5 if inplace else 0)
                algbw = nbytes / time / 1e3
                rec = {"collective": collective, "algo": algo, "backend": "gloo", "world_size": 2, "dtype": dtype,
                       "redop": "sum" if collective == "all_reduce" else None, "root": None, "inplace": inplace,
                       "nbytes": nbytes, "count": nbytes // ELEMENT[dtype], "time_us": time, "algbw_GBps": algbw,
                       "busbw_GBps": algbw * factor, "wrong": 0, "agg": "avg", "iters": 3, "p99_us": 1.3 * time,
                       "slowest_rank": i % 2, "group_size": 2, "groups": 1, "level": "",
                       "per_rank": [{"rank": r, "mean_us": time * (1 + 0.01 * r)} for r in (0, 1)]}
                if algo != "library":
                    model = FIT["alpha_us"] * 2 + FIT["beta_ns_per_B"] * nbytes / 1e3
                    rec |= {"steps": 2, "sent_bytes": [nbytes, nbytes], "sent_bytes_model": [nbytes, nbytes],
                            "alpha_beta": FIT, "model_us": model, "time_over_model": time / model}
                out.append(rec)
    return out


def three_algorithms() -> list[dict]:
    """`commprof bench all_reduce --algo library,ring,rabenseifner -b 1K -e 64M -f 4 --nproc 2` on gloo: the
    sendrecv sweep of the α–β fit, then each algorithm (gloo's all_reduce in place only)."""
    return (built("sendrecv", modes=(False,)) + built("all_reduce", modes=(True,)) + built("all_reduce", "ring")
            + built("all_reduce", "rabenseifner"))


def two_dtypes() -> list[dict]:
    """README's first recipe: `commprof bench all_reduce all_gather -b 1K -e 64M -f 4 -d float32,bfloat16`."""
    return (built("all_reduce", dtypes=("float32", "bfloat16"), modes=(True,))
            + built("all_gather", dtypes=("float32", "bfloat16")))


def tables_of(records: list[dict]) -> list[tuple[list[dict], str]]:
    """Each table bench prints: (its records, its title's name)."""
    runs: dict = {}
    for r in records:
        runs.setdefault((r["collective"], r["algo"]), []).append(r)
    return [(recs, c if a == "library" else f"{c} · algorithm {a}") for (c, a), recs in runs.items()]


def body(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]


@pytest.mark.parametrize("width", (80, 120))
@pytest.mark.parametrize("case", (three_algorithms, two_dtypes))
def test_a_narrow_table_keeps_every_number_and_what_tells_its_rows_apart(case, width):
    records = case()
    for recs, named in tables_of(records):
        text = drawn(bench_table(recs[0]["collective"], recs), width)
        whole_at(text, width)
        assert named in " ".join(text.splitlines()), text
        first = min(r["inplace"] for r in recs)  # time/model is the first mode's
        for r in recs:  # each size, each mode's time and busbw, and time/model, whole
            assert str(r["nbytes"]) in text and f"{r['time_us']:.2f}" in text and f"{r['busbw_GBps']:.2f}" in text
            if r["algo"] != "library" and r["inplace"] == first:
                assert f"{r['time_over_model']:.2f}" in text
        dtypes = {r["dtype"] for r in recs}
        rows = body(text)
        assert len(rows) == len({(r["dtype"], r["nbytes"]) for r in recs})
        if len(dtypes) > 1:  # the type column tells the rows apart: it stays, whatever the width
            assert [next((c for c in row if c in dtypes), None) for row in rows] == [
                r["dtype"] for r in recs if r["inplace"] == first], text
        else:  # one type throughout: said once, when its column is left out
            assert dtypes.pop() in text
    rows = summarize(records)
    text = drawn(summary_table(rows), width)
    whole_at(text, width)
    lines = body(text)
    assert len(lines) == len(rows), text  # a line a row
    for row, cells in zip(rows, lines):
        assert cells[0] == row["name"], text  # all_reduce/rabenseifner, whole
        assert f"{row['latency_us']:.2f}" in cells and f"{row['peak_busbw_GBps']:.3f}" in cells
    told = [tuple(c for c in cells if not re.fullmatch(r"[\d.]+", c)) for cells in lines]
    assert len(set(told)) == len(rows), text  # the name and the type, not the figures, tell rows apart


@pytest.mark.parametrize("width", (120, 200))
def test_the_summary_is_a_line_a_row(bench_doc, width):
    rows = summarize(bench_doc["results"])
    text = drawn(summary_table(rows), width)
    whole_at(text, width)
    lines = body(text)
    assert len(lines) == len(rows) and [cells[:3] for cells in lines] == [
        [row["name"], "2", "float32"] for row in rows], text  # "2" under "ranks", not "2 ranks" on two lines
