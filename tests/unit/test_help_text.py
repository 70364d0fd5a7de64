"""The words users read: every `--help` (commprof's and each command's) fits 80 columns, however wide the
terminal, keeps its example commands one a line, and speaks to users — no test file, pytest command, module
path or "Exercised by" line, which the module docstrings keep for developers; and `commprof profile`'s volume
table says per epoch only where --steps-per-epoch said how long one is, else the whole run (recorded profile
results, tests/recorded/). The parser is built here and its help formatted in this process."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console

import commprof
from commprof.cli.commands import COMMANDS, build_parser
from commprof.report.script_table import profile_tables

PACKAGE = Path(commprof.__file__).resolve().parent
MODULE_FILES = {p.name for p in PACKAGE.rglob("*.py")}
"""The package's own file names (bench/command.py, interpose.py, …): no help names one."""
DEVELOPER = re.compile(r"tests/|pytest|Exercised by|\bcommprof/|\bcommprof\.\w+\.\w")
"""Test files, pytest commands, "Exercised by" lines, module paths and dotted module names."""


def helps(monkeypatch, columns: int) -> dict[str, str]:
    """Each help as `commprof [COMMAND] --help` prints it in a terminal `columns` wide."""
    monkeypatch.setenv("COLUMNS", str(columns))
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    return {"commprof": parser.format_help(), **{name: commands[name].format_help() for name in COMMANDS}}


@pytest.mark.parametrize("columns", [80, 200])
def test_every_help_fits_80_columns(monkeypatch, columns):
    wide = {name: [line for line in text.splitlines() if len(line) > 80]
            for name, text in helps(monkeypatch, columns).items()}
    assert not any(wide.values()), {name: lines for name, lines in wide.items() if lines}


def test_a_narrower_terminal_narrows_the_prose(monkeypatch):
    for name, text in helps(monkeypatch, 60).items():
        prose = text.split("\n\n")[1]  # the description, after the usage
        assert max(map(len, prose.splitlines())) <= 58, (name, prose)


def test_no_help_speaks_to_developers(monkeypatch):
    for name, text in helps(monkeypatch, 80).items():
        assert not DEVELOPER.findall(text), (name, DEVELOPER.findall(text))
        files = {Path(word).name for word in re.findall(r"[\w./-]+\.py\b", text)} & MODULE_FILES
        assert not files, (name, files)


def test_every_command_explains_itself_with_examples_one_a_line(monkeypatch):
    texts = helps(monkeypatch, 80)
    for name in COMMANDS:
        examples = texts[name].split("examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
        commands = [line for line in examples if line.startswith("  ") and not line.startswith("      ")]
        assert len(commands) >= 3 and all(f"commprof {name}" in line or "commprof run" in line
                                          for line in commands), (name, examples)
    # an example keeps its own line, where prose would have been run together and filled
    assert "\n  commprof bench all_reduce -b 8 -e 16M -f 2 --nproc 4 --json out.json\n" in texts["bench"]
    assert "COMMAND --help" in texts["commprof"]


def _volume_words(doc: dict) -> str:
    console = Console(record=True, width=200, color_system=None)
    for table in profile_tables(doc):
        console.print(table)
    return " ".join(console.export_text().split())


def test_profile_volume_says_per_epoch_only_with_steps_per_epoch(recorded):
    doc = json.loads((recorded("fused") / "profile.json").read_text())  # made without --steps-per-epoch
    assert doc["config"]["steps_per_epoch"] is None and doc["steps"]["per_epoch"] == doc["steps"]["found"] == 12
    shown = _volume_words(doc)
    assert ("transfer volume per rank (rank 0; the whole run: 12 iterations; --steps-per-epoch N for per epoch)"
            in shown), shown
    assert "iterations per epoch" not in shown and "payload/run" in shown and "payload/epoch" not in shown

    doc["config"]["steps_per_epoch"] = doc["steps"]["per_epoch"] = 6  # as `--steps-per-epoch 6` makes it
    shown = _volume_words(doc)
    assert "transfer volume per rank (rank 0; 6 iterations per epoch)" in shown, shown
    assert "whole run" not in shown and "payload/epoch" in shown and "payload/run" not in shown
