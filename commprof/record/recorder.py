"""The log of every op that crossed ranks: name, payload bytes, group size and its two time stamps.

`Comm` appends one plain tuple per completed op — (name, nbytes, group_size, start, end, host, group) — and
appending is the whole hot-path cost; durations and byte counts are computed when read. `host` marks
stamps taken with perf_counter_ns (async completions) rather than the clock's own (CUDA events). With
CPU stamps every tuple holds only atomic values, so the garbage collector stops scanning the log.
commprof's readers take fields by the index constants below (`op[START]`), never by position.

Why not a NamedTuple entry: CPython untracks only exact tuples, so a NamedTuple log stays in every full
collection. benchmarks/oplog_gc.py, 10^6 entries (medians of 7 rounds, Python 3.11, 2-core VM): append
191 ns/op as tuples vs 1074 ns/op as NamedTuples (5.6×: construction 2.3×, the rest the collections it
triggers), gc.collect() with the log alive 27 ms vs 185 ms (7.0×); reading a field by constant is 1.3×
faster than by attribute.
Exercised by: `pytest tests/test_comm.py`.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import NamedTuple

NAME, NBYTES, GROUP_SIZE, START, END, HOST, GROUP = range(7)
"""Fields of an op log entry: the Comm method (e.g. 'all_reduce'), payload bytes in nccl-tests' size
convention, ranks in the op's group, issue and completion stamps, HOST, and the group's label ("world",
"dp", "pp 0→1", …). HOST False: the clock's own stamps of an op its caller (or, on CUDA, the caller's
stream) waited on throughout; True: perf_counter_ns ints of an async op whose completion the host saw;
None: CUDA events of an async op on a stream of its own, which blocks the caller's stream only from its wait."""

RING_LENGTH = 256
"""Ops the flight recorder keeps per rank (comm/failure/flight.py): enough to reach back past one bench size
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


def restamped(op: tuple, start: int, end: int, host: bool | None) -> tuple:
    """Op log entry `op` with other stamps, e.g. its CUDA events as ns since its iteration began."""
    entry = list(op)
    entry[START], entry[END], entry[HOST] = start, end, host
    return tuple(entry)


class OpRecorder:
    """Append-only op log with marks, so a caller can read back exactly the ops it issued."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.ops: list[tuple] = []
        """One entry per completed op, in completion order; fields NAME … GROUP."""
        self.waits: list[tuple] = []
        """(name, start_ns, end_ns) per Handle.wait: time the caller was blocked on comm."""
        self.ring: deque = deque(maxlen=RING_LENGTH)
        """(group, seq, name, nbytes, dtype) per op at issue, the last RING_LENGTH: the flight recorder.
        Never cleared: it must reach back across iterations."""
        self.append_ring = self.ring.append
        """What a Comm calls with each ring entry: the ring's append, or one that also writes the rank's ring
        file in the job folder (comm/failure/ring_file.py)."""
        self.comms: list = []
        """Every Comm sharing this log (the world and its subgroups), for the watchdog and the recorder."""
        self.aligning = None
        """While an aligned iteration runs, what its Comms align with (record/aligned.py); None otherwise."""

    def mark(self) -> int:
        """Position to pass to `records(since=…)` later."""
        return len(self.ops)

    def records(self, since: int = 0) -> list[OpRecord]:
        elapsed = self.clock.elapsed_ns
        return [OpRecord(op[NAME], op[NBYTES], op[GROUP_SIZE],
                         op[END] - op[START] if op[HOST] else elapsed(op[START], op[END]))
                for op in self.ops[since:]]

    def durations_ns(self, since: int = 0) -> list[int]:
        return [op.duration_ns for op in self.records(since)]

    def bytes_by_op(self, since: int = 0) -> Counter:
        """Payload bytes per op name."""
        total: Counter = Counter()
        for op in self.ops[since:]:
            total[op[NAME]] += op[NBYTES]
        return total

    def clear(self) -> None:
        self.ops.clear()
        self.waits.clear()

    def drop(self, ops: int, waits: int) -> None:
        """Remove the first `ops` entries of the log and the first `waits` waits, those a reader took: an async
        op a backend thread logs meanwhile stays, for the next reader (clear() would lose it)."""
        del self.ops[:ops]
        del self.waits[:waits]
