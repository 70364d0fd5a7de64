"""`-r all` (nccl-tests: every root in turn) across rank counts: the summary, the scaling tables and the plots
keep each root apart, so a root's figures are never another root's. On the records of one real sweep,
`commprof bench broadcast all_reduce -r all --nproc 1,2`."""

import json
import subprocess
import sys

import pytest
from spawn import env_for_tests

from commprof.report.bench_summary import summarize, summary_table
from commprof.report.compare import scaling, scaling_tables
from commprof.report.fit import results_console


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("roots") / "sweep.json"
    proc = subprocess.run([sys.executable, "-m", "commprof", "bench", "broadcast", "all_reduce", "-r", "all", "-b", "8",
                           "-e", "64", "-f", "8", "-n", "2", "-w", "1", "--nproc", "1,2", "--json", str(out)],
                          env=env_for_tests(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())["results"]


def _drawn(renderable, width: int = 200) -> str:
    console = results_console(width=width)
    with console.capture() as cap:
        console.print(renderable)
    return cap.get()


def test_the_sweep_measured_both_roots_at_two_ranks(records):
    roots = {(r["world_size"], r["root"]) for r in records if r["collective"] == "broadcast"}
    assert roots == {(1, 0), (2, 0), (2, 1)}


def test_the_summary_has_a_row_per_root(records):
    rows = {(r["name"], r["ranks"]): r for r in summarize(records)}
    assert set(rows) == {("broadcast root 0", "1 rank"), ("broadcast root 0", "2 ranks"),
                         ("broadcast root 1", "2 ranks"), ("all_reduce", "1 rank"), ("all_reduce", "2 ranks")}
    for root in (0, 1):
        mine = [r for r in records if r["collective"] == "broadcast" and r["world_size"] == 2 and r["root"] == root]
        smallest = min(mine, key=lambda r: r["nbytes"])
        assert rows[(f"broadcast root {root}", "2 ranks")]["latency_us"] == smallest["time_us"]
    text = _drawn(summary_table(list(rows.values())))
    assert "broadcast root 1" in text and "all_reduce root" not in text


def test_a_scaling_table_per_root(records):
    keys = {(k[0], k[-1]) for k in scaling(records)}
    assert keys == {("broadcast", 0), ("broadcast", 1), ("all_reduce", None)}
    for key, by_size in scaling(records).items():
        for nbytes, by_ranks in by_size.items():
            for rec in by_ranks.values():
                assert rec["nbytes"] == nbytes and (key[-1] is None or rec["root"] == key[-1])
    titles = [_drawn(t).splitlines()[0].strip() for t in scaling_tables(records)]
    assert any(t.startswith("broadcast root 1 (") for t in titles), titles
    assert any(t.startswith("all_reduce (") for t in titles), titles


def test_the_plot_draws_a_curve_per_root(records, tmp_path):
    from commprof.report import plots

    drawn = plots.bench_plots(records, tmp_path)
    series = drawn[str(tmp_path / "bench-broadcast.png")]["series"]
    assert set(series) == {"1 rank, root 0", "2 ranks, root 0", "2 ranks, root 1"}
    for label, points in series.items():
        root = int(label.rsplit(" ", 1)[1])
        ranks = 1 if label.startswith("1 rank") else 2
        want = sorted((r["nbytes"], r["time_us"]) for r in records
                      if r["collective"] == "broadcast" and r["world_size"] == ranks and r["root"] == root)
        assert list(zip(points["nbytes"], points["time_us"])) == want
    assert set(drawn[str(tmp_path / "bench-all_reduce.png")]["series"]) == {"1 rank", "2 ranks"}
