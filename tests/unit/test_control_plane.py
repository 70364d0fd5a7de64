"""The control plane's reads at any world size, on a real TCPStore served in this process: a live window's
posts read in one go once all are there and gone from the store after; every rank's failure snapshot read
with its member lists as runs, and the desync found from them; the watchdogs' checks for a claim bounded
for the whole job."""

from __future__ import annotations

import time
import types

import torch.distributed as dist

from commprof.comm.failure import flight
from commprof.comm.failure.control import ControlPlane
from commprof.comm.failure.watchdog import LISTEN_RATE, Watchdog, listen_s


def _planes(n: int):
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", store.port, 1, False)
    return store, [ControlPlane(store if r == 0 else client, rank=r, world_size=n) for r in range(n)]


def test_a_window_is_read_whole_once_every_rank_posted_it_and_leaves_the_store():
    store, planes = _planes(4)
    for r in (1, 2):
        planes[r].post_window(7, {"rank": r, "window": 7})
    assert planes[0].windows(7, 3) == []  # two of three: not yet
    planes[3].post_window(7, {"rank": 3, "window": 7})
    got = planes[0].windows(7, 3)
    assert sorted(w["rank"] for w in got) == [1, 2, 3]
    assert not store.check(["commprof/live/7"]) and not store.check(["commprof/live/7/n"])
    planes[1].post_window(8, {"rank": 1, "window": 8})
    assert [w["rank"] for w in planes[0].windows(8, 3, now=True)] == [1]  # given up on: what came


def test_failure_snapshots_carry_member_runs_and_a_desync_is_still_found():
    n = 6
    store, planes = _planes(n)
    for r in range(n):
        call = "all_gather" if r == 4 else "all_reduce"
        planes[r].post_state({"rank": r, "reason": None, "busy": f"{call} (world)", "groups": {"world": list(range(n))},
                              "seqs": {"world": 3}, "ring": [["world", 3, call, 1024, "float32"]]})
    got = planes[0].states(within_s=0.0)
    assert sorted(got) == list(range(n)) and got[5]["groups"] == {"world": [[0, n - 1]]}
    assert flight.first_divergence(got) == ("desync at all_reduce seq 3 (world): ranks 0-3, 5 called all_reduce "
                                            "1 KiB float32, rank 4 called all_gather 1 KiB float32")


def test_many_ranks_are_named_as_runs_and_the_rest_counted():
    assert flight.name_ranks([3]) == "rank 3" and flight.name_ranks([0, 1]) == "ranks 0, 1"
    many = [r for r in range(16384) if r % 100]
    assert flight.name_ranks(many) == ("ranks 1-99, 101-199, 201-299, 301-399, 401-499, 501-599, 601-699, 701-799 "
                                       f"and {len(many) - 8 * 99} more")


def test_the_watchdogs_checks_for_a_claim_stay_bounded_for_the_whole_job():
    assert listen_s(8, 0.2) == 0.2 and listen_s(800, 0.2) == 0.2
    for n in (1024, 4096, 16384, 65536):
        assert n / listen_s(n, 0.2) <= LISTEN_RATE * 1.0001
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    counted = {}
    for world in (2, 16384):  # rank 1 of a small job, the control, and of a large one, both watched for 1 s
        plane = ControlPlane(dist.TCPStore("127.0.0.1", store.port, 1, False), rank=1, world_size=world)
        checks, claimed = [], plane.claimed
        plane.claimed = lambda claimed=claimed, checks=checks: (checks.append(1), claimed())[1]
        comm = types.SimpleNamespace(control=plane, recorder=types.SimpleNamespace(comms=[]))
        dog = Watchdog(comm, timeout_s=60.0, rank=1)
        dog.__enter__()
        start = len(checks)
        time.sleep(1.0)
        counted[world] = len(checks) - start
        dog._stop.set()
        dog._join()
    assert counted[2] >= 3 and counted[16384] <= 1, counted
