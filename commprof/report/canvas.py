"""What every commprof plot shares: a figure saved when its block ends, lines that stay visible where they
coincide with another, and legends that cover no data.

A legend starts at matplotlib's "best" place; once the figure is laid out, one that still covers a data point,
a line, a bar or a label moves outside its axes, to the right, the figure grows wider by its width and is
laid out again. Lines whose
values agree at every point are drawn with markers of decreasing size and another dash each, and the legend
names them "identical". Exercised by: `pytest tests/test_plots.py`.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

DPI = 100
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
"""One marker shape per series, so series read apart without color too."""
DASHES = ("-", "--", ":", "-.")
"""The line style of the 1st, 2nd, … line of a group that coincides."""
MARKER_SIZE = 7.0
"""The first line's marker size (points), unless given; each further line of a coinciding group is SHRINK
points smaller, down to 2."""
SHRINK = 2.0
IDENTICAL_RTOL = 1e-5
"""Lines are identical when every value agrees with the other's to 1 part in 10^5 (the tables print 5
significant digits or fewer), at the same x values."""
SAMPLES = 24
"""Points tested for cover along each drawn line segment, between its two data points."""


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display, and works the same over ssh and in CI
    import matplotlib.pyplot as plt

    return plt


def color(i: int) -> str:
    return f"C{i % 10}"  # the default cycle has ten colors; C10 is no color name


@contextmanager
def figure(path: Path | str, size: tuple[float, float], nrows: int = 1, ncols: int = 1, *,
           keep: dict | None = None):
    """A figure to draw on; laid out with its legends clear of the data and saved to `path` when the block
    ends, and closed even when drawing fails. `keep`, a dict, receives the Figure under str(path): closed,
    it can still be drawn and read back."""
    plt = pyplot()
    fig, axes = plt.subplots(nrows, ncols, figsize=size, dpi=DPI, squeeze=False)
    try:
        yield fig, axes
        settle_legends(fig)
        fig.savefig(path, dpi=DPI)  # explicit: a matplotlibrc's savefig.dpi would change the pixel size
    finally:
        plt.close(fig)
    if keep is not None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)  # closing left the figure a canvas that cannot draw
        keep[str(path)] = fig


# ---------------------------------------------------------------------------------------------------- lines


def identical(a: tuple[list, list], b: tuple[list, list]) -> bool:
    import numpy as np

    (xa, ya), (xb, yb) = a, b
    return list(xa) == list(xb) and len(ya) > 0 and bool(np.allclose(ya, yb, rtol=IDENTICAL_RTOL, atol=0.0))


def draw_lines(ax, lines: dict[str, tuple[list, list]], *, index: dict[str, int] | None = None,
               markersize: float = MARKER_SIZE, **style) -> dict[str, str | None]:
    """Each line as markers joined by a line, color and marker from its index (its position in `lines`
    unless given, so a series keeps both across panels); returns {label: the label it is identical to, or
    None}. The 2nd, 3rd, … line identical to an earlier one is drawn over it smaller and with another dash,
    so both stay in sight, and its legend entry says so."""
    same: dict[str, str | None] = {}
    rank: dict[str, int] = {}  # place within its group of identical lines: 0 for the first
    members: dict[str, int] = {}
    for label, line in lines.items():
        first = next((other for other in members if identical(lines[other], line)), None)
        same[label], rank[label] = first, 0 if first is None else members[first]
        if first is None:
            members[label] = 1
        else:
            members[first] += 1
    for i, (label, (x, y)) in enumerate(lines.items()):
        j = index[label] if index is not None else i
        k = rank[label]
        name = label if same[label] is None else f"{label} (identical to {same[label]})"
        ax.plot(x, y, color=color(j), marker=MARKERS[j % len(MARKERS)], linestyle=DASHES[k % len(DASHES)],
                markersize=max(2.0, markersize - SHRINK * k), label=name, **style)
    return same


# -------------------------------------------------------------------------------------------------- legends


def settle_legends(fig) -> None:
    """Lay the figure out; any axes legend that covers data moves outside its axes, to the right, and the
    figure grows by that legend's width (the widest of its column), so the axes keep their size."""
    outside: set[int] = set()
    reserved: dict[int, float] = {}  # inches added for the legends beside each column of axes
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    for _ in range(len(legends) + 1):
        fig.tight_layout()
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        moved = False
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is None or id(legend) in outside or not covers_data(ax, legend, renderer):
                continue
            legend.set_loc("upper left")
            legend.set_bbox_to_anchor((1.02, 1.0), transform=ax.transAxes)
            outside.add(id(legend))
            moved = True
            column = ax.get_subplotspec().colspan.start if ax.get_subplotspec() else 0
            need = legend.get_window_extent(renderer).width / fig.dpi + 0.15
            if need > reserved.get(column, 0.0):
                width, height = fig.get_size_inches()
                fig.set_size_inches(width + need - reserved.get(column, 0.0), height)
                reserved[column] = need
        if not moved:
            return


def data_points(ax, *, along: int = 0):
    """Every drawn line's data points in display pixels, as an (n, 2) array; with `along`, also that many
    points evenly along each segment between them. Lines with no line style give their markers only."""
    import numpy as np

    out = [np.empty((0, 2))]
    for line in ax.get_lines():
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
        xy = xy[np.isfinite(xy).all(axis=1)]
        out.append(xy)
        if along and len(xy) > 1 and line.get_linestyle() not in ("None", "", " "):
            t = np.linspace(0.0, 1.0, along + 2)[1:-1, None]
            for a, b in zip(xy[:-1], xy[1:]):
                out.append(a + t * (b - a))
    return np.concatenate(out)


def covers_data(ax, legend, renderer) -> bool:
    """True when the legend's box holds a data point or a point of a line (widened by a marker's radius),
    or meets a bar or a text drawn in the axes."""
    box = legend.get_window_extent(renderer)
    pad = max((line.get_markersize() for line in ax.get_lines()), default=0.0) * ax.figure.dpi / 72 / 2 + 1
    points = data_points(ax, along=SAMPLES)
    inside = ((points[:, 0] >= box.x0 - pad) & (points[:, 0] <= box.x1 + pad)
              & (points[:, 1] >= box.y0 - pad) & (points[:, 1] <= box.y1 + pad))
    if inside.any():
        return True
    extents = [artist.get_window_extent(renderer) for artist in (*ax.patches, *ax.texts) if artist.get_visible()]
    return any(box.overlaps(e) for e in extents if e.width > 0 and e.height > 0)
