"""PNG plots of saved results: bench curves against message size, and a comparison of `commprof run` reports.

`bench_plots` draws one figure per collective: bus bandwidth and time against size, one curve per series of
records. `run_plots` draws the time split of an iteration per run, how comm, compute, throughput and payload
move with one factor of the configuration, and the loss curves. Each returns, per file, the numbers it drew,
as plain data, so a caller can check a figure against the report it came from. matplotlib is imported only
when a plot is drawn, with the Agg backend, so no display is needed and importing this module stays cheap.

Exercised by: `pytest tests/test_plots.py`.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from commprof.report.bench_table import ranks_key, ranks_label
from commprof.report.units import format_bytes

DPI = 100
BENCH_SIZE = (10.0, 4.5)
ITERATION_SIZE = (8.0, 4.5)
FACTOR_SIZE = (10.0, 7.5)
LOSS_SIZE = (8.0, 4.5)
"""Figure sizes in inches; the PNGs are size * DPI pixels."""

SEGMENTS = (("data_ms", "data"), ("compute_ms", "compute"), ("exposed_comm_ms", "exposed comm"),
            ("bubble_ms", "pipeline bubble"), ("other_ms", "other"))
"""The stacked parts of an iteration, bottom to top: summary key (other_ms is what wall_ms leaves) and name."""
MEASURED = ("data_ms", "compute_ms", "exposed_comm_ms", "bubble_ms")

PANELS = (("comm_ms", "comm time", "ms per iteration"), ("compute_ms", "compute time", "ms per iteration"),
          ("throughput", "throughput", None), ("payload_MiB", "payload per epoch", "MiB"))
"""The factor plot's panels: key, title, y unit (throughput's unit comes from the reports)."""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display, and works the same over ssh and in CI
    import matplotlib.pyplot as plt

    return plt


def _color(i: int) -> str:
    return f"C{i % 10}"  # the default cycle has ten colors; C10 is no color name


@contextmanager
def _figure(path: Path, size: tuple[float, float], nrows: int = 1, ncols: int = 1):
    """A figure to draw on; saved to `path` when the block ends, and closed even when drawing fails."""
    plt = _pyplot()
    fig, axes = plt.subplots(nrows, ncols, figsize=size, dpi=DPI, squeeze=False)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)  # explicit: a matplotlibrc's savefig.dpi would change the pixel size
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------------------------------- bench


def _series_parts(key: tuple) -> tuple[str, str, str, str]:
    ranks, algo, backend, inplace = key
    return ranks_label(ranks), str(algo), str(backend), "in-place" if inplace else "out-of-place"


def _labels(keys: list[tuple]) -> tuple[dict[tuple, str], str]:
    """Each series' label from the parts that differ between series, and the parts they share (for the title)."""
    parts = {key: _series_parts(key) for key in keys}
    varying = [i for i in range(4) if len({p[i] for p in parts.values()}) > 1]
    shared = ", ".join(p for i, p in enumerate(next(iter(parts.values()))) if i not in varying)
    if not varying:  # one series: its full description is its only name
        return {key: ", ".join(p) for key, p in parts.items()}, shared
    return {key: ", ".join(p[i] for i in varying) for key, p in parts.items()}, shared


def _bytes_axis(ax) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator

    # sizes are powers of two: base-2 ticks land on them, and '64 KiB' reads better than 6.6e4
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=8))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_bytes(int(round(x)))))


