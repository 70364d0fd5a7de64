"""The phase recorder on a calibrated 2-rank workload whose true compute, comm, overlap and exposed time are
known. (Its arithmetic without ranks: tests/unit/test_breakdown.py.)"""

import json
import statistics
import sys
from pathlib import Path

import pytest
from spawn import spawn

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def calibrated():
    proc = spawn([sys.executable, str(HERE / "phases_worker.py")], nproc=2, backend="gloo")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    by_case = {}
    for row in rows:
        by_case.setdefault(row["case"], []).append(row)
    return {case: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k not in ("case",)}
            for case, rs in by_case.items()}


def close(got, want, rel=0.10, abs_ms=2.0):
    return abs(got - want) <= max(rel * want, abs_ms)


LATE_MS = 12.0
"""How late an async op's completion may be stamped on this 2-core machine: gloo's callback needs a core
and the GIL while rank 0 spins (seen: 1-7 ms, up to 9.8 ms before the worker shortened the switch
interval). A blocking op is stamped by the thread it returns to: within the 10 %."""


def hidden_until_join(c) -> bool:
    """The op ends when rank 1 joins (not before: from its issue, which a busy machine may delay), stamped at
    most LATE_MS later on an idle machine — more on a busy one, by as much as a plain thread woken at the join
    was late in the same run (the worker's control). Where rank 0 is still computing at the join, the stamp
    may wait for a core as long as it stays nearer the join than the wait: on a busy machine gloo's callback
    was seen 20 ms late while the control's thread was 2 ms late; a stamp taken at the wait instead, the
    fault this looks for, is ~70 ms late."""
    late = max(LATE_MS + c["wake_late_ms"], (c["issue_to_wait_min_ms"] - c["join_ms"]) / 2)
    return c["join_ms"] - c["issued_ms"] - 1.0 <= c["comm_ms"] <= c["join_ms"] + late


def forward_measured(c) -> bool:
    """The recorder's compute lies between the spin's own duration and the time around the phase."""
    return c["forward_min_ms"] - 0.5 <= c["compute_ms"] <= c["forward_max_ms"] + 0.5


def test_calibrated_blocking_comm_has_no_overlap(calibrated):
    c = calibrated["blocking"]  # compute 60 ms, then a blocking op that completes when rank 1 joins
    assert c["forward_min_ms"] >= 60 and forward_measured(c), c
    assert close(c["comm_ms"], c["join_ms"] - c["forward_end_ms"]), c
    assert close(c["exposed_comm_ms"], c["join_ms"] - c["forward_end_ms"]), c
    assert c["overlap_ms"] < 1.0, c


def test_calibrated_async_comm_hidden_behind_compute(calibrated):
    c = calibrated["overlap"]  # issued at 0, joined at ~80 ms, compute 150 ms: all hidden
    assert c["forward_min_ms"] >= 150 and forward_measured(c), c
    assert hidden_until_join(c), c
    # all of the op but the stretch from its issue to the phase's start (µs when idle; a busy machine may
    # pause the rank there for ms) lies inside the compute, and only that stretch is exposed. Held per
    # repeat: the medians keep the order
    assert c["comm_outside_compute_ms"] <= c["issue_to_phase_max_ms"] + 0.5, c
    assert c["exposed_comm_ms"] <= c["issue_to_phase_max_ms"] + 0.5, c


def test_calibrated_async_comm_partly_exposed(calibrated):
    c = calibrated["partial"]  # issued at 0, compute 60 ms, joined at ~150 ms
    assert c["forward_min_ms"] >= 60 and forward_measured(c), c
    assert hidden_until_join(c), c
    assert close(c["overlap_ms"], c["compute_ms"]), c
    # waited on while in flight: the op completes when the wait returns, so comm − exposed is the time from
    # its issue to the wait (the compute and the statements around it); 2 ms for the wait's own stamp
    assert c["issue_to_wait_min_ms"] - 0.5 <= c["comm_minus_exposed_ms"] <= c["issue_to_wait_max_ms"] + 2.0, c
    assert c["comm_minus_exposed_ms"] >= c["compute_ms"] - 0.5, c
    assert c["exposed_comm_ms"] <= c["comm_ms"]
