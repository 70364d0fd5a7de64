"""Legends cover no data on a crowded sweep: the bench plots of a saved 6-series MPI sweep
(benchmarks/studies/bench-scaling.json), drawn again from its JSON, put no legend over a point, bar or text."""

import json
from pathlib import Path

from support.legends import covered

from commprof.report import plots

ROOT = Path(__file__).resolve().parents[2]


def test_legends_cover_no_data_on_a_crowded_sweep(tmp_path):
    # six series over 1, 2 and 4 ranks, 8 B to 16 MiB, saved by a real MPI sweep: matplotlib's "best" place
    # alone left the time panel's legend on a point of it
    doc = json.loads((ROOT / "benchmarks" / "studies" / "bench-scaling.json").read_text())
    figures = {}
    drawn = plots.bench_plots(doc["results"], tmp_path, keep=figures)
    assert max(len(d["series"]) for d in drawn.values()) >= 6
    for path, fig in figures.items():
        fig.canvas.draw()
        assert covered(fig) == [], path
