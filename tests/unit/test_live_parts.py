"""A live window combined host by host (live/hosts.py) against the same window combined from every rank's
(live/combine.py): the same straggler at the same cost, the same exposed op, the same latency-bound ops; a
host's part the same size whatever its ranks; one rank a host and one host alone hold too."""

from __future__ import annotations

import json

import pytest
from test_live import _iteration, _windows

from commprof.live.combine import combine
from commprof.live.hosts import combine_hosts, summarize
from commprof.live.window import Fold


def _by_host(windows, per_host):
    for w in windows:
        w["host"] = f"node{w['rank'] // per_host}"
    hosts = {}
    for w in windows:
        hosts.setdefault(w["host"], []).append(w)
    return [summarize(ws) for ws in hosts.values()]


def _straggler(job):
    return [(f["rank"], f["ms_per_step"]) for f in job["findings"] if f["kind"] == "straggler"]


@pytest.mark.parametrize("n,per_host", [(8, 2), (40, 8), (6, 1), (4, 4)])
def test_hosts_parts_give_the_straggler_and_its_cost_that_every_ranks_windows_give(n, per_host):
    slow = n // 2 + 1
    windows = _windows([10.0 if r != slow else 40.0 for r in range(n)], [31.0 if r != slow else 1.0 for r in range(n)],
                       jitter=0.5)
    exact = combine(windows)
    job = combine_hosts(_by_host(windows, per_host))
    assert [r for r, _ in _straggler(job)] == [r for r, _ in _straggler(exact)] == [slow]
    assert _straggler(job)[0][1] == pytest.approx(_straggler(exact)[0][1], rel=0.05)
    f = next(f for f in job["findings"] if f["kind"] == "straggler")
    assert f["evidence"]["peers"]["count"] == n - 1 and f["host"] == f"node{slow // per_host}"
    assert job["world_size"] == n and len(job["hosts"]) == n // per_host and job["step_ms"] == exact["step_ms"]
    exposed = [(f["op"], f["group"]) for f in job["findings"] if f["kind"] == "exposed_comm"]
    assert exposed == [(f["op"], f["group"]) for f in exact["findings"] if f["kind"] == "exposed_comm"]


def test_a_balanced_job_names_no_straggler_host_by_host():
    windows = _windows([10.0] * 16, [0.2] * 16, jitter=0.3, seed=3)
    assert not _straggler(combine_hosts(_by_host(windows, 4)))


def test_latency_bound_ops_host_by_host_are_those_of_every_rank():
    small = [("all_reduce", 8 << k, 2, 0.1 + 1e-6 * (8 << k), "world") for k in range(6)] * 10
    big = [("all_reduce", 64 << 20, 2, 200.0, "world")]
    folds = [Fold(rank=r, host=f"node{r // 2}", window=5) for r in range(4)]
    windows = [[f.add(*_iteration(i, 80.0, 0.0, ops=small + big)) for i in range(5)][-1] for f in folds]
    exact = [f for f in combine(windows)["findings"] if f["kind"] == "latency_bound"][0]
    mine = [f for f in combine_hosts(_by_host(windows, 2))["findings"] if f["kind"] == "latency_bound"][0]
    assert mine["evidence"]["ops_per_step"] == pytest.approx(exact["evidence"]["ops_per_step"])
    assert mine["ms_per_step"] == pytest.approx(exact["ms_per_step"])


def test_a_hosts_part_is_the_same_size_whatever_its_ranks():
    def size(per_host):
        windows = _windows([10.0] * per_host, [1.0] * per_host)
        for w in windows:
            w["host"] = "node0"
        return len(json.dumps(summarize(windows)))

    assert size(64) <= size(16) * 1.1


def test_report_reads_the_log_of_a_job_combined_host_by_host(tmp_path, capsys):
    from commprof.cli import main as cli
    from commprof.live.export import LiveLog

    path = str(tmp_path / "live.jsonl")
    log = LiveLog(path)
    for k in range(3):
        windows = _windows([10.0] * 15 + [40.0], [31.0] * 15 + [1.0], jitter=0.5, seed=k)
        job = combine_hosts(_by_host(windows, 4))
        job["first_step"], job["last_step"] = 20 * k, 20 * k + 19
        log.write(job)
    log.end("complete")
    assert cli.main(["report", path]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "live log: 3 window(s), steps 0-59, 16 rank(s); ended: complete" in out
    assert "straggler rank 15" in out and "over 16 rank(s) on 4 host(s)" in out
