"""PNG plots of bench and run reports, drawn from recorded `commprof bench` and `commprof run` JSON
(tests/recorded/: bench-1, bench-2, ddp, ddp-bs16, single): each file exists with the intended pixel size, and
the numbers each plot says it drew are the report's numbers. tests/test_plot_artists.py reads the drawn
figures back and holds them against the tables."""

import json
from pathlib import Path

import matplotlib.image
import matplotlib.pyplot as plt
import pytest

from commprof.report import plots

RECORDED = Path(__file__).resolve().parents[1] / "recorded"
RUNS = {  # label -> (config as a sweep would record it, recorded fixture)
    "ddp bs8": ({"strategy": "ddp", "batch_size": 8, "nproc": 2}, "ddp"),
    "ddp bs16": ({"strategy": "ddp", "batch_size": 16, "nproc": 2}, "ddp-bs16"),
    "single bs8": ({"strategy": "single", "batch_size": 8, "nproc": 1}, "single"),
}


@pytest.fixture(scope="module")
def reports():
    bench = {n: json.loads((RECORDED / f"bench-{n}" / "bench.json").read_text()) for n in (1, 2)}
    runs = [{"label": label, "config": config, "result": json.loads((RECORDED / name / "run.json").read_text())}
            for label, (config, name) in RUNS.items()]
    return bench, runs


def pixels(path) -> tuple[int, int]:
    """(width, height) of a PNG as read back."""
    height, width = matplotlib.image.imread(path).shape[:2]
    return width, height


def size_of(inches: tuple[float, float]) -> tuple[int, int]:
    return round(inches[0] * plots.DPI), round(inches[1] * plots.DPI)


def fits(path, inches: tuple[float, float]) -> bool:
    """The PNG has the figure's height, and its width or wider (a legend moved beside the axes widens it)."""
    (width, height), (w, h) = pixels(path), size_of(inches)
    return height == h and width >= w


def by_size(records, collective, world_size, inplace=True):
    return sorted((r for r in records if r["collective"] == collective and r["world_size"] == world_size
                   and r["inplace"] == inplace), key=lambda r: r["nbytes"])


def test_bench_plots_draw_the_records(reports, tmp_path):
    bench, _ = reports
    records = bench[1]["results"] + bench[2]["results"]
    folder = tmp_path / "new" / "plots"  # missing: the function makes it
    drawn = plots.bench_plots(records, folder, link_GBps=1.0)
    assert set(drawn) == {str(folder / f"bench-{c}.png") for c in ("all_reduce", "all_gather", "broadcast")}
    for path in drawn:
        assert fits(path, plots.BENCH_SIZE)
    assert plt.get_fignums() == []  # every figure closed

    reduce = drawn[str(folder / "bench-all_reduce.png")]
    assert reduce["collective"] == "all_reduce" and reduce["link_GBps"] == 1.0
    # all_reduce is in-place only, on one algo and backend: the rank count is all that tells series apart
    assert list(reduce["series"]) == ["1 rank", "2 ranks"]
    two = by_size(records, "all_reduce", 2)
    assert len(two) == len(by_size(records, "all_reduce", 1)) >= 6 and all(r["busbw_GBps"] > 0 for r in two)
    assert reduce["series"]["2 ranks"] == {"nbytes": [r["nbytes"] for r in two], "time_us": [r["time_us"] for r in two],
                                           "busbw_nbytes": [r["nbytes"] for r in two],
                                           "busbw_GBps": [r["busbw_GBps"] for r in two]}
    # one rank moves nothing over a bus: its zeros stay off the log axis, its times do not
    one = by_size(records, "all_reduce", 1)
    assert [r["busbw_GBps"] for r in one] == [0.0] * len(two)
    assert reduce["series"]["1 rank"]["busbw_GBps"] == reduce["series"]["1 rank"]["busbw_nbytes"] == []
    assert reduce["series"]["1 rank"]["time_us"] == [r["time_us"] for r in one]
    assert reduce["busbw_not_drawn"] == ["1 rank"]

    gather = drawn[str(folder / "bench-all_gather.png")]
    assert list(gather["series"]) == ["1 rank, out-of-place", "1 rank, in-place",
                                      "2 ranks, out-of-place", "2 ranks, in-place"]
    out_of_place = by_size(records, "all_gather", 2, inplace=False)
    assert gather["series"]["2 ranks, out-of-place"]["busbw_GBps"] == [r["busbw_GBps"] for r in out_of_place]


def test_one_series_keeps_its_full_label(reports, tmp_path):
    bench, _ = reports
    records = [r for r in bench[2]["results"] if r["collective"] == "all_reduce"]
    (data,) = plots.bench_plots(records, tmp_path).values()
    assert list(data["series"]) == ["2 ranks, library, gloo, in-place, float32, sum"]
    assert data["link_GBps"] is None


def test_each_dtype_and_reduction_is_a_line_of_its_own(reports, tmp_path):
    # `-d float32,bfloat16 -o sum,max` measures every size four times: one zig-zag line across them hid it
    bench, _ = reports
    base = [r for r in bench[2]["results"] if r["collective"] == "all_reduce"]
    records = [{**r, "dtype": dtype, "redop": redop, "time_us": r["time_us"] * k}
               for k, (dtype, redop) in enumerate([("float32", "sum"), ("bfloat16", "sum"), ("float32", "max"),
                                                   ("bfloat16", "max")], start=1) for r in base]
    figures = {}
    (path, data), = plots.bench_plots(records, tmp_path, keep=figures).items()
    assert sorted(data["series"]) == ["bfloat16, max", "bfloat16, sum", "float32, max", "float32, sum"]
    for k, label in enumerate(["float32, sum", "bfloat16, sum", "float32, max", "bfloat16, max"], start=1):
        assert data["series"][label]["time_us"] == [r["time_us"] * k for r in sorted(base, key=lambda r: r["nbytes"])]
    assert sorted(data["legend"]["time"]) == sorted(data["series"])
    _, tm = figures[path].axes
    assert {line.get_label() for line in tm.get_lines()} == set(data["series"])


