"""Tables that fit the terminal: a table drawn narrower than it needs leaves out whole columns, in an order its
builder chose, and says which — it never cuts a number (`681… MiB`), as Rich does when cells outgrow the width.

Numbers sit in right-aligned columns, which never wrap; a header may (give it a newline). The width is the one the
table is drawn in: the terminal's, COLUMNS when output is piped (as Rich reads it), else RESULTS_WIDTH, so a log
file holds whole tables. Exercised by: `pytest tests/test_fit.py`.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import os
from typing import Iterable

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

RESULTS_WIDTH = 200
"""The width of tables written off a terminal when COLUMNS is not set: wide enough for every column."""


def results_console(width: int = RESULTS_WIDTH) -> Console:
    """The console results go to: the terminal's width; off a terminal COLUMNS, else `width`."""
    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return console
    return Console(width=width)


def header_name(column) -> str:
    """A column's header as one line: 'out-of-place time (us)'."""
    return " ".join(str(column.header).split())


class Narrowing:
    """`table`, drawn with the fewest of `drop`'s columns left out (in that order; a name may match several
    columns, e.g. both modes' `algbw (GB/s)`) that keeps every cell whole in the width it is drawn in."""

    def __init__(self, table: Table, drop: Iterable[str]) -> None:
        self.table = table
        self.drop = tuple(drop)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield fit(self.table, options.max_width, self.drop)


def fit(table: Table, width: int, drop: Iterable[str]) -> Table:
    """A copy of `table` without as few of `drop`'s columns as makes it whole at `width`, its caption naming
    what was left out, and its columns' widths set so that no word is cut; the copy with every droppable column
    gone when even that does not fit (Rich then cuts, as it would)."""
    out = copy.copy(table)
    out.columns = [dataclasses.replace(c) for c in table.columns]
    _reindex(out)
    left_out: list[str] = []
    for name in drop:
        if _room(out, width) >= sum(_longest_word(c) for c in out.columns):
            break
        keep = [c for c in out.columns if header_name(c) != name]
        if len(keep) < len(out.columns):
            out.columns = keep
            _reindex(out)
            left_out.append(name)
    _share(out, _room(out, width))
    if left_out:
        said = (f"left out at {width} columns: {', '.join(left_out)} (a wider terminal, COLUMNS={RESULTS_WIDTH}, or "
                "the JSON has them)")
        out.caption = f"{table.caption}\n{said}" if table.caption else said
        out.caption_justify = "left"
    return out


def _room(table: Table, width: int) -> int:
    """The width left for the columns' text once borders and padding are drawn."""
    return width - table._extra_width - sum(table._get_padding_width(c._index) for c in table.columns)


def _share(table: Table, room: int) -> None:
    """Fix each column's width when the text does not fit unwrapped: every column its longest word, then what
    is left to the columns that are furthest from their unwrapped width. Rich would narrow the widest columns
    first and cut words in them."""
    floors = [_longest_word(c) for c in table.columns]
    natural = [max(floor, _longest_line(c)) for floor, c in zip(floors, table.columns)]
    if sum(natural) <= room or sum(floors) > room:
        return
    widths, spare = list(floors), room - sum(floors)
    while spare > 0:
        i = max(range(len(widths)), key=lambda k: natural[k] - widths[k])
        if natural[i] <= widths[i]:
            break
        widths[i] += 1
        spare -= 1
    for column, w in zip(table.columns, widths):
        column.width = w


def whole(table: Table, width: int) -> bool:
    """Whether `table` drawn at `width` shows every cell in full and stays inside the width."""
    body = copy.copy(table)
    body.title = body.caption = None
    sink = Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False)
    sink.print(body, crop=False)
    drawn = sink.file.getvalue()
    return "…" not in drawn and all(cell_len(line) <= width for line in drawn.splitlines())


def _texts(column) -> list[str]:
    return [str(t) for t in (column.header, *column._cells) if isinstance(t, (str, Text))]


def _longest_word(column) -> int:
    """The widest word in a column's header and cells: narrower, Rich would cut it."""
    return max((cell_len(word) for t in _texts(column) for word in t.split()), default=1)


def _longest_line(column) -> int:
    return max((cell_len(line) for t in _texts(column) for line in t.splitlines()), default=1)


def _reindex(table: Table) -> None:
    """Rich pads a column by its index (the first and last go to the edge)."""
    for i, column in enumerate(table.columns):
        column._index = i
