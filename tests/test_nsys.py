"""`commprof nsys`: the Nsight Systems command it prints, what it does without nsys, that every rank
runs under its own `nsys profile … --output=DIR/rank<r>` (a stand-in `nsys` that records its flags), and —
with the real nsys on PATH (`tools/install_nsys.sh`; CI installs it) — that Nsight Systems records
exactly the measured part, and in it the same ranges, nesting, categories, colours and payloads as
commprof's own Chrome trace of the same run, that `nsys stats` sums them, and that every op is also an
in-flight range (start/end, domain `commprof comm (<group>)`) as long as the trace's span of that op."""

import csv
import io
import os
import shutil
import sqlite3
import stat
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from spawn import commprof, env_for_tests
from test_trace import trace_spans

from commprof.record import trace
from commprof.record.annotate import COLORS

needs_nsys = pytest.mark.skipif(shutil.which("nsys") is None,
                                reason="Nsight Systems is not on PATH (tools/install_nsys.sh installs it)")
PUSH_POP, START_END, CATEGORY, DOMAIN_CREATE = 59, 60, 33, 75
"""NVTX_EVENTS.eventType in nsys's SQLite export."""

FAKE_NSYS = """#!{python}
import os, sys
args = sys.argv[1:]
assert args[0] == "profile", args
n = next(i for i, a in enumerate(args[1:]) if not a.startswith("--"))
flags, rest = args[1:1 + n], args[1 + n:]
out = next(f.split("=", 1)[1] for f in flags if f.startswith("--output="))
with open(out + ".flags", "w") as f:
    f.write("\\n".join(flags))
os.execv(rest[0], rest)
"""


def test_prints_the_command_with_the_capture_range():
    proc = commprof("nsys", "--print-only", "--output", "prof", "--", "run", "--strategy", "ddp", "--backend", "mpi")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert "--trace=cuda,nvtx,osrt " in first and "--mpi-impl" not in first and "--capture-range=nvtx" in first
    assert "--nvtx-capture=measured@commprof" in first and "prof/rank{rank}" in first
    assert "nvtx_sum,nvtx_gpu_proj_sum,cuda_gpu_kern_sum prof/rank0.nsys-rep" in proc.stdout
    assert "prof/rank%q{RANK}" in proc.stdout  # the prefix for other launchers


def test_mpi_tracing_is_opt_in_and_names_the_implementation():
    proc = commprof("nsys", "--print-only", "--trace", "cuda,nvtx,osrt,mpi", "--", "bench", "--backend", "mpi")
    assert proc.returncode == 0, proc.stderr
    assert "--trace=cuda,nvtx,osrt,mpi --mpi-impl=mpich " in proc.stdout.splitlines()[0]  # the mpich wheel's mpiexec