def test_link_line_is_drawn_on_the_bandwidth_panel(reports, tmp_path):
    bench, _ = reports
    records = [r for r in bench[2]["results"] if r["collective"] == "all_reduce"]
    figures = {}
    (path,) = plots.bench_plots(records, tmp_path, link_GBps=1.0, keep=figures)
    bw, tm = figures[path].axes
    link = [line for line in bw.get_lines() if line.get_label() == "link 1 GB/s"]
    assert len(link) == 1 and set(link[0].get_ydata()) == {1.0}
    assert all(line.get_label() != "link 1 GB/s" for line in tm.get_lines())
    with pytest.raises(ValueError, match="link_GBps"):
        plots.bench_plots(records, tmp_path, link_GBps=0)


def test_run_plots_draw_the_summaries(reports, tmp_path):
    _, runs = reports
    drawn = plots.run_plots(runs, tmp_path, factor="batch_size")
    iteration, factor, loss = (str(tmp_path / f"run-{name}.png") for name in ("iteration", "batch_size", "loss"))
    causes = [str(tmp_path / f"run-causes-{label.replace(' ', '_')}.png") for label in RUNS]  # each has findings
    assert list(drawn) == [iteration, factor, loss, *causes]
    assert pixels(iteration) == size_of(plots.ITERATION_SIZE)
    assert fits(factor, plots.FACTOR_SIZE)
    assert fits(loss, plots.LOSS_SIZE)
    assert plt.get_fignums() == []

    summaries = [run["result"]["summary"] for run in runs]
    bars = drawn[iteration]
    assert bars["labels"] == list(RUNS)
    assert bars["wall_ms"] == [s["wall_ms"] for s in summaries]
    parts = ("data_ms", "compute_ms", "exposed_comm_ms", "bubble_ms")
    for scale, s in zip(bars["scale"], summaries):
        assert scale == pytest.approx(min(1.0, s["wall_ms"] / sum(s[k] for k in parts)), rel=1e-12)
    for key in ("data_ms", "compute_ms", "exposed_comm_ms"):
        assert bars["segments"][key] == pytest.approx([f * s[key] for f, s in zip(bars["scale"], summaries)],
                                                      rel=1e-12)
    # no run is a pipeline: the bubble has no bar and no legend entry
    assert all(s["bubble_ms"] == 0 for s in summaries) and "bubble_ms" not in bars["segments"]
    assert "pipeline bubble" not in bars["legend"] and len(bars["legend"]) == len(bars["segments"])
    tops = [sum(seg[i] for seg in bars["segments"].values()) for i in range(len(runs))]
    assert tops == pytest.approx(bars["wall_ms"], rel=1e-12)  # every stack ends at the table's wall
    # ddp's exposed comm is its table's figure (above), which may be 0: a median over iterations whose async
    # buckets all completed before the wait (seen once); a single rank has none
    assert summaries[0]["comm_ms"] > 0 and bars["segments"]["exposed_comm_ms"][2] == 0

    panels = drawn[factor]["panels"]
    assert drawn[factor]["factor"] == "batch_size"
    ddp, single = "nproc=2, strategy=ddp", "nproc=1, strategy=single"
    assert list(panels["comm_ms"]) == [ddp, single]
    assert panels["comm_ms"][ddp] == {"x": [8, 16], "y": [summaries[0]["comm_ms"], summaries[1]["comm_ms"]]}
    assert panels["compute_ms"][single] == {"x": [8], "y": [summaries[2]["compute_ms"]]}
    assert panels["throughput"][ddp]["y"] == [summaries[0]["throughput"], summaries[1]["throughput"]]
    assert drawn[factor]["ylabels"]["throughput"] == "throughput (samples/s)"
    payload = [sum(v["bytes_per_epoch"] for v in run["result"]["volume"].values()) / 2**20 for run in runs]
    assert payload[0] > 0 and payload[0] == pytest.approx(2 * payload[1])  # half the steps per epoch
    assert panels["payload_MiB"][ddp]["y"] == payload[:2]
    assert panels["payload_MiB"][single]["y"] == [payload[2]] == [0.0]

    lines = drawn[loss]["lines"]
    assert list(lines) == list(RUNS)
    for run in runs:
        expected = run["result"]["metrics"]["loss"]
        steps = run["result"]["config"]["steps"]
        assert len(expected) == steps
        assert lines[run["label"]] == {"step": list(range(1, steps + 1)), "loss": expected}
    assert drawn[loss]["legend"] == list(RUNS)  # three different losses: none says "identical"


def test_factor_plot_only_for_a_numeric_factor(reports, tmp_path):
    _, runs = reports
    for factor in ("strategy", "no_such_flag", None):
        drawn = plots.run_plots(runs, tmp_path / str(factor), factor=factor)
        summaries = sorted(p.rsplit("/", 1)[1] for p in drawn if "run-causes" not in p)
        assert summaries == ["run-iteration.png", "run-loss.png"]
        assert sorted(p.name for p in (tmp_path / str(factor)).iterdir()
                      if not p.name.startswith("run-causes")) == ["run-iteration.png", "run-loss.png"]
    with pytest.raises(ValueError, match="labels"):
        plots.run_plots(runs + runs[:1], tmp_path)
