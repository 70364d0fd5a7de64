"""`commprof report`: saved bench, run and grid files rendered again without running anything — the same
tables the jobs printed, bench files side by side with ratios, plots — and files that are not whole
commprof results refused in one line."""

import json

import pytest
from spawn import commprof

BENCH = ("bench", "all_reduce", "-b", "8", "-e", "64", "-f", "8", "-n", "3", "-w", "1", "--nproc", "2")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("saved")
    runs = {}
    for name, args in {"bench": BENCH, "bench2": BENCH,
                       "run": ("run", "--strategy", "ddp", "--nproc", "2", "--steps", "3", "--warmup", "1",
                               "--batch-size", "8", "--samples", "256")}.items():
        proc = commprof(*args, "--json", str(tmp / f"{name}.json"))
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[name] = proc
    return tmp, runs


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("│")]


def test_report_of_a_bench_file_reproduces_its_table(saved):
    tmp, runs = saved
    proc = commprof("report", str(tmp / "bench.json"), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert _table_lines(proc.stdout) and _table_lines(proc.stdout) == _table_lines(runs["bench"].stdout)


def test_report_of_two_bench_files_side_by_side_with_ratios(saved):
    tmp, _ = saved
    proc = commprof("report", str(tmp / "bench.json"), str(tmp / "bench2.json"), timeout=60)
    assert proc.returncode == 0, proc.stderr
    a, b = (json.loads((tmp / f).read_text())["results"] for f in ("bench.json", "bench2.json"))
    rows = [[cell.strip() for cell in line.strip("│").split("│")] for line in _table_lines(proc.stdout)]
    assert len(rows) == len(a) == len(b)
    for ra, rb in zip(a, b):
        cells = next(c for c in rows if c[2] == str(ra["nbytes"]))  # collective, algo, size, mode, ranks, …
        assert cells[5:] == [f"{ra['time_us']:,.2f}", f"{rb['time_us']:,.2f}", f"{rb['time_us'] / ra['time_us']:,.3f}"]


def test_report_of_a_run_file_and_its_plots(saved, tmp_path):
    tmp, _ = saved
    proc = commprof("report", str(tmp / "run.json"), "--plot", str(tmp_path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp / "run.json").read_text())
    row = next(line for line in _table_lines(proc.stdout) if line.startswith("│ run "))
    assert f"{doc['summary']['wall_ms']:,.2f}" in row and f"{doc['metrics']['final_loss']:,.4f}" in row
    assert (tmp_path / "run-iteration.png").stat().st_size > 0 and (tmp_path / "run-loss.png").exists()


def test_files_that_are_not_whole_results_are_one_line_exit_2(saved, tmp_path):
    tmp, _ = saved
    text = (tmp / "bench.json").read_text()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    (tmp_path / "other.json").write_text('{"hello": 1}')
    incomplete = json.loads(text) | {"complete": False, "reason": "rank 1 died"}
    (tmp_path / "partial.json").write_text(json.dumps(incomplete))
    cases = {"cut.json": "not JSON, or cut short", "other.json": "not a commprof result",
             "partial.json": "incomplete result (rank 1 died)", "missing.json": "cannot read it"}
    for name, words in cases.items():
        proc = commprof("report", str(tmp_path / name), timeout=60)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (name, proc.stderr)
        assert proc.stderr.startswith("commprof: error: ") and words in proc.stderr, (name, proc.stderr)
    proc = commprof("report", str(tmp / "bench.json"), str(tmp / "run.json"), timeout=60)
    assert proc.returncode == 2 and "not both" in proc.stderr


def test_link_rate_is_drawn_on_the_bench_plots(saved, tmp_path):
    # the command's PNG is the figure drawn here with the link line (200 Gbit/s = 25 GB/s), pixel for pixel;
    # without --link-rate it is the one drawn without. Sizes may differ: a legend that covers the line moves out.
    import matplotlib.image
    import numpy as np

    from commprof.report import plots

    tmp, _ = saved
    records = json.loads((tmp / "bench.json").read_text())["results"]
    for name, extra, link in (("plain", (), None), ("link", ("--link-rate", "200Gbit/s"), 25.0)):
        proc = commprof("report", str(tmp / "bench.json"), "--plot", str(tmp_path / name), *extra, timeout=60)
        assert proc.returncode == 0, proc.stderr
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
def test_bad_link_rates_are_one_line_exit_2(saved, tmp_path, args, words):
    tmp, _ = saved
    proc = commprof("report", str(tmp / "bench.json"), *args, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("commprof: error: ") and words in proc.stderr, proc.stderr
    proc = commprof("report", str(tmp / "run.json"), "--plot", str(tmp_path), "--link-rate", "25", timeout=60)
    assert proc.returncode == 2 and "--link-rate is drawn on bench figures" in proc.stderr, proc.stderr
