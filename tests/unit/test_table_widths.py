"""What a user's terminal shows, on recorded results (tests/recorded/bench-2, ddp): bench and run tables at 80,
120 and 200 columns never cut a number and never run past the width, saying which columns a narrow one left
out; `commprof report` honours COLUMNS; the bench summary's figures follow from the records."""

import json
import os
import re
from pathlib import Path

import pytest
from rich.console import Console

from commprof import cli
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
