"""PNG plots of saved results: bench curves against message size, and a comparison of `commprof run` reports.

`bench_plots` draws one figure per collective: bus bandwidth and time against size, one curve per series of
records. `run_plots` draws the time split of an iteration per run, how comm, compute, throughput and payload
move with one factor of the configuration, and the loss curves. Each returns, per file, the numbers it drew,
as plain data, and with `keep` the Figures themselves, so a caller can check a figure against the report it
came from. figures.py holds what the plots share: markers, identical lines, legends clear of the data.
matplotlib is imported only when a plot is drawn, with the Agg backend, so importing this module stays cheap.

Exercised by: `pytest tests/unit/test_plots_recorded.py tests/test_plot_artists.py tests/unit/test_plot_legends.py`.
"""

from __future__ import annotations

import re
from pathlib import Path

from commprof.base.units import format_bytes
from commprof.report.bench_table import ranks_key, ranks_label, several_roots
from commprof.report.canvas import DPI, draw_lines
from commprof.report.canvas import color as _color
from commprof.report.canvas import figure as _figure

__all__ = ["DPI", "bench_plots", "run_plots"]
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


def _legend_labels(ax) -> list[str]:
    legend = ax.get_legend()
    return [] if legend is None else [t.get_text() for t in legend.get_texts()]


# ---------------------------------------------------------------------------------------------------- bench


def _series_parts(key: tuple) -> tuple[str, ...]:
    ranks, algo, backend, inplace, root, dtype, redop = key
    return (ranks_label(ranks), str(algo), str(backend), "in-place" if inplace else "out-of-place",
            "" if root is None else f"root {root}", str(dtype or ""), "" if redop in (None, "none") else str(redop))


def _labels(keys: list[tuple]) -> tuple[dict[tuple, str], str]:
    """Each series' label from the parts that differ between series, and the parts they share (for the title)."""
    parts = {key: _series_parts(key) for key in keys}
    varying = [i for i in range(len(next(iter(parts.values())))) if len({p[i] for p in parts.values()}) > 1]
    shared = ", ".join(p for i, p in enumerate(next(iter(parts.values()))) if i not in varying and p)
    if not varying:  # one series: its full description is its only name
        return {key: ", ".join(filter(None, p)) for key, p in parts.items()}, shared
    return {key: ", ".join(p[i] for i in varying) for key, p in parts.items()}, shared


def _bytes_axis(ax) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator

    # sizes are powers of two: base-2 ticks land on them, and '64 KiB' reads better than 6.6e4
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=6))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_bytes(int(round(x)))))


def bench_plots(records: list[dict], folder: str | Path, *, link_GBps: float | None = None,
                keep: dict | None = None) -> dict[str, dict]:
    """One PNG per collective, folder/bench-<collective>.png: bus bandwidth (GB/s) and time (µs) against size
    (bytes), log-log, one curve per series — the records sharing (ranks, algo, backend, inplace, dtype, reduction,
    and the root where -r all measured several), where ranks
    is the group size and how many groups measured at once (report/bench_table.py's ranks_key).

    A label names only what differs between the collective's series ("1 rank", "2 ranks"); what they share
    goes in the title. Points a log axis cannot show (a value <= 0, as the bus bandwidth of one rank) are left
    out of that panel. `link_GBps` draws a dashed "link" line on the bandwidth panel. `keep` (a dict) receives
    each Figure under its path.

    Returns {path: {"collective", "series": {label: {"nbytes", "time_us", "busbw_nbytes", "busbw_GBps"}},
    "link_GBps", "busbw_not_drawn", "legend": {"busbw", "time": [entries]}}}: per series the time panel's
    points and the bandwidth panel's, each sorted by nbytes, the labels of series with no point on the
    bandwidth panel, and each panel's legend entries ([] without a legend).
    """
    if link_GBps is not None and not link_GBps > 0:
        raise ValueError(f"link_GBps must be a positive rate, not {link_GBps!r}: the axis is logarithmic")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    by_collective: dict[str, dict[tuple, list[dict]]] = {}
    roots = several_roots(records)  # -r all: a curve per root
    for r in records:
        key = (ranks_key(r), r["algo"], r["backend"], bool(r["inplace"]), r.get("root") if r["collective"] in roots
               else None, r.get("dtype"), r.get("redop"))
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
        index = {label: i for i, label in enumerate(data)}  # one color and marker per series on both panels
        path = folder / f"bench-{collective}.png"
        with _figure(path, BENCH_SIZE, ncols=2, keep=keep) as (fig, axes):
            from matplotlib.ticker import LogFormatter

            bw, tm = axes[0]
            draw_lines(bw, {label: (d["busbw_nbytes"], d["busbw_GBps"]) for label, d in data.items()
                            if d["busbw_GBps"]}, index=index, markersize=4)
            draw_lines(tm, {label: (d["nbytes"], d["time_us"]) for label, d in data.items()}, index=index,
                       markersize=4)
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
                            "busbw_not_drawn": missing,
                            "legend": {"busbw": _legend_labels(bw), "time": _legend_labels(tm)}}
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


