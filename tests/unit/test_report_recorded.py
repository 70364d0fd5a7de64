"""`commprof report` on recorded files (tests/recorded/: bench-2, bench-2-again, ddp), in this process: the
same tables the jobs printed, bench files side by side with ratios, plots with and without the link line, and
files that are not whole commprof results refused in one line."""

import csv
import json
import shutil
from pathlib import Path

import pytest

from commprof.cli import main as cli

RECORDED = Path(__file__).resolve().parents[1] / "recorded"
BENCH, AGAIN, RUN = (RECORDED / name for name in ("bench-2/bench.json", "bench-2-again/bench.json", "ddp/run.json"))


def report(capsys, *argv: str) -> tuple[int, str, str]:
    """`commprof report ARGV` in this process: its exit code, stdout and stderr."""
    code = cli.main(["report", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("│")]


def test_report_of_a_bench_file_reproduces_its_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # as it was recorded
    code, out, err = report(capsys, BENCH)
    assert code == 0, err
    printed = (BENCH.parent / "stdout.txt").read_text()
    assert _table_lines(out) and _table_lines(out) == _table_lines(printed)


def test_report_of_two_bench_files_side_by_side_with_ratios(capsys):
    code, out, err = report(capsys, BENCH, AGAIN)
    assert code == 0, err
    a, b = (json.loads(f.read_text())["results"] for f in (BENCH, AGAIN))
    rows = [[cell.strip() for cell in line.strip("│").split("│")] for line in _table_lines(out)]
    assert len(rows) == len(a) == len(b)
    for ra, rb in zip(a, b):
        cells = next(c for c in rows if c[0] == ra["collective"] and c[2] == str(ra["nbytes"])
                     and c[3] == ("in" if ra["inplace"] else "out"))
        assert cells[5:] == [f"{ra['time_us']:,.2f}", f"{rb['time_us']:,.2f}", f"{rb['time_us'] / ra['time_us']:,.3f}"]


def test_report_of_a_run_file_and_its_plots(capsys, tmp_path):
    code, out, err = report(capsys, RUN, "--plot", tmp_path)
    assert code == 0, err
    doc = json.loads(RUN.read_text())
    row = next(line for line in _table_lines(out) if line.startswith("│ run "))
    assert f"{doc['summary']['wall_ms']:,.2f}" in row and f"{doc['metrics']['final_loss']:,.4f}" in row
    assert (tmp_path / "run-iteration.png").stat().st_size > 0 and (tmp_path / "run-loss.png").exists()


def test_files_that_are_not_whole_results_are_one_line_exit_2(capsys, tmp_path):
    text = BENCH.read_text()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    (tmp_path / "other.json").write_text('{"hello": 1}')
    incomplete = json.loads(text) | {"complete": False, "reason": "rank 1 died"}
    (tmp_path / "partial.json").write_text(json.dumps(incomplete))
    cases = {"cut.json": "not JSON, or cut short", "other.json": "not a commprof result",
             "partial.json": "incomplete result (rank 1 died)", "missing.json": "cannot read it"}
    for name, words in cases.items():
        code, _, err = report(capsys, tmp_path / name)
        assert code == 2 and err.count("\n") == 1, (name, err)
        assert err.startswith("commprof: error: ") and words in err, (name, err)
    code, _, err = report(capsys, BENCH, RUN)
    assert code == 2 and "not both" in err


def test_link_rate_is_drawn_on_the_bench_plots(capsys, tmp_path):
    # the command's PNG is the figure drawn here with the link line (200 Gbit/s = 25 GB/s), pixel for pixel;
    # without --link-rate it is the one drawn without. Sizes may differ: a legend that covers the line moves out.
    import matplotlib.image
    import numpy as np

    from commprof.report import plots

    records = [r for r in json.loads(BENCH.read_text())["results"] if r["collective"] == "all_reduce"]
    one = tmp_path / "bench.json"  # all_reduce alone: one figure to draw twice
    shutil.copy(BENCH, one)
    one.write_text(json.dumps(json.loads(one.read_text()) | {"results": records}))
    for name, extra, link in (("plain", (), None), ("link", ("--link-rate", "200Gbit/s"), 25.0)):
        code, _, err = report(capsys, one, "--plot", tmp_path / name, *extra)
        assert code == 0, err
        figures = {}
        plots.bench_plots(records, tmp_path / f"{name}-here", link_GBps=link, keep=figures)
        (path,) = [p for p in figures if p.endswith("bench-all_reduce.png")]
        bw = figures[path].axes[0]
        drawn = [line.get_label() for line in bw.get_lines() if line.get_label().startswith("link ")]
        assert drawn == ([] if link is None else ["link 25 GB/s"]), drawn
        assert np.array_equal(matplotlib.image.imread(tmp_path / name / "bench-all_reduce.png"),
                              matplotlib.image.imread(path)), name


@pytest.mark.parametrize("args, words", [
    (("--plot", "d", "--link-rate", "1Gb/s"), "cannot read rate '1Gb/s' of --link-rate"),
    (("--link-rate", "25"), "--link-rate is drawn on the --plot figures"),
    (("--plot", "d", "--link-rate", "0"), "--link-rate 0: the rate must be positive"),
    (("--markdown",), "--markdown writes the run comparison table; these are bench results"),
])
def test_bad_link_rates_are_one_line_exit_2(capsys, tmp_path, args, words):
    code, _, err = report(capsys, BENCH, *args)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("commprof: error: ") and words in err, err
    code, _, err = report(capsys, RUN, "--plot", tmp_path, "--link-rate", "25")
    assert code == 2 and "--link-rate is drawn on bench figures" in err, err


def test_a_grid_says_which_configuration_ran_oversubscribed_or_contended():
    # a 24.7x "speed-up" was printed over a baseline whose ranks shared the cores: the figure stays, marked
    from commprof.report.compare import run_markdown, run_rows, run_table

    def quiet(doc: dict) -> dict:
        return {**doc, "env": {**doc["env"], "oversubscribed": False, "contention": {"contended": False}}}

    single, ddp = (quiet(json.loads((RECORDED / name / "run.json").read_text())) for name in ("single", "ddp"))
    crowded = {**single, "env": {**single["env"], "oversubscribed": True, "ranks_per_host": 4, "slots_per_host": 2}}
    busy = {**ddp, "env": {**ddp["env"], "contention": {"contended": True, "others_cores": 1.3}}}
    runs = [{"label": "single", "config": {"--strategy": "single"}, "result": crowded},
            {"label": "ddp", "config": {"--strategy": "ddp"}, "result": busy}]
    rows = run_rows(runs)
    assert [r["caveat"] for r in rows] == ["oversubscribed 4 ranks on 2 cores", "contended 1.3 cores"]
    markdown = run_markdown(rows)
    assert "| single (oversubscribed 4 ranks on 2 cores) |" in markdown and "| ddp (contended 1.3 cores) |" in markdown
    speedup = rows[1]["speedup"]
    assert speedup > 0 and f"| {speedup:,.2f}? |" in markdown and "?: over or of a configuration" in markdown
    clean = run_rows([{**r, "result": doc} for r, doc in zip(runs, (single, ddp))])
    assert [r["caveat"] for r in clean] == [None, None] and "?" not in run_markdown(clean)
    assert run_table(rows).table.caption.startswith("?: a speed-up")


def test_a_many_rank_time_table_shows_rank_0_and_the_outliers_with_quantiles_over_all():
    import copy
    import io

    from rich.console import Console

    from commprof.report.run_table import RANK_ROWS, time_table

    doc = json.loads(RUN.read_text())
    base = doc["summary"]["per_rank"][0]
    rows = [{**copy.deepcopy(base), "rank": r, "wall_ms": 10.0 + r / 1000} for r in range(2000)]
    rows[1234]["wall_ms"], rows[777]["comm_ms"] = 99.0, 55.0
    doc["summary"]["per_rank"] = rows
    console = Console(file=io.StringIO(), width=200)
    console.print(time_table(doc).table)
    lines = _table_lines(console.file.getvalue())
    shown = [line.split("│")[1].strip() for line in lines if line.split("│")[1].strip().isdigit()]
    assert "0" in shown and "1234" in shown and "777" in shown and len(shown) <= RANK_ROWS
    p99 = next(line for line in lines if line.startswith("│     p99"))
    assert f"{sorted(r['wall_ms'] for r in rows)[1980 - 1]:.2f}" in p99  # nearest rank: the 1,980th of 2,000
    assert "of 2,000 ranks" in " ".join(console.file.getvalue().split())


def first_words(out: str, among) -> list[str]:
    """The labels heading the table's rows, in order (a row's first cell may go on: "a (contended …)")."""
    words = [(line.split("│")[1].split() or [""])[0] for line in _table_lines(out)]
    return [w for w in words if w in among]


def test_one_folder_per_experiment_is_labelled_by_its_folder_and_written_as_csv(capsys, tmp_path):
    for name in "abc":
        (tmp_path / name).mkdir()
        shutil.copy(RUN, tmp_path / name / "run.json")
    files = [tmp_path / name / "run.json" for name in "abc"]
    code, out, err = report(capsys, *files, "--csv", tmp_path / "runs.csv")
    assert code == 0, err
    assert first_words(out, "abc") == ["a", "b", "c"]
    rows = list(csv.DictReader((tmp_path / "runs.csv").open()))
    wall = json.loads(RUN.read_text())["summary"]["wall_ms"]
    assert [r["label"] for r in rows] == ["a", "b", "c"] and all(float(r["wall_ms"]) == wall for r in rows)
    assert err.splitlines()[-1] == f"csv: {tmp_path / 'runs.csv'}"
    code, out, err = report(capsys, *files, "--label", "fp32", "--label", "bf16", "--label", "fp8")
    assert code == 0 and first_words(out, ("fp32", "bf16", "fp8")) == ["fp32", "bf16", "fp8"], err
    # two bench files of one name: their folders head the columns, and the CSV holds both times
    code, out, err = report(capsys, BENCH, AGAIN, "--csv", tmp_path / "bench.csv")
    assert code == 0 and "bench-2-again ÷ first" in out, out
    rows = list(csv.DictReader((tmp_path / "bench.csv").open()))
    for label, path in (("bench-2", BENCH), ("bench-2-again", AGAIN)):
        results = json.loads(path.read_text())["results"]
        assert len(rows) == len(results)
        times = {(r["collective"], r["algo"], str(r["nbytes"]), str(r["inplace"])): r["time_us"] for r in results}
        assert all(float(row[f"time_us[{label}]"]) == times[row["collective"], row["algo"], row["nbytes"],
                                                             row["inplace"]] for row in rows)


@pytest.mark.parametrize("extra,words", [
    (("--label", "x"), "--label given 1 time(s) for 3 file(s): give one a file"),
    (("--label", "x", "--label", "y", "--label", "x"), "--label 'x' names two files: labels must differ"),
    (("--csv", "{a}"), "is one of the files read: give it a path of its own"),
])
def test_labels_and_csv_that_do_not_fit_are_one_line_exit_2(capsys, tmp_path, extra, words):
    for name in "abc":
        (tmp_path / name).mkdir()
        shutil.copy(RUN, tmp_path / name / "run.json")
    files = [tmp_path / name / "run.json" for name in "abc"]
    code, out, err = report(capsys, *files, *(e.format(a=files[0]) for e in extra))
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err