def bench_plots(records: list[dict], folder: str | Path, *, link_GBps: float | None = None) -> dict[str, dict]:
    """One PNG per collective, folder/bench-<collective>.png: bus bandwidth (GB/s) and time (µs) against size
    (bytes), log-log, one curve per series — the records sharing (ranks, algo, backend, inplace), where ranks
    is the group size and how many groups measured at once (report/bench_table.py's ranks_key).

    A label names only what differs between the collective's series ("1 rank", "2 ranks"); what they share
    goes in the title. Points a log axis cannot show (a value <= 0, as the bus bandwidth of one rank) are left
    out of that panel. `link_GBps` draws a dashed "link" line on the bandwidth panel.

    Returns {path: {"collective", "series": {label: {"nbytes", "time_us", "busbw_nbytes", "busbw_GBps"}},
    "link_GBps", "busbw_not_drawn"}}: per series the time panel's points and the bandwidth panel's, each
    sorted by nbytes, and the labels of series with no point on the bandwidth panel.
    """
    if link_GBps is not None and not link_GBps > 0:
        raise ValueError(f"link_GBps must be a positive rate, not {link_GBps!r}: the axis is logarithmic")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    by_collective: dict[str, dict[tuple, list[dict]]] = {}
    for r in records:
        key = (ranks_key(r), r["algo"], r["backend"], bool(r["inplace"]))
        by_collective.setdefault(r["collective"], {}).setdefault(key, []).append(r)

    drawn = {}
    for collective, series in by_collective.items():
        labels, shared = _labels(sorted(series))
        data: dict[str, dict] = {}
        for key in sorted(series):
            points = sorted(series[key], key=lambda r: r["nbytes"])
            timed = [r for r in points if r["nbytes"] > 0 and r["time_us"] > 0]
            moved = [r for r in points if r["nbytes"] > 0 and r["busbw_GBps"] > 0]
            data[labels[key]] = {"nbytes": [r["nbytes"] for r in timed], "time_us": [r["time_us"] for r in timed],
                                 "busbw_nbytes": [r["nbytes"] for r in moved],
                                 "busbw_GBps": [r["busbw_GBps"] for r in moved]}
        missing = [label for label, d in data.items() if not d["busbw_GBps"]]
        path = folder / f"bench-{collective}.png"
        with _figure(path, BENCH_SIZE, ncols=2) as (fig, axes):
            from matplotlib.ticker import LogFormatter

            bw, tm = axes[0]
            for i, (label, d) in enumerate(data.items()):
                color = _color(i)  # one color per series on both panels, even where a panel skips it
                if d["busbw_GBps"]:
                    bw.plot(d["busbw_nbytes"], d["busbw_GBps"], "o-", color=color, markersize=4, label=label)
                tm.plot(d["nbytes"], d["time_us"], "o-", color=color, markersize=4, label=label)
            if link_GBps is not None:
                bw.axhline(link_GBps, linestyle="--", color="gray", label=f"link {link_GBps:g} GB/s")
            for ax, title, ylabel in ((bw, "bus bandwidth", "bus bandwidth (GB/s)"), (tm, "time", "time (µs)")):
                _bytes_axis(ax)
                ax.set_yscale("log")
                ax.set_title(title)
                ax.set_xlabel("message size (bytes)")
                ax.set_ylabel(ylabel)
                ax.grid(True, which="major", alpha=0.3)
                if len(ax.get_legend_handles_labels()[1]) > 1:
                    ax.legend(fontsize=8)
            # under the axis, not inside it, where it could cover a curve
            if missing:
                bw.set_xlabel("message size (bytes)\nnot drawn, bus bandwidth 0: " + "; ".join(missing))
            # times span a decade or two: 200, 600 read at a glance where 2x10^2, 6x10^2 do not
            tm.yaxis.set_major_formatter(LogFormatter())
            tm.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1.5, 0.5)))
            fig.suptitle(f"{collective}: {shared}" if shared else collective)
        drawn[str(path)] = {"collective": collective, "series": data, "link_GBps": link_GBps,
                            "busbw_not_drawn": missing}
    return drawn


# ------------------------------------------------------------------------------------------------------ run


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _groups(runs: list[dict], factor: str) -> dict[str, list[dict]]:
    """Runs that agree on every config key but `factor`, under a label naming the keys that tell groups apart."""
    keys = sorted({k for run in runs for k in run["config"]} - {factor})
    varying = [k for k in keys if len({repr(run["config"].get(k)) for run in runs}) > 1]
    groups: dict[str, list[dict]] = {}
    for run in runs:
        label = ", ".join(f"{k}={run['config'].get(k)}" for k in varying) or "all runs"
        groups.setdefault(label, []).append(run)
    return groups


def _iteration_plot(runs: list[dict], path: Path) -> dict:
    labels = [run["label"] for run in runs]
    segments: dict[str, list[float]] = {key: [] for key, _ in SEGMENTS}
    for run in runs:
        s = run["result"]["summary"]
        for key in MEASURED:
            segments[key].append(s[key])
        # what the four parts leave of the wall time: host work between phases, timing gaps
        segments["other_ms"].append(max(0.0, s["wall_ms"] - sum(s[k] for k in MEASURED)))
    with _figure(path, ITERATION_SIZE) as (fig, axes):
        ax = axes[0][0]
        bottom = [0.0] * len(runs)
        for i, (key, name) in enumerate(SEGMENTS):
            ax.bar(labels, segments[key], bottom=bottom, label=name, color=_color(i), width=0.6)
            bottom = [b + v for b, v in zip(bottom, segments[key])]
        ax.set_title("Time per iteration, split by phase")
        ax.set_xlabel("run")
        ax.set_ylabel("ms per iteration")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never over them
        if len(runs) > 4:
            ax.tick_params(axis="x", labelrotation=20)
    return {"labels": labels, "segments": segments}


