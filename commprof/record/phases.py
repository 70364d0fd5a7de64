"""The phase recorder: spans of one training iteration, and its split into compute and communication.

A strategy wraps each phase of an iteration in `phases.phase("forward")` (also "data", "backward", "step", …);
every phase is an NVTX range (domain `commprof`, category `compute`, `optimizer` for the step, `data` for the
input pipeline; record/annotate.py) and a pair of clock stamps. The comm spans come from the Comm op log
(issue → completion, one place), and the blocked spans from it too: a synchronous op blocks the training
thread for its whole duration, an async op only inside `Handle.wait()`.

Per iteration (docs/design.md's measurement model):
    compute  = |union of compute phases − blocked time|   (a blocking op inside a phase is not compute)
    comm     = |union of comm spans|
    overlap  = |compute ∩ comm|
    exposed  = |union of blocked spans of collectives|     (time the training thread waited on comm)
    bubble   = |union of blocked spans of send/recv|       (a pipeline stage idle on its neighbour)
    other    = wall − |data ∪ compute ∪ exposed ∪ bubble|  (host work in no phase: clipping, logging, …)
    overlap% = overlap / comm

A blocking point-to-point op cannot tell the neighbour's lateness from the transfer itself, so bubble
includes the (small) transfer of the activation; strategies without send/recv have no bubble. An async
op waited on while still in flight completes when the wait returns, as a blocking op does (comm/base.py,
Handle), so every blocked span lies inside its op's comm span: exposed ≤ comm, and data + compute +
exposed + bubble + other = wall, on every iteration (tests/invariants.py checks them).

Exercised by: `pytest tests/unit/test_breakdown.py tests/test_phases.py`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import NamedTuple

from commprof.base.measurement import ALIGNED, BUBBLE_P2P
from commprof.record import aligned as aligned_iterations
from commprof.record.annotate import ANNOTATOR, phase_category
from commprof.record.recorder import END, GROUP, HOST, NAME, START, restamped

COMPUTE = ("forward", "backward", "step", "recompute", "schedule")
"""Phases whose time is computation; "data" is timed and reported on its own. "schedule" is a library's
pipeline schedule running its micro-batches' forward and backward (torch-pipeline-*), send/recv inside it
blocked and so not computation."""


class Breakdown(NamedTuple):
    """One rank's iteration, in nanoseconds."""

    wall_ns: int
    data_ns: int
    compute_ns: int
    comm_ns: int
    overlap_ns: int
    exposed_comm_ns: int
    bubble_ns: int = 0
    comm_by_group_ns: dict | None = None
    """|union of comm spans| per group label ("world", "dp", "pp 0→1", "tp", …)."""
    schedule_ns: int = 0
    """First start to last end of forward/backward phases and send/recv: a pipeline's schedule."""
    other_ns: int = 0
    """What no other column holds: the host's own work between the phases (a batch fetched outside a data
    phase, gradient clipping, logging, a sleep) — wall minus the union of data, compute, exposed and bubble,
    so that the four and it sum to wall."""

    def figures(self) -> dict:
        """The iteration's figures in ms, as every command's per-iteration record holds them."""
        ms = 1e-6
        return {"wall_ms": self.wall_ns * ms, "data_ms": self.data_ns * ms, "compute_ms": self.compute_ns * ms,
                "comm_ms": self.comm_ns * ms, "exposed_comm_ms": self.exposed_comm_ns * ms,
                "overlap_ms": self.overlap_ns * ms, "bubble_ms": self.bubble_ns * ms,
                "other_ms": self.other_ns * ms, "schedule_ms": self.schedule_ns * ms,
                "comm_by_group_ms": {g: v * ms for g, v in (self.comm_by_group_ns or {}).items()}}


