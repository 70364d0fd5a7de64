"""Figures that never contradict their definitions (docs/design.md's measurement model), checked on every
iteration record and volume row a test reads from a `commprof run` JSON."""

import pytest

EPS_MS = 1e-6
"""Rounding of ns sums printed as ms."""
TIMES = ("wall_ms", "data_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "overlap_ms", "bubble_ms", "other_ms")


def check_iteration(it: dict) -> None:
    """exposed ≤ comm, overlap ≤ min(compute, comm), data + compute + exposed + bubble + other = wall, all ≥ 0."""
    for name in TIMES:
        assert it.get(name, 0) >= 0, (name, it)
    assert it["exposed_comm_ms"] <= it["comm_ms"] + EPS_MS, it
    assert it["overlap_ms"] <= min(it["compute_ms"], it["comm_ms"]) + EPS_MS, it
    parts = it.get("data_ms", 0) + it["compute_ms"] + it["exposed_comm_ms"] + it.get("bubble_ms", 0)
    assert parts + it["other_ms"] == pytest.approx(it["wall_ms"], abs=EPS_MS), it
    assert all(v >= 0 for v in it.get("comm_by_group_ms", {}).values()), it


def check_run(doc: dict) -> None:
    """Every iteration of a run document, and every byte count of its volume table."""
    for it in doc["iterations"]:
        check_iteration(it)
    for op, row in doc.get("volume", {}).items():
        for key, value in row.items():
            if "bytes" in key and value is not None:
                assert value >= 0, (op, key, value)
