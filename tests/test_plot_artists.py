"""The plots read back from their drawn matplotlib objects and held against the tables of the same real runs:
a 2-rank ddp,fsdp grid and a 2-rank all_gather bench, each made by the command line with --plot.

Bar segments must stack to the table's wall, legends must list only what has data and cover no data point,
and a line drawn over an identical one must leave both in sight and say so."""

import json
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest
from matplotlib.colors import to_rgba
from rich.console import Console
from spawn import env_for_tests
from support.legends import covered

from commprof.report import compare, plots

GRID = ["run", "--strategy", "ddp,fsdp", "--nproc", "2", "--steps", "5", "--warmup", "1", "--eval-samples", "0"]
BENCH = ["bench", "all_gather", "--nproc", "2", "--backend", "gloo", "-n", "5", "-w", "1"]
PARTS = {"data": "data_ms", "compute": "compute_ms", "exposed comm": "exposed_comm_ms", "pipeline bubble": "bubble_ms"}
"""Bar segment names in the legend, and the summary figure each draws."""


def commprof(tmp, name, argv):
    """`commprof <argv> --json --plot` as a user runs it; its document and its plot folder."""
    json_path, folder = tmp / f"{name}.json", tmp / name
    proc = subprocess.run([sys.executable, "-m", "commprof", *argv, "--json", str(json_path), "--plot", str(folder)],
                          env=env_for_tests(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(json_path.read_text()), folder


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """The grid's document, its table rows, and its plots drawn again from the JSON with their Figures."""
    tmp = tmp_path_factory.mktemp("grid")
    doc, folder = commprof(tmp, "grid", GRID)
    figures = {}
    runs = [{"label": r["label"], "config": {}, "result": r["result"]} for r in doc["runs"]]
    plots.run_plots(runs, tmp / "again", keep=figures)
    return doc, compare.run_rows(doc["runs"]), folder, figures


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    doc, folder = commprof(tmp, "bench", BENCH)
    figures = {}
    plots.bench_plots(doc["results"], tmp / "again", keep=figures)
    return doc, folder, figures


def figure(figures, name):
    (fig,) = [f for path, f in figures.items() if path.endswith(name)]
    fig.canvas.draw()
    return fig


def test_the_command_drew_the_figures_read_here(grid, bench):
    # the same JSON drawn again gives the command's own PNGs, pixel for pixel: what is read here is what it saved
    for folder, figures in (grid[2:], bench[1:]):
        assert len(figures) >= 1
        for path in figures:
            name = path.rsplit("/", 1)[1]
            assert np.array_equal(matplotlib.image.imread(folder / name), matplotlib.image.imread(path)), name


def test_iteration_bars_stack_to_the_tables_wall(grid):
    doc, rows, _, figures = grid
    ax = figure(figures, "run-iteration.png").axes[0]
    segments = {c.get_label(): [bar.get_height() for bar in c] for c in ax.containers}
    bottoms = {c.get_label(): [bar.get_y() for bar in c] for c in ax.containers}
    for i, (run, row) in enumerate(zip(doc["runs"], rows)):
        s = run["result"]["summary"]
        assert row["wall_ms"] == s["wall_ms"] > 0
        # segments sit on each other, from 0, and the top one ends at the wall ms of the table's row
        tops = 0.0
        for name in segments:
            assert bottoms[name][i] == pytest.approx(tops, rel=1e-12, abs=1e-12)
            tops += segments[name][i]
        assert tops == pytest.approx(row["wall_ms"], rel=1e-12)
        # each measured part is the table's figure, scaled down together where the parts pass the wall
        scale = min(1.0, s["wall_ms"] / sum(s[key] for key in PARTS.values()))
        for name, key in PARTS.items():
            if name in segments:
                assert segments[name][i] == pytest.approx(scale * s[key], rel=1e-12)
        assert segments["compute"][i] == pytest.approx(scale * row["compute_ms"], rel=1e-12)
        # the figure printed over the bar is the table's cell
        assert ax.texts[i].get_text().split("\n")[0] == compare.run_cells(row)[1]
        assert ("parts ×" in ax.texts[i].get_text()) == (scale < 1)
    # a part no run has (the bubble: neither run is a pipeline) has no bar and no legend entry
    assert all(r["bubble_ms"] == 0 for r in rows)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == list(segments) and "pipeline bubble" not in legend
    assert all(any(h > 0 for h in segments[name]) for name in legend)


def test_identical_loss_lines_stay_in_sight(grid):
    doc, _, _, figures = grid
    fig = figure(figures, "run-loss.png")
    ax = fig.axes[0]
    losses = {r["label"]: r["result"]["metrics"]["loss"] for r in doc["runs"]}
    ddp, fsdp = "strategy=ddp", "strategy=fsdp"
    assert np.allclose(losses[ddp], losses[fsdp], rtol=1e-5, atol=0)  # the same model, data and seed
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines) == [ddp, f"{fsdp} (identical to {ddp})"]
    for label, line in zip(losses, lines.values()):
        assert list(line.get_xdata()) == list(range(1, 6)) and list(line.get_ydata()) == losses[label]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(lines)
    # each line shows at least a tenth of the pixels of its own color it shows alone: neither hides the other
    # (legend hidden while counting: its samples have the lines' colors too)
    ax.get_legend().set_visible(False)
    for line in lines.values():
        together = own_pixels(fig, line)
        others = [other for other in lines.values() if other is not line]
        for other in others:
            other.set_visible(False)
        alone = own_pixels(fig, line)
        for other in others:
            other.set_visible(True)
        assert alone > 0 and together >= alone / 10, (line.get_label(), together, alone)
    ax.get_legend().set_visible(True)


def own_pixels(fig, line) -> int:
    """How many pixels of the drawn figure have the line's color (to within the blending of its edges)."""
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)
    rgb = np.array(to_rgba(line.get_color())[:3]) * 255
    return int((np.abs(image - rgb).max(axis=2) <= 8).sum())


