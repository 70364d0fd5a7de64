"""Grids: a `bench` or `run` command line whose grid flags hold comma lists runs one complete job per
combination, one after another, and merges what they measured.

    commprof run --strategy ddp,fsdp,zero2 --nproc 1,2 --batch-size 16,32 --model mnist-cnn --steps 10 \\
                 --json grid.json --csv grid.csv --plot plots/
    commprof bench all_reduce --nproc 1,2 -e 1M --json scaling.json --plot plots/

The grid's CSV has one column per grid flag (`strategy`, `nproc`, …) holding each row's value, then the
figures: a run grid's row per combination, a bench grid's row per result. Every file written is said on
stderr, one line each (`json: grid.json`, `csv: grid.csv`, `plot: plots/run-loss.png`).

Every combination is checked before any starts: a flag value with which no combination can run (an
unknown strategy, `--nproc 0`) is an error; a combination that cannot run (`single` on 2 ranks, `fsdp` on
1) is listed once and skipped. A combination that fails while running is recorded with its one-line
reason, the others go on, and the grid exits 1 at the end. Each combination is `commprof <cmd> …` in a
process of its own, its own ranks included, so one that dies cannot take the grid with it.
Exercised by: `pytest tests/test_sweep.py`.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from commprof.base.errors import UsageError
from commprof.base.files import SCRATCH_ENV, said, write_csv

GRID_FLAGS = {
    "bench": ("--nproc",),
    "run": ("--strategy", "--nproc", "--batch-size", "--model", "--precision", "--micro-batches", "--bucket-mb",
            "--backend", "--head-width"),
}
"""Flags that take a comma list, per command; the grid is their cartesian product, in this order."""
OUTPUTS = ("--json", "--csv", "--plot", "--trace", "--link-rate")
"""Flags the grid writes itself (per combination: --trace into DIR/<combination>), or draws with."""
SHORT_OUTPUTS = {"bench": {"-F": "--csv", "-J": "--json", "--output_file": "--json"}}
"""nccl-tests' spellings of OUTPUTS (commprof/bench/nccl_flags.py), per command."""


def long_forms(command: str, argv: list[str]) -> list[str]:
    """argv with nccl-tests' spellings of the output flags (`-F out.csv`, `-Fout.csv`, `-J x.json`) as
    OUTPUTS' own (`--csv=out.csv`), so that the grid finds and writes them."""
    short, out, i = SHORT_OUTPUTS.get(command, {}), [], 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return out + argv[i:]
        flag = next((f for f in short if token == f or token.startswith(f + "=")
                     or (len(f) == 2 and token.startswith(f))), None)
        if flag is None:
            out.append(token)
            i += 1
        elif token == flag:
            out.append(f"{short[flag]}={argv[i + 1]}" if i + 1 < len(argv) else token)
            i += 2
        else:
            out.append(f"{short[flag]}={token[len(flag):].removeprefix('=')}")
            i += 1
    return out


def _flag_value(argv: list[str], i: int) -> tuple[str, str | None, int]:
    """(flag, value, tokens used) of the option at argv[i], `--flag value` or `--flag=value`."""
    token = argv[i]
    if "=" in token:
        flag, value = token.split("=", 1)
        return flag, value, 1
    return token, argv[i + 1] if i + 1 < len(argv) else None, 2


def grid_flags(command: str, argv: list[str]) -> dict[str, list[str]]:
    """The grid flags `argv` gives a comma list, with their values; {} when argv is one job."""
    out, i = {}, 0
    while i < len(argv):
        if argv[i] == "--":
            break
        if not argv[i].startswith("--"):
            i += 1
            continue
        flag, value, used = _flag_value(argv, i)
        if flag in GRID_FLAGS[command] and value is not None and "," in value:
            out[flag] = [v.strip() for v in value.split(",")]
        i += used if flag in GRID_FLAGS[command] or flag in OUTPUTS else 1
    return out


def wanted(command: str, argv: list[str]) -> bool:
    """True when `commprof <command> <argv>` is for this module: a grid, or --plot (which needs the
    job's --json after it ends, so a single job runs as a grid of one)."""
    argv = long_forms(command, argv)
    head = argv[:argv.index("--")] if "--" in argv else argv
    return bool(grid_flags(command, argv)) or any(a.split("=", 1)[0] == "--plot" for a in head)


