"""The log of every op that crossed ranks: name, payload bytes, group size and its two time stamps.

`Comm` appends one plain tuple per completed op — (name, nbytes, group_size, start, end, host, group) — and
appending is the whole hot-path cost; durations and byte counts are computed when read. `host` marks
stamps taken with perf_counter_ns (async completions) rather than the clock's own (CUDA events). With
CPU stamps every tuple holds only atomic values, so the garbage collector stops scanning the log.
Exercised by: `pytest tests/test_comm.py`.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import NamedTuple

RING_LENGTH = 256
"""Ops the flight recorder keeps per rank (comm/flight.py): enough to reach back past one bench size
or one training step's buckets."""


class OpRecord(NamedTuple):
    """One completed communication op."""

    name: str
    """Comm method, e.g. 'all_reduce'."""
    nbytes: int
    """Payload bytes in nccl-tests' size convention."""
    group_size: int
    """Ranks in the group the op ran on."""
    duration_ns: int
    """Issue to completion."""


class OpRecorder:
    """Append-only op log with marks, so a caller can read back exactly the ops it issued."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.ops: list[tuple] = []
        """(name, nbytes, group_size, start, end, host, group) per completed op, in completion order."""
        self.waits: list[tuple] = []
        """(name, start_ns, end_ns) per Handle.wait: time the caller was blocked on comm."""
        self.ring: deque = deque(maxlen=RING_LENGTH)
        """(group, seq, name, nbytes, dtype) per op at issue, the last RING_LENGTH: the flight recorder.
        Never cleared: it must reach back across iterations."""
        self.comms: list = []
        """Every Comm sharing this log (the world and its subgroups), for the watchdog and the recorder."""

    def mark(self) -> int:
        """Position to pass to `records(since=…)` later."""
        return len(self.ops)

    def records(self, since: int = 0) -> list[OpRecord]:
        elapsed = self.clock.elapsed_ns
        return [OpRecord(name, nbytes, n, end - start if host else elapsed(start, end))
                for name, nbytes, n, start, end, host, _ in self.ops[since:]]

    def durations_ns(self, since: int = 0) -> list[int]:
        return [op.duration_ns for op in self.records(since)]

    def bytes_by_op(self, since: int = 0) -> Counter:
        """Payload bytes per op name."""
        total: Counter = Counter()
        for name, nbytes, *_ in self.ops[since:]:
            total[name] += nbytes
        return total

    def clear(self) -> None:
        self.ops.clear()
        self.waits.clear()
