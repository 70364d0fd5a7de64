"""What a legend of a drawn matplotlib figure covers: data points, bars and texts under its box. Used by
tests/test_plot_artists.py and tests/unit/test_plot_legends.py."""

import numpy as np


def covered(fig) -> list[str]:
    """What a legend of `fig` covers: data points (widened by their marker), bars and texts in its axes."""
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        for line in ax.get_lines():
            r = line.get_markersize() * fig.dpi / 72 / 2
            for x, y in line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float)):
                if box.x0 - r <= x <= box.x1 + r and box.y0 - r <= y <= box.y1 + r:
                    found.append(f"{ax.get_title()}: a point of {line.get_label()}")
        for artist in (*ax.patches, *ax.texts):
            extent = artist.get_window_extent(renderer)
            if extent.height > 0 and box.overlaps(extent):
                found.append(f"{ax.get_title()}: {artist}")
    return found