def _strip(argv: list[str], flags: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """argv without `flags` (and their values), and the values they had."""
    kept, taken, i = [], {}, 0
    while i < len(argv):
        if argv[i].startswith("--") and argv[i].split("=", 1)[0] in flags:
            flag, value, used = _flag_value(argv, i)
            taken[flag] = value
            i += used
        else:
            kept.append(argv[i])
            i += 1
    return kept, taken


def combinations(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def label(combo: dict[str, str]) -> str:
    return " ".join(f"{flag.lstrip('-')}={value}" for flag, value in combo.items())


def check(command: str, base: list[str], grid: dict[str, list[str]]) -> tuple[list[dict], list[dict]]:
    """(combinations that can run, skipped ones with why); UsageError for a value no combination takes."""
    from commprof.cli.commands import COMMANDS, parse
    from commprof.launcher import lifecycle

    module = __import__(COMMANDS[command][0], fromlist=["COMMAND"])
    runnable, skipped, works = [], [], {flag: set() for flag in grid}
    for combo in combinations(grid):
        argv = [command, *base, *(f"{flag}={value}" for flag, value in combo.items())]
        try:
            lifecycle.configure(module.COMMAND, parse(argv, command))
        except UsageError as exc:
            skipped.append({"label": label(combo), "config": combo, "reason": str(exc)})
            continue
        runnable.append(combo)
        for flag, value in combo.items():
            works[flag].add(value)
    for flag, values in grid.items():
        for value in values:
            if value not in works[flag]:
                why = next(s["reason"] for s in skipped if s["config"][flag] == value)
                raise UsageError(f"{flag} {value}: no combination of the grid can run it ({why})")
    return runnable, skipped


@dataclass(frozen=True)
class Plan:
    """A grid, or one job with --plot, as checked before anything runs."""

    grid: dict[str, list[str]]
    """Each grid flag's values (empty: one job)."""
    base: list[str]
    """The arguments every job gets: argv without the grid's flags and the outputs."""
    outputs: dict[str, str]
    """--json, --csv, --plot, --trace and bench's --link-rate as given: the grid's own."""
    link_GBps: float | None
    """bench's --link-rate in GB/s, drawn on its --plot figures (run's goes to every job)."""
    runnable: list[dict]
    """The combinations that can run."""
    skipped: list[dict]
    """The combinations that cannot, each with why."""


def plan(command: str, argv: list[str]) -> Plan:
    """Every check of `commprof <command> <argv>` that needs no rank; raises UsageError."""
    from commprof.base import world

    if world.discover().launched:
        raise UsageError("a grid (comma lists in " + ", ".join(GRID_FLAGS[command]) + ") starts its own ranks: "
                         "run it without torchrun, mpiexec or srun")
    argv = long_forms(command, argv)
    grid = grid_flags(command, argv)
    if "--format=nccl-tests" in argv or any(a == "--format" and b == "nccl-tests" for a, b in zip(argv, argv[1:])):
        raise UsageError("--format nccl-tests prints one job's text: a grid (" + ", ".join(grid) + ") prints its "
                         "comparison table; run each configuration alone")
    base, outputs = _strip(argv, tuple(grid) + OUTPUTS)
    from commprof.base.files import check_outputs

    check_outputs({f: outputs.get(f) for f in ("--json", "--csv")},
                  {f: outputs.get(f) for f in ("--plot", "--trace")})
    link = _link_rate(command, outputs)
    if command == "run" and outputs.get("--link-rate") is not None:  # each job's findings judge ops by it
        base = [*base, "--link-rate", outputs.pop("--link-rate")]
    runnable, skipped = check(command, base, grid)
    return Plan(grid, base, outputs, link, runnable, skipped)


def main(request: tuple[str, list[str]]) -> int:
    """Run the grid `commprof <command> <argv>`; the exit code: 0, 1 when a combination failed."""
    command, argv = request
    p = plan(command, argv)
    grid, base, outputs, link, runnable, skipped = p.grid, p.base, p.outputs, p.link_GBps, p.runnable, p.skipped
    from rich.console import Console

    err = Console(stderr=True)
    if not grid:  # one job with --plot: its own output, then the plots of its --json
        return _single(command, base, outputs, link)
    for s in skipped:
        err.print(f"skipped: {s['label']}: {s['reason']}", highlight=False)
    runs = _run_all(command, base, runnable, outputs.get("--trace"), err)
    doc = {"complete": True, "command": command, "argv": argv, "grid": grid, "skipped": skipped, "runs": runs}
    if command == "bench":
        doc["results"] = [rec for run in runs if run["result"] for rec in run["result"]["results"]]
    from commprof.report import compare

    drawn = compare.render(doc, json_path=outputs.get("--json"), plot_dir=outputs.get("--plot"), link_GBps=link)
    if outputs.get("--csv"):
        write_csv(outputs["--csv"], csv_rows(doc), columns=csv_columns(doc))
    for path in drawn:
        said("plot", path)
    failed = [r for r in runs if r["error"]]
    for r in failed:
        err.print(f"failed: {r['label']}: {r['error']}", highlight=False)
    return 1 if failed else 0


def csv_rows(doc: dict) -> list[dict]:
    """The grid CSV's rows: each run's (run grid) or each result's (bench grid), with each grid flag's value
    in a column of its own."""
    from commprof.report.compare import run_rows

    def axes(run: dict) -> dict:
        return {flag.lstrip("-"): value for flag, value in run["config"].items()}

    if doc["command"] == "run":
        return [{**axes(run), **row} for run, row in zip(doc["runs"], run_rows(doc["runs"]))]
    return [{**axes(run), **rec} for run in doc["runs"] if run["result"] for rec in run["result"]["results"]]


def csv_columns(doc: dict) -> tuple[str, ...]:
    """One column per grid flag, then the figures (a run's without the label the axes replace)."""
    from commprof.base.files import CSV_COLUMNS
    from commprof.report.compare import RUN_COLUMNS

    figures = RUN_COLUMNS[1:] if doc["command"] == "run" else CSV_COLUMNS
    return tuple(flag.lstrip("-") for flag in doc["grid"]) + tuple(figures)


def _link_rate(command: str, outputs: dict) -> float | None:
    """--link-rate, checked before anything runs: bench's in GB/s, drawn on its --plot figures (so it needs
    --plot); run's as its jobs read it (perfmodel/fabric.py), None: every job takes it, for its findings."""
    if outputs.get("--link-rate") is None:
        return None
    if command == "run":
        from commprof.perfmodel.fabric import link_flag

        link_flag(outputs["--link-rate"])
        return None
    from commprof.base.units import parse_rate

    if command != "bench" or not outputs.get("--plot"):
        raise UsageError("--link-rate is drawn on bench's --plot figures: give --plot DIR too")
    return parse_rate(outputs["--link-rate"], "--link-rate")


def _single(command: str, base: list[str], outputs: dict, link: float | None) -> int:
    from commprof.report import plots

    with tempfile.TemporaryDirectory(prefix="commprof-plot-") as tmp:
        path = outputs.get("--json") or str(Path(tmp) / "result.json")
        extra = [arg for flag in ("--csv", "--trace") if outputs.get(flag) for arg in (flag, outputs[flag])]
        env = os.environ if outputs.get("--json") else {**os.environ, SCRATCH_ENV: path}
        code = subprocess.run([sys.executable, "-m", "commprof", command, *base, *extra, "--json", path],
                              stdin=subprocess.DEVNULL, env=env).returncode
        doc = _result(Path(path))
        if code or doc is None:
            return code or 1
        if command == "bench":
            drawn = plots.bench_plots(doc["results"], outputs["--plot"], link_GBps=link)
        else:
            drawn = plots.run_plots([{"label": doc["config"]["strategy"], "config": {}, "result": doc}],
                                    outputs["--plot"])
    for png in drawn:
        said("plot", png)
    return 0


def _run_all(command: str, base: list[str], combos: list[dict], trace: str | None, err) -> list[dict]:
    """Each combination as `commprof <command> …` in its own process, one after another."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    runs = []
    with tempfile.TemporaryDirectory(prefix="commprof-grid-") as tmp, Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("ETA"), TimeRemainingColumn(), console=err, transient=False) as bar:
        task = bar.add_task("grid", total=len(combos))
        for i, combo in enumerate(combos):
            name = label(combo)
            bar.update(task, description=name)
            path = Path(tmp) / f"{i}.json"
            argv = [command, *base, *(f"{flag}={value}" for flag, value in combo.items()), "--json", str(path)]
            if trace:
                argv += ["--trace", str(Path(trace) / name.replace(" ", "_").replace("=", "-"))]
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "commprof", *argv], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "COLUMNS": "200"})
            result, error = _result(path), None
            if proc.returncode:
                lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith(SAID)]
                error = (lines[-1] if lines else f"exit {proc.returncode}").removeprefix("commprof: error: ")
                result = None
            runs.append({"label": name, "config": combo, "exit_code": proc.returncode, "error": error,
                         "seconds": time.monotonic() - started, "result": result})
            bar.advance(task)
    return runs


SAID = ("json: ", "csv: ", "plot: ", "trace: ")
"""How a job's lines naming its files begin: never its error."""


def _result(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if doc.get("complete") else None
