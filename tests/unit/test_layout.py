"""The layout holds: no module imports from a layer above its own, no modules import each other in a
circle (within a layer, which the first rule cannot see), and every module's "Exercised by" line names
tests that exist. Read from the source as text and syntax trees; nothing is imported or run."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _listed(lines: list[str], indent: str) -> tuple[tuple[str, ...], ...]:
    """The layers a table lists: each line starting with `indent` and then a name begins one; its first
    column (up to two spaces) names the layer's folders, `base/` or `data/, models/`."""
    layers = []
    for line in lines:
        if line.startswith(indent) and line[len(indent):][:1] not in ("", " "):
            column = line[len(indent):].split("  ")[0]
            layers.append(tuple(name.strip().rstrip("/") for name in column.split(",")))
    return tuple(layers)


def _docstring_layers() -> tuple[tuple[str, ...], ...]:
    """The layers as commprof/__init__.py's docstring lists them, the list's one source."""
    doc = ast.get_docstring(ast.parse((ROOT / "commprof" / "__init__.py").read_text()))
    return _listed(doc.split("Layers, lowest first", 1)[1].splitlines()[1:], "  ")


LAYERS = _docstring_layers()
"""commprof's layers, lowest first: a module imports from its own layer or lower ones only."""
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def test_the_layer_list_is_read():
    assert LAYERS[0] == ("base",) and LAYERS[-1] == ("cli", "__main__") and len(LAYERS) > 10


def test_the_package_root_holds_the_layers_folders_and_nothing_else():
    entries = {p.stem for p in (ROOT / "commprof").iterdir() if p.name != "__pycache__"
               and (p.suffix == ".py" or (p / "__init__.py").is_file())}
    assert entries - {"__init__"} == set(LAYER) - {"kernels"}


def test_docs_design_lists_the_same_layers_in_the_same_order():
    text = (ROOT / "docs" / "design.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1].split("\n\n")[0]
    # a layer's names may run onto its next line ("bench/, run/, profile/," then "predict/")
    merged: list[str] = []
    for line in block.splitlines()[1:]:
        if merged and merged[-1].split("  ")[0].rstrip().endswith(",") and line[:1] not in ("", " "):
            head, rest = line.split("  ", 1) if "  " in line else (line, "")
            first, more = merged[-1].split("  ", 1)
            merged[-1] = f"{first.rstrip()} {head}  {more} {rest}"
        else:
            merged.append(line)
    assert _listed(merged, "") == LAYERS


def _sources() -> list[Path]:
    """Every module file but commprof/__init__.py (the version, the layers' list and the two calls a profiled
    script may make, which load their module when called)."""
    return sorted(p for p in [*(ROOT / "commprof").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]
                  if p != ROOT / "commprof" / "__init__.py")


def _layer(path: Path) -> str:
    """The top-level name a module file belongs to: `comm` for commprof/comm/base.py, `kernels` for kernels/."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return "kernels" if parts[0] == "kernels" else parts[1]


def _imported(path: Path) -> set[str]:
    """Every commprof module `path` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("commprof.")}  # `from commprof import x` also adds commprof.x


def test_every_module_has_a_layer():
    assert {_layer(p) for p in _sources()} <= set(LAYER)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_import_nothing_from_layers_above_them(path):
    name = _layer(path)
    upward = sorted(m for m in _imported(path) if LAYER.get(m.split(".")[1], -1) > LAYER[name])
    assert not upward, f"{path.relative_to(ROOT)} ({name}) imports {', '.join(upward)} from a layer above it"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _edges(path: Path, modules: set[str]) -> set[str]:
    """The modules `path` imports: `from commprof.data import keys` is an edge to commprof.data.keys (a
    submodule), not to the package commprof.data."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= subs if len(subs) == len(node.names) else subs | {node.module}
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return (found & modules) - {_module(path)}


def _circles() -> list[list[str]]:
    """Every group of modules that reach each other through imports (strongly connected, more than one)."""
    paths = [*_sources(), ROOT / "commprof" / "__init__.py"]
    modules = {_module(p) for p in paths}
    graph = {_module(p): _edges(p, modules) for p in paths}
    order, low, stack, found = {}, {}, [], []

    def visit(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in graph[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            group = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return found


def test_no_modules_import_each_other_in_a_circle():
    assert _circles() == []


def _exercised() -> list[tuple[str, str, str | None]]:
    """(module, test file, -k expression or None) for every test an "Exercised by" line names."""
    out = []
    for path in _sources():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        line = " ".join(doc.split())
        at = line.find("Exercised by")
        if at < 0:
            continue
        for command in re.findall(r"`pytest ([^`]+)`", line[at:]):
            words = command.split()
            k = words[words.index("-k") + 1] if "-k" in words else None
            for test in (w for w in words if w.startswith("tests/")):
                out.append((str(path.relative_to(ROOT)), test.split("::")[0], k))
    return out


def test_exercised_by_lines_are_found():
    assert len({module for module, _, _ in _exercised()}) > 60


@pytest.mark.parametrize("module,test,k", _exercised(), ids=lambda v: str(v))
def test_exercised_by_names_tests_that_exist(module, test, k):
    path = ROOT / test
    assert path.is_file(), f"{module}: {test} does not exist"
    if k is not None and re.fullmatch(r"\w+", k):  # a plain -k word selects tests whose names hold it
        names = re.findall(r"def (test_\w+)", path.read_text())
        params = re.findall(r"parametrize\((?:[^()]|\([^()]*\))*", path.read_text())  # tuples of values too
        assert any(k in n for n in names) or any(k in p for p in params), f"{module}: -k {k} selects nothing in {test}"
