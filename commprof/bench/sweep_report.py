"""Rank 0's end of `commprof bench`'s sweep (SweepReport): the progress bar, a table per collective and
layout of the ranks, the files rewritten as each point arrives, the scaling and summary tables at the end;
under --format nccl-tests, nccl-tests' text blocks, and each rank's line of its `# Using devices` block.
Exercised by: `pytest tests/test_bench_cli.py tests/test_nccl_tests_flags.py`.
"""

from __future__ import annotations

import os
import platform
import socket
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from commprof import kernels
from commprof.base import files
from commprof.base.backends import unsupported
from commprof.bench.config import BenchConfig
from commprof.record.contention import note as contention_note
from commprof.report import nccl_text
from commprof.report.bench_summary import summarize, summary_table
from commprof.report.bench_table import avg_busbw, bench_table, header, ranks_key, ranks_label
from commprof.report.fit import results_console


class SweepReport:
    """Rank 0's end of the sweep: progress bar, a table per collective and layout of the ranks, files
    rewritten as rows arrive, and a scaling table per collective when groups of several sizes ran. Under
    --format nccl-tests, stdout holds nccl-tests' text alone, a block per collective (every root of -r all in
    one, as nccl-tests prints them), and the notes go to stderr."""

    def __init__(self, cfg: BenchConfig, env: dict, plans: list, shapes: list, contention=None,
                 ranks: list | None = None) -> None:
        self.cfg, self.env, self.shapes = cfg, env, shapes
        self.contention = contention
        self.text = cfg.format == nccl_text.FORMAT
        self.ranks = ranks or []
        self.notes = list(dict.fromkeys(n for p in plans for n in p.notes))
        self.console = results_console()
        self.results: list[dict] = []
        self.current: list[dict] = []
        self.wrong = 0
        self.shown: set[str] = set()
        if not self.text:
            self.console.print(header(env))
        err = Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=err, transient=True,
                                 disable=not err.is_terminal)
        self.task = self.progress.add_task("sweep", total=sum(len(p.points) for p in plans))
        self.progress.start()

    def begin(self, layout, the_plan) -> None:
        """The next layout's sweep starts: the last one's table is complete."""
        if self.current:
            self._flush()
        self.layout, self.plan = layout, the_plan

    def add(self, point, records: list[dict]) -> None:
        if self.current:
            first = self.current[0]
            run = (first["collective"], first["algo"], None if self.text else first["root"])
            if run != (point.collective.name, point.algo, None if self.text else point.root):
                self._flush()  # -r all: a table per root; nccl-tests prints every root in one run
        self.current.extend(records)
        self.results.extend(records)
        self.wrong += sum(r["wrong"] or 0 for r in records)
        where = "" if self.layout.whole else f" · {ranks_label(ranks_key(records[0]))}"
        self.progress.update(self.task, advance=1,
                             description=f"{point.collective.name} {point.dtype or ''} {point.count} el.{where}")
        self._write(complete=False, reason="running", snapshot=True)  # a rank killed next loses nothing

    def _flush(self) -> None:
        name, algo = self.current[0]["collective"], self.current[0]["algo"]
        label = name if algo == kernels.LIBRARY else f"{name}/{algo}"
        notes = [n for n in self.plan.notes if n.startswith((name + " ", label + " "))]
        notes += _layout_notes(self.layout)
        self.shown.update(notes)
        self.progress.stop()
        if self.text:
            self._flush_text(name, notes)
            return
        self.console.print(bench_table(name, self.current, notes))
        if name != "barrier":
            root = self.current[0]["root"]
            root = f" root {root}" if self.cfg.all_roots and root is not None else ""
            self.console.print(f"# {label}{root} avg bus bandwidth: {avg_busbw(self.current):.3f} GB/s\n")
        self.progress.start()
        self.current = []

    def _flush_text(self, name: str, notes: list[str]) -> None:
        """nccl-tests' block of the collective on stdout; what its table's caption would say, on stderr."""
        modes = {r["inplace"] for r in self.current}
        if len(modes) == 1:  # e.g. `torch.distributed has no out-of-place all_reduce`
            first = self.current[0]
            why = unsupported(self.cfg.backend, name, first["dtype"], first["redop"], not first["inplace"])
            lack = "in-place" if first["inplace"] is False else "out-of-place"
            notes = [*notes, f"{name}: the {lack} columns are blank: {why or 'not measured'}"]
        for note in notes:
            sys.stderr.write(f"note: {note}\n")
        sys.stderr.flush()
        sys.stdout.write(nccl_text.block(self.current, self.cfg, self.ranks))
        sys.stdout.flush()
        self.progress.start()
        self.current = []

    def _write(self, *, complete: bool, reason: str | None = None, snapshot: bool = False) -> None:
        if self.cfg.out.json:
            files.write_json(self.cfg.out.json, self.env, self.results, complete=complete, reason=reason,
                             snapshot=snapshot)
        if self.cfg.out.csv:
            files.write_csv(self.cfg.out.csv, self.results, snapshot=snapshot, say=complete)

    def close(self) -> None:
        if self.current:
            self._flush()
        self.progress.stop()
        self._measured()
        self._write(complete=True)
        if self.text:  # nccl-tests' blocks alone on stdout: what else would be said goes to stderr
            for note in self.notes:
                if note not in self.shown:
                    sys.stderr.write(f"note: {note}\n")
            said = contention_note(self.env.get("contention"))
            if said:
                sys.stderr.write(f"{said}\n")
            return
        if len(self.shapes) > 1:
            from commprof.report.compare import scaling_tables

            for table in scaling_tables(self.results):
                self.console.print(table)
        rows = summarize(self.results)
        if rows:
            self.console.print(summary_table(rows))
        for note in self.notes:
            if note not in self.shown:  # combinations skipped entirely
                self.console.print(f"note: {note}")
        said = contention_note(self.env.get("contention"))
        if said:
            self.console.print(said, highlight=False)

    def _measured(self) -> None:
        if self.contention is not None:
            self.env["contention"] = self.contention.read()

    def abandon(self, code: int, message: str) -> None:
        """The job failed: every point measured so far, marked incomplete with the reason."""
        self.progress.stop()
        self._measured()
        self._write(complete=False, reason=message)


