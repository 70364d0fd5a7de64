"""Live mode on real jobs (2 gloo ranks, `commprof profile --live`): a rank turned slow in the middle of a job
— by commprof's fault injection, and by the script's own sleep — is named within two windows of the step it
turned, at its injected cost, where the windows before name no straggler; the Debian `prometheus` server
scrapes the endpoint and its counters equal the job's own volume table; a rank that dies leaves a log whose
every line is whole, ending with why, that `commprof report` reads back and plots."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from spawn import commprof, env_for_tests

from commprof.base.backends import free_port, release_port

SCRIPT = str(Path(__file__).with_name("scripts") / "straggler_train.py")
WINDOW, FROM_STEP, STEPS = 10, 30, 70
FAULT_MS = 8.0
"""Slept before each of rank 1's all_reduces (DDP's buckets) from FROM_STEP on."""
SLEEP_MS = 25.0
"""Slept by the script's rank 1 before each backward from FROM_STEP on."""


def _prometheus(tmp: Path, target: int):
    """The Debian prometheus server scraping 127.0.0.1:`target` every 200 ms: (process, its API port), or None."""
    binary = shutil.which("prometheus")
    if binary is None:
        return None
    port = free_port()
    release_port(port)
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\nscrape_configs:\n  - job_name: commprof\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{target}']\n")
    proc = subprocess.Popen([binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=open(tmp / "prometheus.log", "w"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1)
            return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("prometheus did not get ready: " + (tmp / "prometheus.log").read_text()[-2000:])


def _windows(path: Path) -> tuple[list[dict], dict | None]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]  # every line whole
    return [x for x in lines if "end" not in x], next((x for x in lines if "end" in x), None)


@pytest.fixture(scope="module")
def faulted(tmp_path_factory):
    """The job slowed by COMMPROF_FAULT from FROM_STEP, scraped by prometheus where it is installed."""
    tmp = tmp_path_factory.mktemp("live")
    port = free_port()
    release_port(port)
    server = _prometheus(tmp, port)
    try:
        proc = commprof("profile", "--nproc", "2", "--live", "--live-window", str(WINDOW),
                        "--metrics-port", f"127.0.0.1:{port}", "--live-linger", "1.5",
                        "--live-log", str(tmp / "live.jsonl"), "--json", str(tmp / "out.json"), "--",
                        SCRIPT, "--steps", str(STEPS),
                        env=env_for_tests(COMMPROF_FAULT=f"slow:rank=1:op=all_reduce:ms={FAULT_MS:g}"
                                                        f":from_step={FROM_STEP}"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        found = None
        if server is not None:
            # the job is gone by now: its series are stale at this instant, their last samples are not
            query = urllib.parse.quote("last_over_time(commprof_op_bytes_total[5m])")
            answer = urllib.request.urlopen(f"http://127.0.0.1:{server[1]}/api/v1/query?query={query}", timeout=10)
            found = json.loads(answer.read())["data"]["result"]
    finally:
        if server is not None:
            server[0].kill()
            server[0].wait()
    return proc, json.loads((tmp / "out.json").read_text()), *_windows(tmp / "live.jsonl"), found


def _named_in_time(windows: list[dict], delay: float) -> None:
    """No straggler before FROM_STEP (in a window whose host was not contended: a busy machine makes a rank
    late for real, and the window says so); rank 1 named within two windows of it, at `delay` a step."""
    before = [w for w in windows if w["last_step"] < FROM_STEP]
    assert before and all("contention" in w for w in windows)
    quiet = [w for w in before if not w["contention"]["contended"]]
    assert not [f for w in quiet for f in w["findings"] if f["kind"] == "straggler"], quiet
    assert all(f.get("contended") for w in before for f in w["findings"] if w["contention"]["contended"])
    named = [w for w in windows if any(f["kind"] == "straggler" and f["rank"] == 1 for f in w["findings"])]
    assert named and named[0]["last_step"] <= FROM_STEP + 2 * WINDOW, [w["findings"] for w in windows]
    after = [next(f for f in w["findings"] if f["kind"] == "straggler") for w in named
             if w["first_step"] >= FROM_STEP]
    cost = statistics.median(f["ms_per_step"] for f in after)
    # beside the delay, what else rank 1's own time exceeds the others' by (its compute on a busy machine)
    besides = statistics.median(abs(f["evidence"]["busy_ms"] - delay - f["evidence"]["others_busy_ms"]) for f in after)
    assert abs(cost - delay) <= 0.15 * delay + besides, (cost, delay, besides)
    # since the first window of the run of windows naming it without a gap (a window that does not, on a busy
    # machine a window whose interval reaches below the threshold, ends the run: combine.Held)
    naming = [any(f["kind"] == "straggler" and f["rank"] == 1 for f in w["findings"]) for w in windows]
    for i, w in enumerate(windows):
        if naming[i] and w["first_step"] >= FROM_STEP:
            start = i
            while start > 0 and naming[start - 1]:
                start -= 1
            since = next(f for f in w["findings"] if f["kind"] == "straggler")["since_step"]
            assert since == windows[start]["first_step"], (i, [w["findings"] for w in windows])
    assert all(f["step_ms_without"] <= w["step_ms"] for w in windows for f in w["findings"])


def test_live_names_the_rank_commprofs_fault_slowed(faulted):
    proc, doc, windows, end, _ = faulted
    calls = doc["volume"]["all_reduce"]["calls_per_step"]
    _named_in_time(windows, FAULT_MS * calls)
    assert end["end"] == "complete" and windows[-1]["last_step"] == STEPS - 1
    assert "commprof: live metrics on http://127.0.0.1:" in proc.stderr
    assert "last live window" in proc.stdout  # the end's findings are the last window's (no trace kept)


def test_prometheus_scrapes_the_bytes_the_volume_table_counts(faulted):
    _, doc, windows, _, found = faulted
    if found is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus): the endpoint was not scraped")
    per_step = doc["volume"]["all_reduce"]["payload_bytes_per_step"]
    measured = doc["steps"]["measured"]
    got = {(x["metric"]["rank"], x["metric"]["op"], x["metric"]["group"]): float(x["value"][1]) for x in found}
    assert got == {("0", "all_reduce", "world"): per_step * measured, ("1", "all_reduce", "world"): per_step * measured}
    assert sum(w["steps"] for w in windows) == measured


def test_a_script_turning_slow_and_a_rank_dying_leave_a_log_report_reads(tmp_path):
    log = tmp_path / "live.jsonl"
    proc = commprof("profile", "--nproc", "2", "--live", "--live-window", str(WINDOW), "--metrics-port", "off",
                    "--live-log", str(log), "--", SCRIPT, "--steps", str(STEPS), "--delay-ms", str(SLEEP_MS),
                    "--delay-from", str(FROM_STEP),
                    env=env_for_tests(COMMPROF_FAULT=f"die:rank=1:op=all_reduce:from_step={STEPS - 10}"))
    assert proc.returncode == 3 and "rank 1 was killed by SIGKILL" in proc.stderr, proc.stderr[-3000:]
    windows, end = _windows(log)
    _named_in_time(windows, SLEEP_MS)
    assert end is not None and "rank 1" in end["end"], end
    assert "live metrics" not in proc.stderr
    shown = commprof("report", str(log), "--plot", str(tmp_path / "plots"))
    assert shown.returncode == 0, shown.stderr
    assert "straggler" in shown.stdout and "rank 1" in shown.stdout and "ended: " in shown.stdout
    assert (tmp_path / "plots" / "live.png").stat().st_size > 10_000
