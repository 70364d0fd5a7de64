"""Tables that fit the terminal: a table drawn narrower than it needs leaves out whole columns, in an order its
builder chose, and says which — it never cuts a number (`681… MiB`), as Rich does when cells outgrow the width.

Numbers sit in right-aligned columns, which never wrap; a header may (give it a newline). The width is the one the
table is drawn in: the terminal's, COLUMNS when output is piped (as Rich reads it), else RESULTS_WIDTH, so a log
file holds whole tables. Exercised by: `pytest tests/test_fit.py`.

Bench's tables and its summary go by a stricter rule (`Fitting`, `fit_rows`): a number is never cut, a column
that tells rows apart is never left out, and what a constant column held is said once.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import os
from typing import Callable, Iterable, Mapping, Union

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


def _share(table: Table, room: int, floors: list[int] | None = None) -> None:
    """Fix each column's width when the text does not fit unwrapped: every column its floor (its longest word
    unless given), then what is left to the columns that are furthest from their unwrapped width. Rich would
    narrow the widest columns first and cut words in them."""
    floors = floors if floors is not None else [_longest_word(c) for c in table.columns]
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


Step = Union[str, tuple[str, str]]
"""One step of narrowing a table: a column's name (leave it out), or (name, shorter header) (abbreviate it)."""
BLANK = ("", "none", "n/a", "N/A")
"""What a constant column may hold that is not worth saying: such a column is named among those left out."""


class Fitting:
    """`table` drawn by `fit_rows` in the width it is drawn in."""

    def __init__(self, table: Table, steps: Iterable[Step], labels: Mapping[str, Callable[[str], str]] | None = None,
                 ) -> None:
        self.table = table
        self.steps = tuple(steps)
        self.labels = dict(labels or {})

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield fit_rows(self.table, options.max_width, self.steps, self.labels)


def fit_rows(table: Table, width: int, steps: Iterable[Step],
             labels: Mapping[str, Callable[[str], str]] | None = None) -> Table:
    """A copy of `table` that shows every number whole at `width`: bench's rule for its tables and summary.

    Numbers sit in right-aligned columns, which get their widest cell before any header is wrapped; text in
    left-aligned ones, which keep their cells on one line while they can. Until the table fits, `steps` are
    taken in order: a name leaves out the column(s) of that header, a (name, header) pair gives them a shorter
    header. A column of `labels` (type, redop, root, ranks, ...) is left out only when it holds one value in every
    row — a column that tells rows apart stays — and what it held is said once in the caption ("all rows: float32,
    sum", each value as labels[name] words it; a blank or "none" column is named among those left out). The
    builder orders its steps: columns implied by others (count) and constant labels first, then the least
    important figures, then headers. Last, text cells wrap at spaces, then fold; a number never does (in a
    terminal too narrow for the numbers alone, they fold too: every digit is drawn). Where the table fits as it
    is, it is drawn as it is."""
    labels = labels or {}
    out = copy.copy(table)
    out.columns = [dataclasses.replace(c) for c in table.columns]
    _reindex(out)
    names = [header_name(c) for c in out.columns]
    order = {name: i for i, name in reversed(list(enumerate(names)))}
    left_out: list[str] = []
    said: list[tuple[int, str]] = []

    def fits() -> bool:
        return _room(out, width) >= sum(_floors(out.columns, False))

    for step in steps:
        if fits():
            break
        name, short = (step, None) if isinstance(step, str) else step
        mine = [i for i, n in enumerate(names) if n == name]
        if not mine:
            continue
        if short is not None:
            for i in mine:
                out.columns[i].header = short
            continue
        if name in labels:
            values = {_plain(cell) for i in mine for cell in out.columns[i]._cells}
            if len(values) > 1:  # it tells rows apart
                continue
            value = values.pop() if values else ""
            if value.strip() in BLANK:
                left_out.append(name)
            else:
                said.append((order[name], labels[name](value)))
        else:
            left_out.append(name)
        out.columns = [c for i, c in enumerate(out.columns) if i not in mine]
        names = [n for i, n in enumerate(names) if i not in mine]
        _reindex(out)
    room = _room(out, width)
    floors = _floors(out.columns, False)
    if sum(floors) > room:  # the last resort: text cells wrap at spaces, then fold; numbers keep their width
        floors = _floors(out.columns, True)
        text = [i for i, c in enumerate(out.columns) if not _numbers(c)]
        for i in text:
            out.columns[i].overflow = "fold"
        while sum(floors) > room and text and max(floors[i] for i in text) > 4:
            floors[max(text, key=lambda k: floors[k])] -= 1
        if sum(floors) > room:  # too narrow for the numbers themselves: Rich narrows them, folded, never with "…"
            for column in out.columns:
                column.overflow = "fold"
    _share(out, room, floors)
    lines = [table.caption] if table.caption else []
    if said:
        lines.append("all rows: " + ", ".join(words for _, words in sorted(said)))
    if left_out:
        lines.append(f"left out at {width} columns: {', '.join(left_out)} (a wider terminal, "
                     f"COLUMNS={RESULTS_WIDTH}, or the JSON has them)")
    if len(lines) > (1 if table.caption else 0):
        out.caption = "\n".join(lines)
        out.caption_justify = "left"
    return out


def _numbers(column) -> bool:
    """A right-aligned column holds numbers (or words that are as short): its cells never wrap."""
    return column.justify == "right"


def _floors(columns, wrap: bool) -> list[int]:
    """The narrowest each column may be: its longest header word, and its widest cell (a text column's longest
    word once text may wrap)."""
    out = []
    for column in columns:
        cells = [str(t) for t in column._cells if isinstance(t, (str, Text))]
        if wrap and not _numbers(column):
            widest = max((cell_len(w) for t in cells for w in t.split()), default=1)
        else:
            widest = max((cell_len(line) for t in cells for line in t.splitlines()), default=1)
        head = max((cell_len(w) for w in str(column.header).split()), default=1)
        out.append(max(widest, head))
    return out


def _plain(cell) -> str:
    return str(cell) if isinstance(cell, (str, Text)) else repr(cell)