def _stack(summary: dict) -> tuple[float, dict[str, float]]:
    """(scale, {segment key: ms}) of one run's bar, whose parts add up to the table's wall_ms.

    Each part is a median over iterations, as the table's wall is, but of other iterations: their sum can
    pass the median wall. Then every part is scaled by the same factor (< 1) and nothing is left over;
    otherwise the parts are the table's own figures and "other" is what they leave of the wall."""
    wall = summary["wall_ms"]
    total = sum(summary[k] for k in MEASURED)
    scale = wall / total if total > wall else 1.0
    parts = {k: summary[k] * scale for k in MEASURED}
    parts["other_ms"] = max(0.0, wall - sum(parts.values())) if scale == 1.0 else 0.0
    return scale, parts


def _iteration_plot(runs: list[dict], path: Path, keep: dict | None) -> dict:
    labels = [run["label"] for run in runs]
    walls = [run["result"]["summary"]["wall_ms"] for run in runs]
    stacks = [_stack(run["result"]["summary"]) for run in runs]
    scale = [f for f, _ in stacks]
    # a part no run has would be an empty legend entry
    segments = {key: [parts[key] for _, parts in stacks] for key, _ in SEGMENTS
                if any(parts[key] > 0 for _, parts in stacks)}
    # a bar's slot stays ~0.55 in wide however many runs, and upright labels (8 pt, ~0.075 in a character) get
    # their height below the axes, which keep theirs
    upright = len(runs) > 4
    size = (max(ITERATION_SIZE[0], 3.0 + 0.55 * len(runs)),
            ITERATION_SIZE[1] + (0.075 * max(map(len, labels)) if upright else 0.0))
    with _figure(path, size, keep=keep) as (fig, axes):
        ax = axes[0][0]
        bottom = [0.0] * len(runs)
        for i, (key, name) in enumerate(SEGMENTS):
            if key in segments:
                ax.bar(labels, segments[key], bottom=bottom, label=name, color=_color(i), width=0.6)
                bottom = [b + v for b, v in zip(bottom, segments[key])]
        for x, (wall, f) in enumerate(zip(walls, scale)):
            # the table's figure, as the table prints it, on the bar it tops
            note = f"{wall:,.2f}" + (f"\nparts ×{f:.3g}" if f < 1.0 else "")
            ax.annotate(note, (x, wall), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                        fontsize=8)
        ax.set_ylim(0, 1.2 * max(walls) if max(walls) > 0 else 1.0)  # room for the labels over the bars
        ax.set_title("Time per iteration, split by phase (top: wall ms)")
        ax.set_xlabel("run")
        ax.set_ylabel("ms per iteration")
        if segments:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never over them
        if upright:  # long labels, upright under their bar: slanted ones ran into their neighbours'
            ax.tick_params(axis="x", labelrotation=90, labelsize=8)
    return {"labels": labels, "wall_ms": walls, "scale": scale, "segments": segments, "legend": _legend_labels(ax)}


