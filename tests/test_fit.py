"""What a user's terminal shows: bench, run and profile tables at 80, 120 and 200 columns never cut a number
and never run past the width, saying which columns a narrow one left out; piped output honours COLUMNS; the
bench summary's figures follow from the records; run and profile show progress on a terminal only."""

import json
import os
import pty
import re
import subprocess
import sys

import pytest
from rich.console import Console
from spawn import env_for_tests

from commprof.report.bench_summary import STANDS_OUT, summarize, summary_table
from commprof.report.bench_table import bench_table
from commprof.report.compare import run_rows, run_table
from commprof.report.run_table import run_tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTHS = (80, 120, 200)


def commprof(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commprof", *args], env=env_for_tests(**env), capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def bench_doc(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "b.json"
    proc = commprof("bench", "all_reduce", "broadcast", "-b", "8", "-e", "1M", "-f", "8", "-n", "3", "-w", "1",
                    "--nproc", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def run_doc(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("run") / "r.json"
    proc = commprof("run", "--strategy", "ddp", "--nproc", "2", "--steps", "4", "--warmup", "1", "--eval-samples", "0",
                    "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def drawn(renderable, width: int) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None)
    console.print(renderable, crop=False)
    return console.export_text()


def whole_at(text: str, width: int) -> None:
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= width, text


@pytest.mark.parametrize("width", WIDTHS)
def test_bench_tables_keep_every_number_whole(bench_doc, width):
    for collective in ("all_reduce", "broadcast"):
        records = [r for r in bench_doc["results"] if r["collective"] == collective]
        text = drawn(bench_table(collective, records), width)
        whole_at(text, width)
        for r in records:  # what every width keeps: each size, each mode's time and busbw
            assert f"{r['time_us']:.2f}" in text and f"{r['busbw_GBps']:.2f}" in text and str(r["nbytes"]) in text
        if width == 200:
            assert "left out" not in text and f"{records[0]['p99_us']:.2f}" in text
        elif width == 80 or "left out" in text:  # at 120 a one-mode table (all_reduce on gloo) fits whole
            assert re.search(rf"left out at {width} columns: count, ", text), text
        modes = {r["inplace"] for r in records}
        assert ("in place only" in text) is (modes == {True}), text


@pytest.mark.parametrize("width", WIDTHS)
def test_run_tables_keep_every_number_whole(run_doc, width):
    grid = run_table(run_rows([{"label": "ddp", "config": {}, "error": None, "result": run_doc}]))
    text = "".join(drawn(t, width) for t in [*run_tables(run_doc), grid])
    whole_at(text, width)
    s = run_doc["summary"]
    assert f"{s['across_ranks']['wall_ms']['avg']:.2f}" in text
    assert f"{s['across_ranks']['exposed_comm_ms']['avg']:.2f}" in text


def test_piped_output_honours_columns(tmp_path, bench_doc):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(bench_doc))
    narrow = commprof("report", str(path), COLUMNS="80")
    assert narrow.returncode == 0, narrow.stderr
    whole_at(narrow.stdout, 80)
    assert "left out at 80 columns" in narrow.stdout
    wide = commprof("report", str(path))  # no COLUMNS: a log file gets every column
    assert "left out" not in wide.stdout and max(map(len, wide.stdout.splitlines())) > 120


def test_the_summary_follows_from_the_records(bench_doc):
    rows = {r["collective"]: r for r in summarize(bench_doc["results"])}
    assert set(rows) == {"all_reduce", "broadcast"}
    for name, row in rows.items():
        mine = [r for r in bench_doc["results"] if r["collective"] == name]
        oop = [r for r in mine if not r["inplace"]] or mine  # torch's all_reduce is in place only
        assert row["latency_us"] == min(oop, key=lambda r: r["nbytes"])["time_us"]
        peak = max(oop, key=lambda r: r["busbw_GBps"])
        assert (row["peak_busbw_GBps"], row["peak_nbytes"]) == (peak["busbw_GBps"], peak["nbytes"])
        half = [r["nbytes"] for r in oop if r["busbw_GBps"] >= peak["busbw_GBps"] / 2]
        assert row["half_peak_nbytes"] == min(half) and row["wrong"] == 0
    text = drawn(summary_table(list(rows.values())), 80)
    whole_at(text, 80)
    assert f"{rows['all_reduce']['peak_busbw_GBps']:.3f}" in text


def _rows(slow_rank: int, over: float, n: int = 6, slowest_in: int = 6) -> list[dict]:
    rows = []
    for i in range(n):
        late = slow_rank if i < slowest_in else 1 - slow_rank
        per_rank = [{"rank": r, "mean_us": 100.0 * (1 + over if r == late else 1)} for r in (0, 1)]
        rows.append({"collective": "all_reduce", "dtype": "float32", "redop": "sum", "world_size": 2, "inplace": False,
                     "nbytes": 8 << i, "time_us": 100.0, "busbw_GBps": 0.1 * (i + 1), "wrong": 0,
                     "slowest_rank": late, "per_rank": per_rank})
    return rows


def test_a_slowest_rank_is_named_only_when_it_stands_out():
    named = summarize(_rows(1, over=2 * STANDS_OUT))[0]["slowest"]
    assert named["rank"] == 1 and named["rows"] == 6 and named["over_pct"] == pytest.approx(200 * STANDS_OUT)
    assert summarize(_rows(1, over=STANDS_OUT / 2))[0]["slowest"] is None  # slowest, by too little
    assert summarize(_rows(1, over=1.0, slowest_in=3))[0]["slowest"] is None  # slowest in half the rows only


def _on_a_terminal(argv: list[str]) -> tuple[int, str]:
    """Run commprof with stderr on a pseudo-terminal; its exit code and what the terminal showed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "commprof", *argv], stdout=subprocess.DEVNULL, stderr=slave,
                            env=env_for_tests(TERM="xterm", COLUMNS="100"))
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the last writer closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    return proc.wait(timeout=300), shown.decode(errors="replace")


def test_run_and_profile_show_progress_on_a_terminal_only(tmp_path):
    steps = ["--nproc", "2"]
    code, shown = _on_a_terminal(["run", "--strategy", "ddp", *steps, "--steps", "12", "--eval-samples", "0"])
    assert code == 0 and re.search(r"12/12\S* \d+\.\d ms/iteration", shown), shown[-2000:]
    script = os.path.join(ROOT, "tests", "scripts", "ddp_train.py")
    code, shown = _on_a_terminal(["profile", *steps, "--", script])
    assert code == 0 and re.search(r"iteration \d+ \d+\.\d ms/iteration", shown), shown[-2000:]
    piped = commprof("run", "--strategy", "ddp", *steps, "--steps", "12", "--eval-samples", "0")
    assert piped.returncode == 0 and "ms/iteration" not in piped.stderr, piped.stderr[-2000:]
