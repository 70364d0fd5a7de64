"""Each op matched across the ranks that take part in it and split by cause: who arrived last, how long
the others' training threads waited for it, and the transfer after it arrived — per rank, per step.

For one op (the same key on every party: perfmodel/timeline.py) with issue stamps on the trace's clock (rank
0's; every rank's file is aligned to it when recorded), A = the latest issue and `last` the party that made
it. Only the time a rank's training thread was blocked counts: an async op whose peer is late while this
rank computes costs it nothing. Each instant of a blocked interval is

    waiting for peers   while an op this rank has in flight is not yet issued by all of its parties
                        (charged to that op's `last`; of several such ops, the one arriving latest)
    transfer            otherwise (charged to the op of this rank's in flight that completes next)

so a thread blocked on several ops at once (DDP's reducer waiting on every bucket) is counted once. The
op's own transfer time (for its bandwidth) runs from A to the earliest completion among its parties.

    commprof profile --nproc 2 --trace t/ --json p.json -- train.py

Exercised by: `pytest tests/unit/test_findings_recorded.py tests/test_findings.py`.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from commprof.perfmodel.timeline import RECVS, SENDS, Measured, Op


@dataclass(frozen=True)
class Arrival:
    """One op as its parties met it."""

    op: Op
    """Its key, name, group label and payload (any party's record: they agree)."""
    parties: tuple[int, ...]
    """The ranks that take part: the group, or a message's sender and receiver."""
    last: int
    """The party that issued it last: the one the others waited for."""
    spread_ms: float
    """Last issue − first issue."""
    transfer_ms: float
    """From the last issue to the earliest completion: what the op took once every party was there."""


@dataclass(frozen=True)
class RankSplit:
    """One rank's step: one iteration's, or the median of each figure over the measured iterations (which
    keeps a hiccup, or a last iteration that runs into the script's teardown, out of the figures)."""

    rank: int
    wall_ms: float
    busy_ms: float
    """Its training thread's own time: compute, data, optimizer, Python (not blocked on an op)."""
    blocked_ms: float
    """Exposed communication: its training thread blocked on ops."""
    waiting_ms: dict
    """{rank waited for: ms} of blocked_ms spent before that rank arrived."""
    transfer_ms: float
    """The rest of blocked_ms: after every party had arrived."""


@dataclass(frozen=True)
class Analysis:
    """A measured job's ops matched across ranks and its ranks' steps split by cause."""

    iterations: int
    step_ms: float
    """The measured step: the median over iterations of the slowest rank's wall."""
    arrivals: tuple[Arrival, ...]
    """Every op seen on all of its parties, in the measured iterations."""
    per_iteration: tuple[tuple[RankSplit, ...], ...]
    """Each iteration's split, rank by rank."""
    ranks: tuple[RankSplit, ...]
    """Each rank's median split."""
    exposed_by_op: dict
    """{(op name, group label, bytes): transfer ms a step (the mean over iterations and ranks) of blocked time}."""
    aligned: tuple[Arrival, ...] = ()
    """Every op of the aligned iterations (record/aligned.py) seen on all of its parties."""


def parties(op: Op) -> tuple[int, ...]:
    """Who takes part: a message's sender and receiver, else the group's members."""
    return tuple(op.key[2:4]) if op.name in (SENDS, RECVS) and len(op.members) == 2 else op.members


def analyze(m: Measured) -> Analysis:
    arrivals: list[Arrival] = []
    exposed: dict[tuple, float] = defaultdict(float)
    per_iteration = []
    for programs in m.iterations:
        met = _met(programs)
        arrivals += [a for a, _ in met.values()]
        per_iteration.append(tuple(_split(p, met, exposed) for p in programs))
    size = len(m.iterations[0])
    ranks = tuple(RankSplit(
        rank=r, **{f: median(getattr(it[r], f) for it in per_iteration)
                   for f in ("wall_ms", "busy_ms", "blocked_ms", "transfer_ms")},
        waiting_ms={k: median(it[r].waiting_ms.get(k, 0.0) for it in per_iteration)
                    for k in sorted({k for it in per_iteration for k in it[r].waiting_ms})})
        for r in range(size))
    n = len(m.iterations)
    return Analysis(iterations=n, step_ms=m.measured_wall_ms, arrivals=tuple(arrivals),
                    per_iteration=tuple(per_iteration), ranks=ranks,
                    exposed_by_op={k: v / n / size for k, v in exposed.items()},
                    aligned=tuple(a for programs in m.aligned for a, _ in _met(programs).values()))


def blocked_by_cause(m: Measured, ranks: set | None = None):
    """Every blocked stretch of every rank's training thread (of `ranks` only, when given), cut by cause, on
    the trace's clock: (rank, from µs, to µs, the rank waited for or None for transfer, the op it is charged
    to)."""
    for programs in m.iterations:
        met = _met(programs)
        for p in programs:
            if ranks is not None and p.rank not in ranks:
                continue
            for op, b0, b1 in p.blocks:
                for t0, t1, who, on in _segments(p.spans, met, op, b0, b1):
                    yield p.rank, t0, t1, who, on


def _split(p, met: dict, exposed: dict) -> RankSplit:
    """One rank's iteration split by cause; adds its exposed transfer per op signature to `exposed`."""
    blocked = transfer = 0.0
    waiting: dict[int, float] = defaultdict(float)
    for op, b0, b1 in p.blocks:
        blocked += (b1 - b0) / 1e3
        for t0, t1, who, on in _segments(p.spans, met, op, b0, b1):
            if who is None:
                transfer += (t1 - t0) / 1e3
                exposed[(on.name, on.label, on.nbytes)] += (t1 - t0) / 1e3
            else:
                waiting[who] += (t1 - t0) / 1e3
    return RankSplit(rank=p.rank, wall_ms=p.wall_ms, busy_ms=sum(s[1] for s in p.steps if s[0] == "busy"),
                     blocked_ms=blocked, waiting_ms=dict(sorted(waiting.items())), transfer_ms=transfer)


def _segments(spans, met, op: Op, b0: float, b1: float):
    """The blocked interval [b0, b1] cut where its cause changes: (from, to, rank waited for or None, the op
    it is charged to), in µs."""
    pending, flying = [], []  # (from, to, A, last) of ops waiting for a party; (issue, end, Op) in flight
    for start, end, other in spans:
        if start > b1 or end < b0:
            continue
        flying.append((start, end, other))
        found = met.get(other.key)
        if found is not None and found[1] > b0:
            pending.append((max(b0, start), min(b1, end, found[1]), found[1], found[0].last))
    cuts = sorted({b0, b1, *(x for p in pending for x in p[:2] if b0 < x < b1)})
    for t0, t1 in zip(cuts, cuts[1:]):
        waits = [p for p in pending if p[0] <= t0 and t1 <= p[1]]
        if waits:
            yield t0, t1, max(waits, key=lambda p: p[2])[3], None
        else:
            going = [f for f in flying if f[0] <= t0 and t1 <= f[1]]
            yield t0, t1, None, min(going, key=lambda f: f[1])[2] if going else op


def _met(programs) -> dict[tuple, tuple[Arrival, float]]:
    """{op key: (its Arrival, the last issue in µs)} for the ops of one iteration seen on all their parties."""
    seen: dict[tuple, dict[int, tuple[float, float, Op]]] = defaultdict(dict)
    for p in programs:
        for start, end, op in p.spans:
            seen[op.key][p.rank] = (start, end, op)
    out = {}
    for key, by_rank in seen.items():
        op = next(iter(by_rank.values()))[2]
        who = parties(op)
        if len(who) < 2 or any(r not in by_rank for r in who):
            continue
        issues = {r: by_rank[r][0] for r in who}
        last = max(who, key=lambda r: (issues[r], r))
        first_end = min(by_rank[r][1] for r in who)
        out[key] = (Arrival(op=op, parties=who, last=last, spread_ms=(issues[last] - min(issues.values())) / 1e3,
                            transfer_ms=max(0.0, first_end - issues[last]) / 1e3), issues[last])
    return out


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0