def test_without_nsys_one_error_line_naming_the_installer_and_exit_2(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()  # PATH holds only this empty folder: no nsys anywhere
    proc = commprof("nsys", "--", "bench", env=env_for_tests(PATH=str(bare)), cwd=str(tmp_path))
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("commprof: error: "), proc.stderr
    assert "nsys" in lines[0] and "tools/install_nsys.sh" in lines[0] and "NVIDIA" in lines[0], lines[0]
    assert "nsys profile" in proc.stdout.splitlines()[0]  # the command, for a machine that has nsys
    assert not (tmp_path / "nsys").exists()  # nothing ran: no report folder


def test_a_job_is_required():
    proc = commprof("nsys", "--", "train")
    assert proc.returncode == 2 and "needs a job" in proc.stderr


def test_every_rank_runs_under_its_own_nsys_profile(tmp_path):
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(FAKE_NSYS.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = env_for_tests(PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "reports"
    proc = commprof("nsys", "--output", str(out), "--", "run", "--strategy", "ddp", "--nproc", "2", "--steps", "3",
                    "--warmup", "1", "--batch-size", "8", "--eval-samples", "0", env=env)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        flags = (out / f"rank{rank}.flags").read_text().splitlines()
        assert f"--output={out}/rank{rank}" in flags and "--nvtx-capture=measured@commprof" in flags


def export(report: Path) -> sqlite3.Connection:
    """The report's SQLite export, made once."""
    db = report.with_suffix(".sqlite")
    if not db.exists():
        subprocess.run(["nsys", "export", "--type", "sqlite", "--output", str(db), str(report)],
                       check=True, capture_output=True, timeout=300)
    return sqlite3.connect(db)


def nvtx_rows(report: Path, domain: str, kind: int) -> list[tuple]:
    """(thread, start, end, message, category name, colour, payload) of the NVTX ranges of one kind
    (PUSH_POP, START_END) in one domain of an nsys report, in start order."""
    con = export(report)
    domain = con.execute(f"select domainId from NVTX_EVENTS where eventType = {DOMAIN_CREATE} and text = ?",
                         (domain,)).fetchone()[0]
    categories = dict(con.execute(f"select category, text from NVTX_EVENTS where eventType = {CATEGORY} "
                                  f"and domainId = {domain}"))
    rows = con.execute("select e.globalTid, e.start, e.end, coalesce(e.text, s.value), e.category, e.color, "
                       "e.int64Value from NVTX_EVENTS e left join StringIds s on s.id = e.textId "
                       f"where e.eventType = {kind} and e.domainId = {domain} order by e.start, e.end desc")
    return [(tid, start, end, text, categories.get(category), color & 0xFFFFFFFF, payload)
            for tid, start, end, text, category, color, payload in rows]


def nsys_spans(report: Path) -> dict[int, list[tuple]]:
    """thread -> [(message, category, depth, duration_ns, colour, payload)] of the commprof domain's push/pop
    ranges in an nsys report, in start order, read from its SQLite export."""
    out, ends = defaultdict(list), defaultdict(list)
    for tid, start, end, text, category, color, payload in nvtx_rows(report, "commprof", PUSH_POP):
        while ends[tid] and ends[tid][-1] <= start:
            ends[tid].pop()
        out[tid].append((text, category, len(ends[tid]), end - start, color, payload))
        ends[tid].append(end)
    return dict(out)


def measured_part(spans: list[tuple]) -> list[tuple]:
    """The `measured` range and everything inside it."""
    first = next(i for i, s in enumerate(spans) if s[0] == "measured")
    inside = next((i for i in range(first + 1, len(spans)) if spans[i][2] == 0), len(spans))
    return spans[first:inside]


def nvtx_sum(report: Path) -> dict[str, int]:
    """`nsys stats --report nvtx_sum`: range -> instances."""
    # its own export: stats reuses a report's SQLite beside it only while it looks newer than the report
    proc = subprocess.run(["nsys", "stats", "-q", "--force-export=true", "--report", "nvtx_sum", "--format", "csv",
                           str(report)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = csv.DictReader(io.StringIO(proc.stdout[proc.stdout.index("Time (%)"):]))
    return {row["Range"]: int(row["Instances"]) for row in rows}


@pytest.fixture(scope="module")
def ddp_profiled(tmp_path_factory) -> tuple[Path, Path]:
    """(reports, trace directory) of one `commprof nsys -- run --strategy ddp --nproc 2 … --trace DIR`."""
    tmp = tmp_path_factory.mktemp("nsys")
    reports, traced = tmp / "reports", tmp / "trace"
    proc = commprof("nsys", "--output", str(reports), "--", "run", "--strategy", "ddp", "--nproc", "2", "--steps", "4",
                    "--warmup", "1", "--batch-size", "8", "--eval-samples", "0", "--trace", str(traced), timeout=600)
    assert proc.returncode == 0, proc.stderr
    return reports, traced


@needs_nsys
def test_nsight_systems_records_the_measured_ranges_the_trace_shows(ddp_profiled):
    reports, traced = ddp_profiled
    for rank in range(2):
        report = reports / f"rank{rank}.nsys-rep"
        (tid, seen), = nsys_spans(report).items()  # every range on the training thread
        # the capture range: nothing from before `measured` (the warm-up iteration) or after it
        assert seen[0][:3] == ("measured", "iteration", 0) and all(s[2] > 0 for s in seen[1:])
        assert [s[0] for s in seen if s[2] == 1] == ["iteration 1", "iteration 2", "iteration 3"]
        _, spans = trace_spans(trace.load(traced / f"rank{rank}.trace.json"))
        mine = measured_part(spans)
        assert [s[:3] for s in seen] == [s[:3] for s in mine]  # names, categories, nesting, order
        gaps = sorted(abs(n[3] - t[3]) for n, t in zip(seen, mine))
        assert gaps[len(gaps) // 2] < 20_000, gaps  # ns: the same ranges, not just the same names
        assert all(colour == COLORS[category] for _, category, _, _, colour, _ in seen)
        ops = [s for s in seen if s[1] == "comm"]
        assert len(ops) == 3 and all(s[5] == 87_360 for s in ops)  # one bucket a step, bytes as payload
        counts = nvtx_sum(report)
        assert counts["commprof:measured"] == 1 and counts["commprof:forward"] == 3
        assert counts["commprof:all_reduce (world) 85.3 KiB float32"] == 3


def trace_ops(events: list[dict]) -> list[dict]:
    """The trace's comm spans (threads `comm (<group>)`) inside its `measured` span, in start order."""
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    measured = next(e for e in events if e["ph"] == "X" and e["name"] == "measured")
    return sorted((e for e in events if e["ph"] == "X" and names.get(e["tid"], "").startswith("comm (")
                   and measured["ts"] <= e["ts"] <= measured["ts"] + measured["dur"]), key=lambda e: e["ts"])


@needs_nsys
def test_every_op_is_an_in_flight_range_as_long_as_the_trace_span(ddp_profiled):
    reports, traced = ddp_profiled
    for rank in range(2):
        report = reports / f"rank{rank}.nsys-rep"
        flights = nvtx_rows(report, "commprof comm (world)", START_END)
        ops = trace_ops(trace.load(traced / f"rank{rank}.trace.json"))
        assert len(flights) == len(ops) == 3  # one bucket a step, 3 measured steps
        overhang = []
        for (_, start, end, text, category, colour, payload), op in zip(flights, ops):
            assert (text, category, colour, payload) == ("all_reduce (world) 85.3 KiB float32", "comm",
                                                         COLORS["comm"], 87_360)
            assert op["name"] == "all_reduce (world)"
            # the range brackets the op's two stamps: never shorter than the span; longer by two NVTX calls
            # and whatever the scheduler adds, typically a small part of the op (tests/test_nvtx_run.py)
            in_flight, span = end - start, op["dur"] * 1e3
            assert in_flight >= span - 2, (in_flight, span)
            overhang.append(in_flight - span)
        assert statistics.median(overhang) <= 0.5 * statistics.median(op["dur"] * 1e3 for op in ops), overhang
        # each begins inside the call that issued it; together they last longer than those calls (the point
        # of them: an async op is in flight well after its issuing call has returned)
        issued = [row for row in nvtx_rows(report, "commprof", PUSH_POP) if row[4] == "comm"]
        assert len(issued) == len(flights)
        assert all(call[1] <= flight[1] <= call[2] for call, flight in zip(issued, flights))
        assert sum(f[2] - f[1] for f in flights) > sum(c[2] - c[1] for c in issued)
        counts = nvtx_sum(report)  # what `nsys stats` shows beside the issuing calls, under the group's domain
        assert counts["commprof comm (world):all_reduce (world) 85.3 KiB float32"] == 3
