"""Live mode's logic without a job: windows folded and bounded, combined with their findings, exported to a
Prometheus endpoint (a real prometheus_client server on this host) and to a JSON Lines log that report reads."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tracemalloc
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import commprof
from commprof.base.errors import UsageError
from commprof.findings.kinds import PEERS_SHOWN
from commprof.live import export
from commprof.live.combine import Held, combine
from commprof.live.config import add_live_flags, live_config
from commprof.live.export import LiveLog, Metrics
from commprof.live.window import DURATION_BUCKETS_S, Fold, size_bucket
from commprof.report import live_log
from commprof.report.findings_block import findings_text

MS = 1_000_000


def _iteration(step, wall, blocked, ops=(("all_reduce", 1 << 20, 2, 3.0, "world"),)):
    """(figures, op log entries, waits) of one iteration: `blocked` ms waited on the first op."""
    t, entries = 0, []
    for name, nbytes, size, ms, group in ops:
        entries.append((name, nbytes, size, t, t + int(ms * MS), False, group))
        t += int(ms * MS)
    waits = [(ops[0][0], 0, int(blocked * MS))] if blocked else []
    return {"step": step, "wall_ms": wall, "exposed_comm_ms": blocked, "bubble_ms": 0.0}, entries, waits


def _windows(busy_by_rank, blocked_by_rank, steps=20, jitter=0.0, seed=0):
    """One window per rank whose steps have those busy and blocked ms (± `jitter` ms)."""
    rnd = random.Random(seed)
    out = []
    for rank, (busy, blocked) in enumerate(zip(busy_by_rank, blocked_by_rank)):
        fold = Fold(rank=rank, host="h", window=steps)
        for i in range(steps):
            b = blocked + rnd.uniform(-jitter, jitter)
            w = busy + b + rnd.uniform(-jitter, jitter)
            got = fold.add(*_iteration(i, w, max(0.0, b)))
        out.append(got)
    return out


def test_a_window_every_n_steps_and_its_size_independent_of_the_jobs_length():
    fold = Fold(rank=0, host="h", window=10)
    windows = [w for i in range(1000) if (w := fold.add(*_iteration(i, 5.0, 1.0))) is not None]
    assert len(windows) == 100 and [w["first_step"] for w in windows[:2]] == [0, 10]
    assert windows[0]["ops"].keys() == windows[-1]["ops"].keys()
    assert len(json.dumps(windows[0])) == len(json.dumps({**windows[-1], "first_step": 0, "last_step": 9,
                                                          "window": 0, "time": windows[0]["time"]}))
    count, nbytes, seconds, hist, size = windows[0]["ops"]["all_reduce|world|1048576"]
    assert (count, nbytes, size) == (10, 10 << 20, 2) and seconds == pytest.approx(0.03)
    assert sum(hist) == 10 and hist[DURATION_BUCKETS_S.index(5e-3)] == 10  # 3 ms lies in (2.5 ms, 5 ms]
    assert fold.flush() is None


def test_folding_holds_no_more_memory_for_a_longer_job():
    def held(steps):
        fold = Fold(rank=0, host="h", window=20)
        tracemalloc.start()
        for i in range(steps):
            fold.add(*_iteration(i, 5.0, 1.0))
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return size

    assert held(20_000) <= held(1_000) + 4096


def test_size_buckets():
    assert [size_bucket(n) for n in (0, 1, 3, 4, 5, 1 << 20, (1 << 20) + 1)] == [0, 1, 4, 4, 8, 1 << 20, 1 << 21]


def test_a_straggler_is_named_with_its_cost_and_a_balanced_window_names_none():
    job = combine(_windows([10.0, 40.0, 10.0], [31.0, 1.0, 31.0], jitter=0.5))
    straggler = [f for f in job["findings"] if f["kind"] == "straggler"]
    assert [f["rank"] for f in straggler] == [1]
    assert straggler[0]["ms_per_step"] == pytest.approx(30.0, abs=1.5)
    assert job["findings"][0]["step_ms_without"] <= job["step_ms"]
    balanced = combine(_windows([10.0, 10.0, 10.0], [0.2, 0.2, 0.2], jitter=0.3, seed=3))
    assert not [f for f in balanced["findings"] if f["kind"] == "straggler"]
    assert [r["waiting_ms"] for r in job["ranks"]][1] == 0.0


def test_the_others_median_and_most_are_those_of_every_other_rank_ties_and_odd_counts_too():
    import numpy as np

    from commprof.base.stats import others_max, others_median

    rnd = random.Random(5)
    for n in (2, 3, 4, 7, 10):
        values = np.array([[float(rnd.choice((1, 2, 2, 3, 5))) for _ in range(6)] for _ in range(n)])
        for r in range(n):
            for i in range(6):
                rest = [values[k, i] for k in range(n) if k != r]
                assert others_median(values)[r, i] == statistics.median(rest)
                assert others_max(values)[r, i] == max(rest)


def test_a_straggler_among_many_ranks_names_its_longest_waiting_peers_and_counts_the_rest():
    n = 40
    job = combine(_windows([10.0] * (n - 1) + [40.0], [31.0] * (n - 1) + [1.0], jitter=0.5))
    found = [f for f in job["findings"] if f["kind"] == "straggler"]
    assert [f["rank"] for f in found] == [n - 1] and found[0]["ms_per_step"] == pytest.approx(30.0, abs=1.5)
    e = found[0]["evidence"]
    assert len(e["peers_wait_ms"]) == PEERS_SHOWN and e["peers"]["count"] == n - 1
    assert min(p["ms"] for p in e["peers_wait_ms"]) >= e["peers"]["median_wait_ms"] >= e["peers"]["least_wait_ms"] > 25
    text = findings_text({"items": found, "threshold": 0.03}).plain
    assert f"and {n - 1 - PEERS_SHOWN} more, the median peer" in text and text.count("rank ") < 12


def test_exposed_comm_is_the_transfer_nobody_waited_for_a_peer_in():
    job = combine(_windows([10.0, 10.0], [5.0, 5.0]))
    exposed = [f for f in job["findings"] if f["kind"] == "exposed_comm"]
    assert exposed and exposed[0]["op"] == "all_reduce" and exposed[0]["ms_per_step"] == pytest.approx(5.0)
    assert exposed[0]["bytes"] == 1 << 20 and exposed[0]["group"] == "world"


def test_many_small_collectives_are_latency_bound():
    small = [("all_reduce", 8 << k, 2, 0.1 + 1e-6 * (8 << k), "world") for k in range(6)] * 10
    big = [("all_reduce", 64 << 20, 2, 200.0, "world")]  # 0.3 GB/s: n½ about 35 KB
    folds = [Fold(rank=r, host="h", window=5) for r in range(2)]
    windows = [[f.add(*_iteration(i, 80.0, 0.0, ops=small + big)) for i in range(5)][-1] for f in folds]
    found = [f for f in combine(windows)["findings"] if f["kind"] == "latency_bound"]
    assert found and found[0]["evidence"]["ops_per_step"] == pytest.approx(60)
    assert 0 < found[0]["ms_per_step"] < found[0]["evidence"]["ms_per_step_in_them"]


def test_held_says_since_when_a_finding_holds():
    held, jobs = Held(), []
    for first, slow in ((0, False), (20, True), (40, True), (60, False), (80, True)):
        job = combine(_windows([10.0, 40.0 if slow else 10.0], [31.0 if slow else 0.1, 1.0], jitter=0.2))
        job["first_step"] = first
        held.update(job)
        jobs.append([f.get("since_step") for f in job["findings"] if f["kind"] == "straggler"])
    assert jobs == [[], [20], [20], [], [80]]


def test_the_endpoint_serves_what_the_windows_added():
    metrics = Metrics("127.0.0.1", 0, about={"command": "run", "workload": "ddp", "backend": "gloo",
                                             "world_size": "2"})
    try:
        job = combine(_windows([10.0, 40.0], [31.0, 1.0], jitter=0.2))
        Held().update(job)
        metrics.add(job)
        metrics.add(job)
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics", timeout=10).read().decode()
    finally:
        metrics.close()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for family in text_string_to_metric_families(text) for s in family.samples}
    labels = (("group", "world"), ("host", "h"), ("op", "all_reduce"), ("rank", "1"))
    assert got[("commprof_op_bytes_total", labels)] == 2 * 20 * (1 << 20)
    assert got[("commprof_ops_total", labels)] == 40
    assert got[("commprof_op_duration_seconds_bucket", tuple(sorted(labels + (("le", "0.005"),))))] == 40
    assert got[("commprof_op_duration_seconds_bucket", tuple(sorted(labels + (("le", "0.0025"),))))] == 0
    assert got[("commprof_steps_total", (("host", "h"), ("rank", "0")))] == 40
    # findings carry the rank they name as a number, for `on(rank)` joins with the per-rank series
    named = (("kind", "straggler"), ("rank", "1"), ("subject", "rank 1"))
    cost = got[("commprof_finding_seconds_per_step", named)]
    assert cost == pytest.approx(0.030, abs=0.002)
    assert got[("commprof_finding_since_step", named)] == 0
    # and what they cost, added window by window: a finding held between two scrapes is not lost
    assert got[("commprof_finding_seconds_total", named)] == pytest.approx(2 * job["steps"] * cost)
    info = (("backend", "gloo"), ("command", "run"), ("version", commprof.__version__), ("workload", "ddp"),
            ("world_size", "2"))
    assert got[("commprof_build_info", info)] == 1


def keys_holding_data(doc) -> list[str]:
    """The keys of `doc`, at any depth, that hold data rather than name a field: an op key, a rank id."""
    if isinstance(doc, dict):
        return [str(k) for k in doc if "|" in str(k) or str(k).isdigit()] + [x for v in doc.values()
                                                                            for x in keys_holding_data(v)]
    if isinstance(doc, list):
        return [x for v in doc for x in keys_holding_data(v)]
    return []


def test_the_log_names_every_field_and_report_reads_it_back(tmp_path):
    job = combine(_windows([10.0, 40.0], [31.0, 1.0], jitter=0.2))
    Held().update(job)
    assert keys_holding_data(job)  # the compact form in memory: op keys
    compact = json.loads(json.dumps(job))
    log = LiveLog(str(tmp_path / "live.jsonl"))
    log.write(job)
    log.end("complete")
    line = json.loads((tmp_path / "live.jsonl").read_text().splitlines()[0])
    assert keys_holding_data(line) == []  # records pandas.json_normalize can flatten
    op = line["ranks"][1]["ops"][0]
    count, nbytes, seconds, hist, size = job["ranks"][1]["ops"]["all_reduce|world|1048576"]
    assert op == {"op": "all_reduce", "group": "world", "size_bucket": 1048576, "count": count, "bytes": nbytes,
                  "seconds": seconds, "duration_buckets": hist, "group_size": size}
    peers = next(f for f in line["findings"] if f["kind"] == "straggler")["evidence"]["peers_wait_ms"]
    assert [p["rank"] for p in peers] == [0] and peers[0]["ms"] > 25
    assert live_log.read(str(tmp_path / "live.jsonl"), "not ours")["windows"] == [compact]


def test_report_marks_the_windows_other_processes_contended(tmp_path, capsys):
    from rich.console import Console

    log = LiveLog(str(tmp_path / "live.jsonl"))
    for k in range(3):
        job = combine(_windows([10.0, 40.0], [31.0, 1.0], jitter=0.2))
        Held().update(job)
        job["first_step"], job["last_step"] = 20 * k, 20 * k + 19
        busy = k < 2  # the first two windows beside another process's load, as live/monitor.py marks them
        job["contention"] = {"host": "h", "others_cores": 1.7 if busy else 0.1, "contended": busy}
        log.write(job)
    log.end("complete")
    live_log.render(live_log.read(str(tmp_path / "live.jsonl"), "not ours"), Console(file=sys.stdout, width=200))
    out = capsys.readouterr().out
    held = next(line for line in out.splitlines() if "straggler" in line and "rank 1" in line and "│" in line)
    assert held.rstrip("│ ").endswith("2 of 3"), held
    rows = [line for line in out.splitlines() if line.startswith("│ ") and "-" in line.split("│")[1]]
    assert [row.rstrip("│ ").endswith("1.7 cores") for row in rows] == [True, True, False], rows
    assert "contended: other processes used" in out


def test_the_log_rotates_and_report_reads_both_parts_in_order(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(export, "MAX_LOG_BYTES", 2000)
    path = str(tmp_path / "live.jsonl")
    log = LiveLog(path)
    for k in range(12):
        job = combine(_windows([10.0, 40.0 if k >= 6 else 10.0], [31.0 if k >= 6 else 0.1, 1.0], jitter=0.2))
        job["first_step"], job["last_step"] = 20 * k, 20 * k + 19
        log.write(job)
    log.end("complete")
    assert (tmp_path / "live.jsonl.1").exists() and (tmp_path / "live.jsonl").stat().st_size <= 2000
    with open(path, "a") as f:
        f.write('{"window": 3, "ran')  # cut short
    doc = live_log.read(path, "not a commprof result")
    first = [w["first_step"] for w in doc["windows"]]
    assert first == sorted(first) and first[-1] == 220 and doc["cut"] == 1 and doc["end"] == "complete"
    assert len(first) < 12  # the part rotated away before the last move is gone: the log is bounded
    from rich.console import Console

    paths = live_log.render(doc, Console(file=sys.stdout, width=160), plot_dir=str(tmp_path / "plots"))
    out = capsys.readouterr().out
    assert "straggler" in out and "rank 1" in out and "1 line(s) cut short" in out
    assert paths[0].stat().st_size > 10_000


def _args(*argv):
    p = argparse.ArgumentParser()
    add_live_flags(p)
    return p.parse_args(argv)


def test_live_flags():
    cfg = live_config(_args("--live", "--metrics-port", "0.0.0.0:9999", "--live-window", "5"))
    assert (cfg.address, cfg.port, cfg.window) == ("0.0.0.0", 9999, 5)
    assert live_config(_args("--live", "--metrics-port", "off")).address is None
    assert live_config(_args()) is None
    for argv, said in ((("--live-log", "x.jsonl"), "--live-log is a --live flag"),
                       (("--live", "--live-window", "0"), "--live-window 0"),
                       (("--live", "--metrics-port", "http"), "--metrics-port 'http'"),
                       (("--live", "--metrics-port", "70000"), "--metrics-port '70000'")):
        with pytest.raises(UsageError, match=said):
            live_config(_args(*argv))


def test_an_op_below_half_the_link_is_named_given_the_link():
    from commprof.perfmodel.fabric import link_flag

    op = [("all_gather", 64 << 20, 2, 200.0, "world")]  # 64 MiB in 200 ms: 0.17 GB/s on the bus
    folds = [Fold(rank=r, host="h", window=5) for r in range(2)]
    windows = [[f.add(*_iteration(i, 250.0, 0.0, ops=op)) for i in range(5)][-1] for f in folds]
    assert not [f for f in combine(windows)["findings"] if f["kind"] == "link"]  # no link given, none named
    found = [f for f in combine(windows, link=link_flag("10GB/s"))["findings"] if f["kind"] == "link"]
    at_link_ms = (64 << 20) * 0.5 / 10e9 * 1e3  # all_gather's bus bytes at 2 ranks: half the payload
    assert found and found[0]["op"] == "all_gather" and found[0]["bytes"] == 64 << 20
    assert found[0]["ms_per_step"] == pytest.approx(200.0 - at_link_ms)
    assert found[0]["evidence"]["ops"][0]["fraction_of_link"] == pytest.approx(at_link_ms / 200.0)


def test_two_sizes_of_ops_fit_no_line_and_name_no_latency_bound():
    two = [("all_reduce", 1 << 20, 2, 3.0, "world"), ("all_reduce", 1 << 19, 2, 3.0, "world")]
    folds = [Fold(rank=r, host="h", window=5) for r in range(2)]
    windows = [[f.add(*_iteration(i, 9.0, 3.0, ops=two)) for i in range(5)][-1] for f in folds]
    assert not [f for f in combine(windows)["findings"] if f["kind"] == "latency_bound"]


def test_each_window_gets_the_contention_of_its_own_span_however_late_the_others_post(tmp_path):
    """Rank 0 combines a window once every rank's is there, which may be windows later: the host's contention a
    window reports is read as rank 0's window closes, not when it is combined (a reading taken then covered
    another span, and a window a busy host slowed could read as quiet)."""
    import time

    from commprof.live.config import LiveConfig
    from commprof.live.monitor import Live

    phase = {"now": "rank 1 behind"}

    class Contention:
        def lap(self):
            return {"host": "h", "seconds": 0.1, "others_cores": 0.0, "steal_cores": 0.0, "contended": False,
                    "read": phase["now"]}

    later: dict = {}  # rank 1's windows, once it has posted them

    class Control:
        gone = False

        def windows(self, index, ranks):
            return {1: later.pop(index)} if index in later else {}

    log = tmp_path / "live.jsonl"
    live = Live(LiveConfig(window=5, address=None, log=str(log)), rank=0, world_size=2, control=Control(),
                contention=Contention())
    rank1 = _windows([10.0, 10.0], [0.5, 0.5], steps=5)[1]
    for step in range(10):
        live.add(*_iteration(step, 10.5, 0.5))
    deadline = time.monotonic() + 10
    while len(live.pending) < 2 and time.monotonic() < deadline:  # both of rank 0's windows taken in
        time.sleep(0.01)
    assert len(live.pending) == 2
    phase["now"] = "rank 1 posted"
    later.update({0: {**rank1, "window": 0}, 1: {**rank1, "window": 1}})
    live.close("complete")
    windows = [json.loads(line) for line in log.read_text().splitlines() if '"end"' not in line]
    assert [w["window"] for w in windows] == [0, 1]
    assert [w["contention"]["read"] for w in windows] == ["rank 1 behind"] * 2


def test_report_reads_a_log_of_many_ranks_whose_lines_are_past_any_fixed_read(tmp_path, capsys):
    from commprof.cli import main as cli

    n = 300  # about 470 B a rank: the first line is past 64 KiB
    path = str(tmp_path / "live.jsonl")
    log = LiveLog(path)
    for k in range(3):
        job = combine(_windows([10.0] * (n - 1) + [40.0], [31.0] * (n - 1) + [1.0], jitter=0.5, seed=k))
        job["first_step"], job["last_step"] = 20 * k, 20 * k + 19
        log.write(job)
    log.end("complete")
    assert len(open(path).readline()) > 1 << 16
    assert cli.main(["report", path]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"live log: 3 window(s), steps 0-59, {n} rank(s); ended: complete" in out
    assert f"straggler rank {n - 1}" in out
    doc = live_log.read(path, "not a commprof result")
    assert doc["windows"][0]["ranks"]["count"] == n and len(doc["windows"][-1]["ranks"]) == n


def test_a_log_line_nested_past_the_parser_is_one_clear_line(tmp_path):
    path = tmp_path / "live.jsonl"
    path.write_text('{"window": 0, "ranks": [], "findings": []}\n' + "[" * 100_000 + "\n")
    with pytest.raises(UsageError, match="line 2 is not a live window"):
        live_log.read(str(path), "not a commprof result")


def test_a_log_that_cannot_be_written_is_said_once_and_the_job_goes_on(tmp_path, capsys):
    import os
    import time

    fifo = tmp_path / "nobody-reads"
    os.mkfifo(fifo)
    start = time.monotonic()
    log = LiveLog(str(fifo))  # no reader: said at once, not a rank 0 blocked until one comes
    log.write({"window": 0})
    log.end("complete")
    assert time.monotonic() - start < 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot write --live-log {fifo} (a FIFO with no reader)" in err
    log = LiveLog("/dev/full")  # a device that refuses every write
    log.write({"window": 0})
    log.write({"window": 1})
    log.end("complete")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write --live-log /dev/full (No space left on device)" in err
    nested = tmp_path / "new" / "folder" / "live.jsonl"  # --json's rule: the folders are made
    log = LiveLog(str(nested))
    log.end("complete")
    assert json.loads(nested.read_text())["end"] == "complete"


def test_a_line_cut_by_a_full_file_is_taken_back(tmp_path, capsys):
    import resource
    import signal

    path = tmp_path / "live.jsonl"
    log = LiveLog(str(path))
    log.write({"window": 0, "pad": "x" * 100})
    size = path.stat().st_size
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:  # the file may grow 50 bytes more: the next line, longer, is cut there by the kernel
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 50, limit[1]))
        log.write({"window": 1, "pad": "y" * 200})
        log.write({"window": 2})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    log.end("complete")
    lines = path.read_text().splitlines(keepends=True)
    assert [json.loads(line)["window"] for line in lines] == [0] and lines[-1].endswith("\n")
    assert capsys.readouterr().err.count("cannot write --live-log") == 1