def union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged intervals. (These four run at every profiled step's end, over each of its ops and phases:
    loops without generators, merged lists walked once.)"""
    out: list[tuple[int, int]] = []
    for start, end in sorted([s for s in spans if s[1] > s[0]]):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def length(spans: list[tuple[int, int]]) -> int:
    return sum([b - a for a, b in spans])


def intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Intersection of two merged interval lists."""
    out, i, j, n, m = [], 0, 0, len(a), len(b)
    while i < n and j < m:
        (a0, a1), (b0, b1) = a[i], b[j]
        lo, hi = a0 if a0 > b0 else b0, a1 if a1 < b1 else b1
        if lo < hi:
            out.append((lo, hi))
        if a1 < b1:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Parts of merged intervals `a` outside merged intervals `b`."""
    out, j, m = [], 0, len(b)
    for start, end in a:
        while j < m and b[j][1] <= start:  # b's intervals over before this one starts are over for the rest
            j += 1
        cur, k = start, j
        while k < m and b[k][0] < end:
            lo, hi = b[k]
            if lo > cur:
                out.append((cur, lo))
            if hi > cur:
                cur = hi
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


def breakdown(*, start: int, end: int, phases: list[tuple[str, int, int]], ops: list[tuple],
              waits: list[tuple] | None) -> Breakdown:
    """Split one iteration [start, end] given its phases, comm op log entries and waits (all in ns).

    `waits` None (GPU): the training stream never blocks the host on comm, so exposed comm is the part
    of comm that no compute covers; blocking (stream-ordered) ops still do not count as compute."""
    comm = union([(op[START], op[END]) for op in ops])
    stream_blocked = [(op[NAME], op[START], op[END]) for op in ops if op[HOST] is False]
    blocked_all = stream_blocked + list(waits or ())
    blocked = union([(a, b) for _, a, b in blocked_all])
    bubble = union([(a, b) for name, a, b in blocked_all if name in BUBBLE_P2P])
    compute = subtract(union([(a, b) for name, a, b in phases if name in COMPUTE]), blocked)
    data = subtract(union([(a, b) for name, a, b in phases if name == "data"]), blocked)
    exposed = subtract(blocked, bubble) if waits is not None else subtract(subtract(comm, compute), bubble)
    edges = [(a, b) for name, a, b in phases if name in ("forward", "backward")]
    edges += [(op[START], op[END]) for op in ops if op[NAME] in BUBBLE_P2P]
    schedule = max(b for _, b in edges) - min(a for a, _ in edges) if edges else 0
    accounted = intersect(union([*data, *compute, *exposed, *bubble]), [(start, end)])
    groups = {}
    for label in sorted({op[GROUP] for op in ops}):
        groups[label] = length(union([(op[START], op[END]) for op in ops if op[GROUP] == label]))
    return Breakdown(wall_ns=end - start, data_ns=length(data), compute_ns=length(compute),
                     comm_ns=length(comm), overlap_ns=length(intersect(compute, comm)),
                     exposed_comm_ns=length(exposed), bubble_ns=length(bubble), comm_by_group_ns=groups,
                     schedule_ns=schedule, other_ns=max(0, end - start - length(accounted)))


class Span:
    """A phase being timed; `end` set inside the block overrides its end."""

    __slots__ = ("end",)

    def __init__(self) -> None:
        self.end = None


class Phases:
    """Records the phases of each iteration and splits it once the iteration has ended.

    CPU: host clock stamps. GPU (a CUDA clock): CUDA events on the current stream around every phase,
    read once at the end of the iteration by waiting on its last event — never a device-wide
    synchronize inside it — and turned into ns from the iteration's first event."""

    def __init__(self, recorder, clock=None) -> None:
        self.recorder = recorder
        """The Comm's OpRecorder: the op log and waits this iteration is split against."""
        self.use(clock)
        self.spans: list[tuple] = []
        self._start = None
        self.aligned = False
        """The open iteration is an aligned one."""
        self.ended_ns: int | None = None
        """perf_counter_ns at which the trace ended the last iteration's range (None without a trace)."""
        self._op_mark = 0
        self._wait_mark = 0

    def use(self, clock) -> None:
        """Stamp phases with `clock` when it is a CUDA clock (events on the current stream), else host ns."""
        self.cuda = clock is not None and clock.kind == "cuda"
        self.now = clock.now if self.cuda else time.perf_counter_ns
        """A stamp of this iteration's clock: a CUDA event on the current stream, or host ns."""

    @contextmanager
    def phase(self, name: str):
        """Time `name` and wrap it in an NVTX range. Yields the span: setting its `end` (a stamp of this
        clock) ends the phase there rather than at the block's end (backward stops where autograd did)."""
        ANNOTATOR.push(ANNOTATOR.label(name, phase_category(name)))
        span = Span()
        start = self.now()
        try:
            yield span
        finally:
            self.spans.append((name, start, span.end if span.end is not None else self.now()))
            ANNOTATOR.pop()

    def begin(self, index: int, *, aligned: bool = False) -> None:
        """Start iteration `index` (an NVTX range of category `iteration` around all of it); `aligned`: with
        every collective's parties met first (record/aligned.py), until `end`."""
        self.spans = []
        self._op_mark = len(self.recorder.ops)
        self._wait_mark = len(self.recorder.waits)
        self._op_end: int | None = None
        self._wait_end: int | None = None
        self.aligned = aligned
        if aligned:
            aligned_iterations.start(self.recorder)
        ANNOTATOR.push(ANNOTATOR.label(f"iteration {index}{ALIGNED if aligned else ''}", "iteration", cached=False))
        self._start = self.now()

    def end(self) -> Breakdown:
        """End the iteration; every async op must have completed (its Handle waited on)."""
        end = self.now()
        self.ended_ns = ANNOTATOR.pop()
        if self.aligned:
            aligned_iterations.stop(self.recorder)
            self.aligned = False
        # what end() reads is the iteration's, however many ops complete later on a backend's thread
        self._op_end, self._wait_end = len(self.recorder.ops), len(self.recorder.waits)
        ops = self.recorder.ops[self._op_mark:self._op_end]
        if not self.cuda:
            waits = self.recorder.waits[self._wait_mark:self._wait_end]
            return breakdown(start=self._start, end=end, phases=self.spans, ops=ops, waits=waits)
        end.synchronize()  # this iteration's last event: everything before it on the stream is done
        first = self._start

        def ns(event) -> int:
            return round(first.elapsed_time(event) * 1e6)

        spans = [(name, ns(a), ns(b)) for name, a, b in self.spans]
        for op in ops:  # an op's end may be on a stream of its own (Handle.complete_on_stream), not before `end`
            if not op[END].query():
                op[END].synchronize()
        ops = [restamped(op, ns(op[START]), ns(op[END]), None if op[HOST] is None else False) for op in ops]
        return breakdown(start=0, end=ns(end), phases=spans, ops=ops, waits=None)

    def ops(self) -> list[tuple]:
        """The comm ops logged since the iteration began, up to its end once it has ended."""
        return self.recorder.ops[self._op_mark:self._op_end]

    def waits(self) -> list[tuple]:
        """The ended iteration's waits: (name, start, end) while the training thread was blocked on an op."""
        return self.recorder.waits[self._wait_mark:self._wait_end]

    def read(self) -> tuple[int, int, int]:
        """Where the ended iteration's ops begin and end in the log, and how many of its waits the log held
        at its end (with those before it): entries before the first are of no iteration, and recorder.drop
        removes what was read."""
        return self._op_mark, self._op_end, self._wait_end
