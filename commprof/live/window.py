"""One rank's window of a live job: the iterations of N steps folded into bounded aggregates, whatever the
job's length — per op (name, group, size bucket): count, payload bytes, seconds, a histogram of its durations and its
group's size; per
rank: the median step, its own time (busy) and the time its training thread was blocked on comm (each step's
too: at most N of each), and that blocked time per op name.

    fold = Fold(rank=0, host="node1", window=20)
    window = fold.add(iteration, ops, waits)    # after each measured iteration: a window's dict every 20th, else None
    window = fold.flush()                       # what is left at the end (None when nothing is)

A window is plain data (JSON as it is), sized by the op kinds the job has, not by its steps: the op log
entries it folds are dropped with their iteration (record/hooks.py). Exercised by:
`pytest tests/unit/test_live.py`.
"""

from __future__ import annotations

import statistics
import time
from bisect import bisect_left

from commprof.record.recorder import END, GROUP, GROUP_SIZE, HOST, NAME, NBYTES, START

DURATION_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                      0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds of the op-duration histogram (seconds; one more bucket, +Inf, above the last): from a small
gloo op on one host (~10 µs) to a stalled one, 2-2.5× apart as Prometheus' own defaults are."""
MS = 1e-6


def size_bucket(nbytes: int) -> int:
    """The least power of two at or above `nbytes` (0 stays 0): ops of one size class share a key."""
    return 0 if nbytes <= 0 else 1 << (nbytes - 1).bit_length()


def op_key(name: str, group: str, nbytes: int) -> str:
    """A window's key of an op: 'name|group|size bucket'."""
    return f"{name}|{group}|{size_bucket(nbytes)}"


def split_key(key: str) -> tuple[str, str, int]:
    name, group, size = key.rsplit("|", 2)
    return name, group, int(size)


class Fold:
    """One rank's iterations, folded window by window."""

    def __init__(self, *, rank: int, host: str, window: int, elapsed_ns=None) -> None:
        self.rank, self.host, self.window = rank, host, window
        """This rank, its host, and the steps a window holds."""
        self.elapsed_ns = elapsed_ns
        """clock.elapsed_ns for stamps that are not host ns (CUDA events); None: every stamp is ns."""
        self.index = 0
        """Windows folded so far."""
        self._reset()

    def _reset(self) -> None:
        self._steps: list[int] = []
        self._wall: list[float] = []
        self._busy: list[float] = []
        self._blocked: list[float] = []
        self._blocked_by_op: dict[str, float] = {}
        self._ops: dict[str, list] = {}

    def add(self, iteration: dict, ops: list[tuple], waits: list[tuple]) -> dict | None:
        """Fold one measured iteration (its figures, its op log entries and its waits); the window once it
        holds `window` steps."""
        blocked = iteration.get("exposed_comm_ms", 0.0) + iteration.get("bubble_ms", 0.0)
        self._steps.append(iteration["step"])
        self._wall.append(iteration["wall_ms"])
        self._blocked.append(blocked)
        self._busy.append(iteration["wall_ms"] - blocked)
        for name, start, end in waits:
            self._blocked_by_op[name] = self._blocked_by_op.get(name, 0.0) + (end - start) * MS
        for op in ops:
            key = op_key(op[NAME], op[GROUP], op[NBYTES])
            agg = self._ops.get(key)
            if agg is None:
                agg = self._ops[key] = [0, 0, 0.0, [0] * (len(DURATION_BUCKETS_S) + 1), op[GROUP_SIZE]]
            ns = op[END] - op[START] if op[HOST] or self.elapsed_ns is None else self.elapsed_ns(op[START], op[END])
            seconds = ns * 1e-9
            agg[0] += 1
            agg[1] += op[NBYTES]
            agg[2] += seconds
            agg[3][bisect_left(DURATION_BUCKETS_S, seconds)] += 1
        return self.flush() if len(self._steps) >= self.window else None

    def flush(self) -> dict | None:
        """The window so far, as plain data (None when it holds no step); the next begins empty."""
        if not self._steps:
            return None
        n = len(self._steps)
        out = {"rank": self.rank, "host": self.host, "window": self.index, "first_step": self._steps[0],
               "last_step": self._steps[-1], "steps": n, "time": time.time(),
               "step_ms": statistics.median(self._wall), "busy_ms": statistics.median(self._busy),
               "blocked_ms": statistics.median(self._blocked),
               "busy_by_step_ms": self._busy, "blocked_by_step_ms": self._blocked,
               "blocked_by_op_ms": {k: v / n for k, v in sorted(self._blocked_by_op.items())},
               "ops": self._ops}
        self.index += 1
        self._reset()
        return out
