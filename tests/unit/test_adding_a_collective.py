"""docs/adding_a_collective.md stays true: every repository path it names in backticks exists; every
`path::symbol` names a function, class, assignment or `Class.member` defined in that file; in its checklist
tables, every name in the "what to add" cell of a row is defined in one of the row's Python files; and — so
the list cannot drift — every file of commprof/ and kernels/ whose syntax tree names an existing collective
(a string literal equal to it, an attribute, a def of it or of `_` + it) is a file the page lists, or is in
ALLOWED below. Read from the sources as text and syntax trees; nothing is imported or run.

    pytest tests/unit/test_adding_a_collective.py
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "adding_a_collective.md"

TEMPLATES = ("reduce_scatter", "all_to_all")
"""The existing collectives the page is checked against: one that reduces and splits, one that moves data."""

ALLOWED = {
    # users, not enumerations: strategies that call Comm.reduce_scatter and say how many bytes they expect of it
    "commprof/strategies/fsdp.py",
    "commprof/strategies/zero2.py",
    "commprof/strategies/torch_native.py",
    # a second hand-written reduce_scatter: the page's templates are kernels/reduce_scatter_ring.py and
    # kernels/all_to_all_pairwise.py, and step 22 (kernels/__init__.py's CATALOG) lists every module
    "kernels/reduce_scatter_recursive_halving.py",
}
"""Files that name a template collective and need no step of their own for a new one."""

SPAN = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^((?:commprof|kernels|tests|docs|benchmarks|tools)/[\w./-]*|README\.md)(?:::([A-Za-z_][\w.]*))?$")
"""A repository path (from the root) with an optional ::symbol; anything else in backticks is not a path."""
SYMBOL = re.compile(r"^_?[A-Za-z]\w*(?:\.\w+)?$")
"""A name (or Class.member) in a table's "what to add" cell."""
PLACEHOLDER = re.compile(r"NEW|ALGO")
"""The page's stand-ins for the new collective and algorithm: not names to look up."""


def _prose() -> str:
    """The page without its fenced code blocks (their lines are shell, checked by tests/unit/test_docs.py)."""
    return re.sub(r"^```.*?^```[^\n]*$", "", PAGE.read_text(encoding="utf-8"), flags=re.M | re.S)


def _paths() -> list[tuple[str, str | None]]:
    """(path, symbol or None) of every backticked path in the page, in order."""
    return [(m.group(1), m.group(2)) for span in SPAN.findall(_prose()) if (m := PATH.match(span.strip()))]


def _names(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """Names a module's or class's body defines (through its if/try blocks): defs, classes, assignments."""
    out: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        out[name.id] = node
        elif isinstance(node, ast.If):
            out.update(_names(node.body) | _names(node.orelse))
        elif isinstance(node, ast.Try):
            out.update(_names(node.body) | _names(node.orelse) | _names(node.finalbody))
            for handler in node.handlers:
                out.update(_names(handler.body))
    return out


@functools.cache
def _tree(path: str) -> ast.Module:
    return ast.parse((ROOT / path).read_text(encoding="utf-8"))


def _defines(path: str, symbol: str) -> bool:
    """Whether Python file `path` defines `symbol` at its top level, or `Class.member` in that class's body."""
    top = _names(_tree(path).body)
    head, _, member = symbol.partition(".")
    if not member:
        return head in top
    cls = top.get(head)
    return isinstance(cls, ast.ClassDef) and member in _names(cls.body)


def _rows() -> list[tuple[list[str], list[str]]]:
    """(the row's Python files, the names of its "what to add" cell) of every table row whose file cell is
    one or more backticked paths: the cell after it is the one read for names."""
    rows = []
    for line in _prose().splitlines():
        if not line.startswith("|"):
            continue
        cells = line.strip().strip("|").split("|")
        for i, cell in enumerate(cells[:-1]):
            spans = [s.strip() for s in SPAN.findall(cell)]
            if spans and all(PATH.match(s) for s in spans):
                files = [s.split("::")[0] for s in spans if s.split("::")[0].endswith(".py")]
                names = [s.strip() for s in SPAN.findall(cells[i + 1])]
                rows.append((files, [n for n in names if SYMBOL.match(n) and not PLACEHOLDER.search(n)]))
                break
    return rows


def _naming(collective: str) -> set[str]:
    """Files of commprof/ and kernels/ whose syntax tree names `collective`: a string literal equal to it, an
    attribute `.name` or `._name`, a def `name` or `_name` (a Comm method and its backend half)."""
    own = {collective, "_" + collective}
    found = set()
    for path in sorted([*(ROOT / "commprof").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if collective not in path.read_text(encoding="utf-8"):
            continue  # no such token at all: no tree to walk
        for node in ast.walk(_tree(rel)):
            if ((isinstance(node, ast.Constant) and node.value == collective)
                    or (isinstance(node, ast.Attribute) and node.attr in own)
                    or (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in own)):
                found.add(rel)
                break
    return found


def test_the_page_is_read():
    paths = _paths()
    assert len({p for p, _ in paths}) > 40 and sum(s is not None for _, s in paths) > 5, paths
    assert len(_rows()) > 30 and sum(len(names) for _, names in _rows()) > 50


def test_every_path_exists():
    missing = sorted({p for p, _ in _paths() if not (ROOT / p).exists()})
    assert not missing, f"{PAGE.name} names paths that do not exist: {missing}"


def test_every_path_symbol_is_defined_there():
    wrong = [f"{p}::{s}" for p, s in _paths() if s is not None and not (p.endswith(".py") and _defines(p, s))]
    assert not wrong, f"{PAGE.name} names symbols their files do not define: {wrong}"


def test_every_name_to_add_is_defined_in_its_rows_file():
    wrong = [f"{name} (in {', '.join(files)})" for files, names in _rows() if files for name in names
             if not any(_defines(f, name) for f in files)]
    assert not wrong, f"{PAGE.name}'s tables name what their files do not define: {wrong}"


@pytest.mark.parametrize("collective", TEMPLATES)
def test_every_file_that_names_an_existing_collective_is_listed(collective):
    naming = _naming(collective)
    assert len(naming) > 10, naming  # the scan finds what it should: measurement.py, comm/base.py, …
    listed = {p for p, _ in _paths()}
    unlisted = sorted(naming - listed - ALLOWED)
    assert not unlisted, (f"these files name {collective!r} but {PAGE.relative_to(ROOT)} does not list them: "
                          f"{unlisted} (add the step there, or the file to ALLOWED with why)")


def test_the_allow_list_is_not_stale():
    stale = sorted(ALLOWED - set().union(*map(_naming, TEMPLATES)))
    assert not stale, f"ALLOWED holds files that no longer name {' or '.join(TEMPLATES)}: {stale}"
