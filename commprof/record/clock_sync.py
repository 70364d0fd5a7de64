"""Every rank's clock against rank 0's, for a trace whose ranks share one time axis (record/trace.py): the
offset each rank's perf_counter_ns stands from rank 0's, measured by round trips over the control plane, and
applied where the clocks are not one.

    COMMPROF_FAULT=clock:rank=1:ms=500 commprof run --strategy ddp --nproc 2 --trace t/   # t/trace.json's clock_sync

Exercised by: `pytest tests/test_trace.py tests/test_findings.py tests/test_fabric.py`.
"""

from __future__ import annotations

import time

SAME_CLOCK_SLACK_NS = 1_000
"""How far beyond its round trip's bound a measured offset may lie on one clock (rounding, stamp order)."""


def sync_clocks(comm, rounds: int = 16) -> dict:
    """Each rank's clock offset against rank 0 (perf_counter_ns), by round trips over the control plane, rank
    by rank: rank 0 stamps a and broadcasts it; rank r stamps b on arrival and broadcasts b; rank 0 stamps c
    on its arrival. Both legs are the same broadcast, so neither way is the slow one by construction (a
    gather back, which waits for every rank, biased the middle by half a millisecond at 4 ranks). Rank r's b
    happened between a and c on rank 0's clock, so its offset θ lies in [b − c, b − a]; θ lies in every
    round's interval, so in their intersection [max(b − c), min(b − a)], whose middle is the estimate and
    whose half-width the bound. Ranks on rank 0's host share its CLOCK_MONOTONIC: offset 0, unless the
    round trips show their clock differs by more than the bound (SAME_CLOCK_SLACK_NS beside it): a clock that
    is not rank 0's though the host name is (a container, the `clock` fault) is aligned as another host's."""
    low: dict[int, int] = {0: 0}
    high: dict[int, int] = {0: 0}
    a = time.perf_counter_ns()
    for _ in range(rounds):
        comm.control_barrier()
        for r in range(1, comm.world_size):
            a = time.perf_counter_ns()
            comm.broadcast_object(a if comm.rank == 0 else None, src=0)
            b = comm.broadcast_object(time.perf_counter_ns() if comm.rank == r else None, src=r)
            if comm.rank == 0:
                c = time.perf_counter_ns()
                low[r] = max(low.get(r, b - c), b - c)
                high[r] = min(high.get(r, b - a), b - a)
    best = {r: ((low[r] + high[r]) // 2, max(0, high[r] - low[r]) // 2) for r in low}
    hosts = comm.gather_object(host_name(), dst=0)
    table = None
    if hosts is not None:
        apart = [hosts[r] != hosts[0] or abs(best[r][0]) > best[r][1] + SAME_CLOCK_SLACK_NS
                 for r in range(comm.world_size)]
        table = {"epoch_ns": a, "ranks": [
            {"rank": r, "host": hosts[r], "measured_offset_ns": best[r][0], "bound_ns": best[r][1],
             "applied_offset_ns": best[r][0] if apart[r] else 0,
             "residual_ns": best[r][1] if apart[r] else 0} for r in range(comm.world_size)]}
    return comm.broadcast_object(table, src=0)


def host_name() -> str:
    import socket

    return socket.gethostname()