def _payload_MiB(result: dict) -> float:
    return sum(v["bytes_per_epoch"] for v in result["volume"].values()) / 2**20


def _factor_plot(runs: list[dict], factor: str, path: Path) -> dict:
    units = sorted({run["result"]["summary"]["throughput_unit"] for run in runs})
    ylabels = {key: f"{title} ({unit or ' / '.join(units)})" for key, title, unit in PANELS}
    panels: dict[str, dict[str, dict]] = {key: {} for key, _, _ in PANELS}
    for label, group in _groups(runs, factor).items():
        group = sorted(group, key=lambda run: run["config"][factor])
        x = [run["config"][factor] for run in group]
        s = [run["result"]["summary"] for run in group]
        values = {"comm_ms": [v["comm_ms"] for v in s], "compute_ms": [v["compute_ms"] for v in s],
                  "throughput": [v["throughput"] for v in s],
                  "payload_MiB": [_payload_MiB(run["result"]) for run in group]}
        for key in panels:
            panels[key][label] = {"x": x, "y": values[key]}
    xs = sorted({run["config"][factor] for run in runs})
    with _figure(path, FACTOR_SIZE, nrows=2, ncols=2) as (fig, axes):
        for ax, (key, title, _) in zip(axes.flat, PANELS):
            for i, (label, line) in enumerate(panels[key].items()):
                # unclipped: a point at 0 (no comm on one rank) would hide half under the axis
                ax.plot(line["x"], line["y"], "o-", color=_color(i), label=label, clip_on=False)
            ax.set_title(title)
            ax.set_xlabel(factor)
            if len(xs) <= 12:  # few values: tick each one the runs used, not numbers no run had
                ax.set_xticks(xs)
            ax.set_ylabel(ylabels[key])
            ax.set_ylim(bottom=0)  # from zero: a change reads at its true size
            ax.grid(True, alpha=0.3)
            if len(panels[key]) > 1:
                ax.legend(fontsize=8)
        fig.suptitle(f"Effect of {factor}")
    return {"factor": factor, "panels": panels, "ylabels": ylabels}


def _loss_plot(runs: list[dict], path: Path) -> dict:
    lines = {}
    for run in runs:
        loss = list(run["result"]["metrics"]["loss"])
        lines[run["label"]] = {"step": list(range(1, len(loss) + 1)), "loss": loss}
    with _figure(path, LOSS_SIZE) as (fig, axes):
        from matplotlib.ticker import MaxNLocator

        ax = axes[0][0]
        for i, (label, line) in enumerate(lines.items()):
            ax.plot(line["step"], line["loss"], "o-", color=_color(i), markersize=3, label=label)
        ax.set_title("Training loss")
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("loss")
        ax.grid(True, alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=8)
    return {"lines": lines}


def run_plots(runs: list[dict], folder: str | Path, *, factor: str | None = None) -> dict[str, dict]:
    """Plots comparing `commprof run` reports; `runs` is [{"label", "config": {flag: value}, "result": doc}].

    folder/run-iteration.png: a stacked bar per run — data, compute, exposed comm, bubble and the rest of
    wall_ms. folder/run-<factor>.png, only when every run's config[factor] is a number: comm time, compute
    time, throughput and payload per epoch against the factor, one line per group of runs that agree on every
    other config key. folder/run-loss.png: loss per step, one line per run.

    Returns {path: data}: {"labels", "segments": {key: [ms per run]}} for the iteration plot,
    {"factor", "panels": {key: {group: {"x", "y"}}}, "ylabels"} for the factor plot, and
    {"lines": {label: {"step", "loss"}}} for the loss plot.
    """
    labels = [run["label"] for run in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"run labels must differ: {labels}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    drawn = {}
    if not runs:
        return drawn
    path = folder / "run-iteration.png"
    drawn[str(path)] = _iteration_plot(runs, path)
    if factor is not None and all(_is_number(run["config"].get(factor)) for run in runs):
        path = folder / f"run-{factor}.png"
        drawn[str(path)] = _factor_plot(runs, factor, path)
    path = folder / "run-loss.png"
    drawn[str(path)] = _loss_plot(runs, path)
    return drawn