def test_legends_cover_no_data(grid, bench):
    figures = {**grid[3], **bench[2]}
    legends = 0
    for path, fig in figures.items():
        fig.canvas.draw()
        legends += sum(ax.get_legend() is not None for ax in fig.axes)
        assert covered(fig) == [], path
    assert legends >= 4  # bars, loss, and both bench panels (in-place and out-of-place)


def test_bench_lines_are_the_records(bench):
    doc, _, figures = bench
    bw, tm = figure(figures, "bench-all_gather.png").axes
    for ax, key in ((bw, "busbw_GBps"), (tm, "time_us")):
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert sorted(lines) == ["in-place", "out-of-place"]
        for label, line in lines.items():
            records = sorted((r for r in doc["results"] if r["inplace"] == (label == "in-place")),
                             key=lambda r: r["nbytes"])
            assert list(line.get_xdata()) == [r["nbytes"] for r in records]
            assert list(line.get_ydata()) == [r[key] for r in records]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == list(lines)


def test_parts_past_the_wall_are_scaled_to_it(grid):
    # the medians of the parts and of the wall come from different iterations; where the parts pass the wall
    # (here: the real summary with its wall taken down below them), the stack still ends at the wall
    summary = dict(grid[0]["runs"][1]["result"]["summary"])
    total = sum(summary[key] for key in PARTS.values())
    summary["wall_ms"] = 0.9 * total
    scale, parts = plots._stack(summary)
    assert scale == pytest.approx(0.9, rel=1e-12) and parts["other_ms"] == 0
    assert sum(parts.values()) == pytest.approx(summary["wall_ms"], rel=1e-12)
    assert parts["compute_ms"] == pytest.approx(0.9 * summary["compute_ms"], rel=1e-12)
    run = {"label": "cut", "config": {}, "result": {**grid[0]["runs"][1]["result"], "summary": summary}}
    bars, _loss, _causes = plots.run_plots([run], grid[2].parent / "cut").values()
    assert bars["scale"] == [scale] and bars["legend"] == ["data", "compute", "exposed comm"]


def test_factor_panels_hold_the_table_figures(tmp_path):
    # two ranks and one, ddp: the table's comm and compute against --nproc, one line
    doc, folder = commprof(tmp_path, "nproc", ["run", "--strategy", "ddp", "--nproc", "1,2", "--steps", "3",
                                               "--warmup", "1", "--eval-samples", "0"])
    figures = {}
    out = compare.render(doc, plot_dir=str(tmp_path / "again"), console=Console(quiet=True))
    runs = [{"label": r["label"], "config": {"nproc": int(r["config"]["--nproc"])}, "result": r["result"]}
            for r in doc["runs"]]
    plots.run_plots(runs, tmp_path / "kept", factor="nproc", keep=figures)
    assert sorted(p.rsplit("/", 1)[1] for p in out) == ["run-causes-nproc=1.png", "run-causes-nproc=2.png",
                                                        "run-iteration.png", "run-loss.png", "run-nproc.png"]
    rows = compare.run_rows(doc["runs"])
    panels = figure(figures, "run-nproc.png").axes
    for ax, key in zip(panels, ("comm_ms", "compute_ms", "throughput")):
        (line,) = ax.get_lines()
        assert list(line.get_xdata()) == [1, 2] and list(line.get_ydata()) == [row[key] for row in rows]
        assert ax.get_legend() is None  # one line: its name is the title's
    assert covered(figures[next(p for p in figures if p.endswith("run-iteration.png"))]) == []