def _layout_notes(layout) -> list[str]:
    """What a table of groups measured at once, or of a job with ranks left waiting, needs said."""
    notes = []
    if layout.level:
        where = "within each host" if layout.level == "intra" else "across hosts, one rank of each"
        notes.append(f"{layout.level}-host: {where}: " + "; ".join(
            f"{layout.label(i)} = ranks {','.join(map(str, g))}" for i, g in enumerate(layout.groups)))
    if len(layout.groups) > 1:
        notes.append(f"{len(layout.groups)} groups of {layout.size} ranks measured at once; time and busbw over "
                     "all their ranks, each group's own in the JSON (group_time_us, group_busbw_GBps)")
    busy = sum(len(g) for g in layout.groups)
    if busy < layout.world_size:
        waiting = f"rank {busy}" if busy == layout.world_size - 1 else f"ranks {busy}-{layout.world_size - 1}"
        notes.append(f"{waiting} waited while {layout.label(0) if len(layout.groups) == 1 else 'the groups'} measured")
    return notes


def rank_line(rank: int, device) -> nccl_text.RankLine:
    """This rank's line of nccl-tests' `# Using devices` block: its GPU's index, bus and name, or, for a rank
    whose tensors live in host memory, device -1 (CUDA's id for the CPU) and the CPU's model."""
    host, pid = socket.gethostname(), os.getpid()
    if device.type == "cuda":
        import torch

        props = torch.cuda.get_device_properties(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        return nccl_text.RankLine(rank, pid, host, index, getattr(props, "pci_bus_id", None), props.name)
    return nccl_text.RankLine(rank, pid, host, -1, None, _cpu_model())


def _cpu_model() -> str:
    """The CPU's model as the kernel names it (`AMD EPYC 7B13`), else the machine's architecture."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return f"cpu {platform.processor() or platform.machine()}"
