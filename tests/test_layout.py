"""The layout holds: lower layers never import upper ones, and every module's "Exercised by" line names
tests that exist. Read from the source as text and syntax trees; nothing is imported or run."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOWER = ("errors", "world", "measurement", "flags", "job", "report", "profile", "comm", "data", "models")
"""Packages and modules below the commands: they measure, count, name and render."""
UPPER = ("bench", "run", "strategies", "parallel", "lifecycle", "launch", "cli", "nsys")
"""What builds on them: commands, strategies and the job's life cycle."""


def _modules(*names: str) -> list[Path]:
    out = []
    for name in names:
        folder, module = ROOT / "commprof" / name, ROOT / "commprof" / f"{name}.py"
        out += sorted(folder.rglob("*.py")) if folder.is_dir() else [module] if module.exists() else []
    return out


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


@pytest.mark.parametrize("path", _modules(*LOWER), ids=lambda p: str(p.relative_to(ROOT)))
def test_lower_layers_import_nothing_above_them(path):
    upward = sorted(m for m in _imported(path) if m.split(".")[1] in UPPER)
    assert not upward, f"{path.relative_to(ROOT)} imports {', '.join(upward)}"


def _exercised() -> list[tuple[str, str, str | None]]:
    """(module, test file, -k expression or None) for every test an "Exercised by" line names."""
    out = []
    for path in sorted([*(ROOT / "commprof").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]):
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
        params = re.findall(r"parametrize\([^)]*", path.read_text())
        assert any(k in n for n in names) or any(k in p for p in params), f"{module}: -k {k} selects nothing in {test}"
