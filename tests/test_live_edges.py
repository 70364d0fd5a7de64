"""Live mode's edges as a user meets them, through the real CLI: every --live file that cannot be written and
every flag that cannot hold is one line and exit 2 before any rank starts; a log that fails while the job runs
(a device that refuses, a FIFO with no reader) is said once and the job goes on; --live-linger longer than
--timeout keeps the endpoint up past the job's last gather without failing it; COMMPROF_FAULT's from_step
fires under `run` too. Exercised by: `pytest tests/test_live_edges.py`.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from spawn import commprof, env_for_tests

RUN = ("run", "--strategy", "ddp", "--model", "mnist-cnn", "--nproc", "2", "--batch-size", "16",
       "--samples", "1000", "--bucket-mb", "0.02")


def _refusals(tmp):
    (tmp / "afile").write_text("")
    (tmp / "afolder").mkdir()
    live = ("--live", "--metrics-port", "off")
    return [
        ((*live, "--live-log", str(tmp / "afile" / "live.jsonl")), "is a file, not a folder"),
        ((*live, "--live-log", str(tmp / "afolder")), "is a folder, not a file"),
        ((*live, "--live-log", ""), "--live-log: the path is empty"),
        ((*live, "--live-log", str(tmp / "same.out"), "--json", str(tmp / "same.out")), "name one file"),
        (("--live", "--metrics-port", "0.0.0.0:9464", "--metrics-targets", str(tmp / "afolder")), "is a folder"),
        (("--live", "--metrics-port", "\u00b2"), "--metrics-port"),
        (("--live", "--metrics-port", "\u0669\u0664\u0666\u0664"), "--metrics-port"),
    ]


def test_what_live_cannot_write_or_hold_is_refused_before_any_rank_starts(tmp_path):
    cases = _refusals(tmp_path)
    with ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda case: (time.monotonic(), commprof(*RUN, "--steps", "3", *case[0]),
                                            time.monotonic()), cases))
    for (argv, words), (start, proc, end) in zip(cases, procs):
        assert proc.returncode == 2, (argv, proc.stderr[-2000:])
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("commprof: error:") and words in lines[0], (argv, lines)
        assert "rank" not in proc.stdout


def test_a_fault_that_cannot_be_read_is_refused_before_any_rank_starts_and_one_that_never_fires_said():
    cases = (("slow:rank=1:op=allreduce", "op='allreduce'"), ("die:rank=1:signal=_IGN", "'_IGN'"),
             ("slow:rank=1:ms=1e300", "from 0 to 3600000 ms"), ("die:rank=5", None))
    with ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda c: commprof(*RUN, "--steps", "3", env=env_for_tests(COMMPROF_FAULT=c[0])), cases))
    for (spec, words), proc in zip(cases[:-1], procs):
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], (spec, proc.stderr[-2000:])
    proc = procs[-1]  # read, but on a rank the job does not have: said once, and the job runs
    assert proc.returncode == 0 and proc.stderr.count("rank=5 in 'die': the job has ranks 0-1, so it never fires") == 1


def test_a_log_that_fails_is_said_once_the_linger_outlasts_the_timeout_and_from_step_fires(tmp_path):
    # one job for three edges: --live-log on a device that refuses every write; --live-linger past
    # --timeout (rank 0 lingered before the job's last gather, and every such job exited 3); rank 1 slowed
    # from step 8 by a fault that only profile used to move the step of
    out = tmp_path / "out.json"
    linger, timeout = 6.0, 5.0
    start = time.monotonic()
    proc = commprof(*RUN, "--steps", "16", "--warmup", "2", "--timeout", str(timeout), "--live", "--live-window", "2",
                    "--metrics-port", "127.0.0.1:0", "--live-linger", str(linger), "--live-log", "/dev/full",
                    "--json", str(out), env=env_for_tests(COMMPROF_FAULT="slow:rank=1:op=all_reduce:ms=60:from_step=9"))
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("cannot write --live-log /dev/full (No space left on device)") == 1
    assert took >= linger  # the endpoint stayed for its last scrape
    doc = json.loads(out.read_text())
    rank1 = {it["step"]: it["wall_ms"] for it in doc["iterations"] if it["rank"] == 1}
    before = statistics.median(v for s, v in rank1.items() if s < 9)
    after = statistics.median(v for s, v in rank1.items() if s >= 9)
    # the slowed all_reduces (several a step) against the same rank's own steps before: the control
    assert after - before > 50, (before, after)


def test_a_fifo_with_no_reader_does_not_hold_the_job(tmp_path):
    path = tmp_path / "nobody-reads"
    os.mkfifo(path)
    proc = commprof(*RUN, "--steps", "4", "--warmup", "1", "--live", "--live-window", "2", "--metrics-port", "off",
                    "--live-log", str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(f"cannot write --live-log {path} (a FIFO with no reader)") == 1


def test_an_mpi_jobs_endpoint_is_reached_from_the_host(tmp_path):
    # a local MPI job runs in a network namespace of its own (Hydra's control port listens on every
    # interface), which held rank 0's endpoint too: the host could not reach it
    import socket
    import subprocess
    import sys
    import urllib.request

    from spawn import kill_session

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "commprof", *RUN, "--backend", "mpi", "--steps", "100000",
                             "--warmup", "1", "--eval-samples", "0", "--live", "--live-window", "5", "--metrics-port",
                             f"127.0.0.1:{port}"], env=env_for_tests(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    body, deadline = "", time.monotonic() + 90
    try:
        while "commprof_steps_total{" not in body and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.25)
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                pass
    finally:
        kill_session(proc)
    assert 'commprof_steps_total{host="' in body, proc.stderr.read()[-3000:] if proc.stderr else ""