def _payload_MiB(result: dict) -> float:
    return sum(v["bytes_per_epoch"] for v in result["volume"].values()) / 2**20


def _factor_plot(runs: list[dict], factor: str, path: Path, keep: dict | None) -> dict:
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
    legends = {}
    with _figure(path, FACTOR_SIZE, nrows=2, ncols=2, keep=keep) as (fig, axes):
        for ax, (key, title, _) in zip(axes.flat, PANELS):
            # unclipped: a point at 0 (no comm on one rank) would hide half under the axis
            draw_lines(ax, {label: (line["x"], line["y"]) for label, line in panels[key].items()}, clip_on=False)
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
    for ax, (key, _, _) in zip(axes.flat, PANELS):
        legends[key] = _legend_labels(ax)
    return {"factor": factor, "panels": panels, "ylabels": ylabels, "legend": legends}


def _loss_plot(runs: list[dict], path: Path, keep: dict | None) -> dict:
    lines = {}
    for run in runs:
        loss = list(run["result"]["metrics"]["loss"])
        lines[run["label"]] = {"step": list(range(1, len(loss) + 1)), "loss": loss}
    with _figure(path, LOSS_SIZE, keep=keep) as (fig, axes):
        from matplotlib.ticker import MaxNLocator

        ax = axes[0][0]
        same = draw_lines(ax, {label: (line["step"], line["loss"]) for label, line in lines.items()})
        ax.set_title("Training loss")
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("loss")
        ax.grid(True, alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=8)
    return {"lines": lines, "identical_to": same, "legend": _legend_labels(ax)}


def run_plots(runs: list[dict], folder: str | Path, *, factor: str | None = None,
              keep: dict | None = None) -> dict[str, dict]:
    """Plots comparing `commprof run` reports; `runs` is [{"label", "config": {flag: value}, "result": doc}].

    folder/run-iteration.png: a stacked bar per run — data, compute, exposed comm, bubble and the rest of
    wall_ms — topped with wall_ms, parts that have no data left out (see _stack for parts that pass the wall).
    folder/run-<factor>.png, only when every run's config[factor] is a number: comm time, compute time,
    throughput and payload per epoch against the factor, one line per group of runs that agree on every other
    config key. folder/run-loss.png: loss per step, one line per run. folder/run-causes.png (run-causes-<label>.png
    of several runs), for each run traced: each rank's step by cause (report/cause_plot.py). `keep` (a dict)
    receives each Figure under its path.

    Returns {path: data}: {"labels", "wall_ms", "scale", "segments": {key: [ms per run]}, "legend"} for the
    iteration plot, {"factor", "panels": {key: {group: {"x", "y"}}}, "ylabels", "legend": {key: entries}} for
    the factor plot, and {"lines": {label: {"step", "loss"}}, "identical_to": {label: label or None},
    "legend"} for the loss plot.
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
    drawn[str(path)] = _iteration_plot(runs, path, keep)
    if factor is not None and all(_is_number(run["config"].get(factor)) for run in runs):
        path = folder / f"run-{factor}.png"
        drawn[str(path)] = _factor_plot(runs, factor, path, keep)
    path = folder / "run-loss.png"
    drawn[str(path)] = _loss_plot(runs, path, keep)
    for run in runs:  # traced runs: each rank's step by cause (findings), one figure a run
        block = run["result"].get("findings") or {}
        if block.get("by_rank"):
            from commprof.report.cause_plot import cause_plot

            label = re.sub(r"[^A-Za-z0-9_.=-]+", "_", run["label"])
            path = folder / ("run-causes.png" if len(runs) == 1 else f"run-causes-{label}.png")
            drawn[str(path)] = cause_plot(block, run["result"]["summary"]["wall_ms"], path, keep=keep)
    return drawn
