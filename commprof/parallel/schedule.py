"""Pipeline schedules as plain lists of actions: ("F", i) runs micro-batch i forward, ("B", i) backward.

    gpipe(4)                 -> F0 F1 F2 F3 B0 B1 B2 B3       (every stage)
    one_f_one_b(4, 2, 0)     -> F0 F1 B0 F2 B1 F3 B2 B3       (stage 0 of 2)

GPipe keeps every micro-batch's activations until the backwards start (m in flight); 1F1B starts the
backward of micro-batch i as soon as the last stage can, so stage s never holds more than p − s. Both
idle (p − 1) forward+backward slots per stage: the bubble fraction (p − 1) / (m + p − 1).
Exercised by: `pytest tests/unit/test_partition_schedule.py -k schedule`.
"""

from __future__ import annotations


def gpipe(m: int, p: int, s: int) -> list[tuple[str, int]]:
    """All forwards, then all backwards (in micro-batch order, as torch's ScheduleGPipe)."""
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def one_f_one_b(m: int, p: int, s: int) -> list[tuple[str, int]]:
    """Warm-up forwards (p − s − 1 of them), then one forward one backward, then the remaining backwards."""
    warm = min(p - s - 1, m)
    actions = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        actions += [("F", warm + i), ("B", i)]
    actions += [("B", i) for i in range(m - warm, m)]
    return actions


def peak_in_flight(actions: list[tuple[str, int]]) -> int:
    """Most micro-batches whose forward has run and backward has not, at any point of `actions`."""
    live = peak = 0
    for kind, _ in actions:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def bubble_fraction(m: int, p: int) -> float:
    """Idle share of each stage's schedule with equal stages: (p − 1) / (m + p − 1)."""
    return (p - 1) / (m + p - 1)
