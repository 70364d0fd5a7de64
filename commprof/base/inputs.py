"""Reading the files `report` and `predict` are given — saved results, bench JSON, traces — so that a file
they cannot use ends the command in one line that names it and says what is wrong (UsageError, exit 2):
a path that is missing or unreadable, a folder, a FIFO, a device or a socket (refused by its type before
it is opened, so a FIFO without a writer cannot hang the command and /dev/zero cannot fill memory), an
empty file, bytes that are not UTF-8, text that is not JSON or not a JSON object, JSON nested too deeply
for the parser, or an object whose fields are not what the command reads.

    doc = read_json("bench.json", "not a commprof result")
    with wrong_shape("bench.json", "not a commprof result"):
        rows = [r["nbytes"] for r in doc["results"]]   # a KeyError here: one line, exit 2

Exercised by: `pytest tests/test_bad_input.py`.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import stat
from pathlib import Path

from commprof.base.errors import UsageError

_TYPES = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))

HEAD_BYTES = 1 << 16
"""Read first: a document that does not begin as a JSON object is refused without reading the rest."""

SHAPE_ERRORS = (KeyError, IndexError, TypeError, AttributeError, ValueError, ArithmeticError)
"""What code that reads a parsed document raises when a field is missing or of another type."""


def _regular(mode: int, shown: str) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _TYPES if test(mode)), "not a regular file")
        raise UsageError(f"{shown}: cannot read it ({kind}, not a file)")


def read_json(path: str | Path, not_ours: str, *, shown: str | None = None) -> dict:
    """The JSON object in the regular file `path`, else UsageError `<shown>: <what is wrong>` (`shown`
    defaults to the path). `not_ours` says what a file of the wrong content is not: "not a commprof result"."""
    shown = str(path) if shown is None else shown
    try:
        _regular(os.stat(path).st_mode, shown)  # before opening: a FIFO's open waits for a writer
        # O_NONBLOCK: should the path have become a FIFO since, the open returns at once and fstat refuses it
        with open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
            _regular(os.fstat(f.fileno()).st_mode, shown)
            head = f.read(HEAD_BYTES)
            start = head.removeprefix(codecs.BOM_UTF8).lstrip(b" \t\r\n")[:1]
            if not start and len(head) < HEAD_BYTES:
                raise UsageError(f"{shown}: {not_ours} (the file is {'empty' if not head else 'only white space'})")
            if start and start != b"{":
                said = repr(start.decode()) if 0x20 < start[0] < 0x7f else f"byte 0x{start[0]:02x}"
                raise UsageError(f"{shown}: {not_ours} (not a JSON object: it begins with {said}, not '{{')")
            f.seek(0)
            data = f.read()
    except OSError as exc:
        raise UsageError(f"{shown}: cannot read it ({exc.strerror or exc})") from None
    except MemoryError:
        raise UsageError(f"{shown}: cannot read it (too large to hold in memory)") from None
    return _parse(data, not_ours, shown)


def _parse(data: bytes, not_ours: str, shown: str) -> dict:
    import json

    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{shown}: {not_ours} (not UTF-8 text: byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start})") from None
    del data  # the text alone from here: a large file is not held twice while it is parsed
    try:
        doc = json.loads(text)
    except RecursionError:
        raise UsageError(f"{shown}: {not_ours} (JSON nested too deeply)") from None
    except ValueError as exc:
        raise UsageError(f"{shown}: {not_ours}: not JSON, or cut short ({exc})") from None
    except MemoryError:
        raise UsageError(f"{shown}: cannot read it (too large to hold in memory)") from None
    if not isinstance(doc, dict):  # only after a BOM or white space the head did not hold
        raise UsageError(f"{shown}: {not_ours} (a JSON {type(doc).__name__}, not an object)")
    return doc


@contextlib.contextmanager
def wrong_shape(shown: str, not_ours: str):
    """Inside: an error that a document of the wrong shape raises where it is read (a missing key, a
    string where a number belongs, …) becomes UsageError `<shown>: <not_ours> (…)`. COMMPROF_DEBUG=1
    lets the error and its traceback through."""
    try:
        yield
    except SHAPE_ERRORS as exc:
        if os.environ.get("COMMPROF_DEBUG"):
            raise
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise UsageError(f"{shown}: {not_ours} (a field is missing or of the wrong type: "
                         f"{type(exc).__name__}: {detail})") from None
