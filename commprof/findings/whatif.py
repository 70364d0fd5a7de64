"""The measured step with one cause taken away: every iteration replayed (perfmodel/replay.py, at the measured
rank count) once as measured and once edited, each op costing the transfer time it took once all its parties
were there, and each rank starting when it started (the replay's ranks otherwise start together). Per
iteration, the step without the cause is the measured step less what the edit saved in the replay (never less
than nothing); the figure is the median over iterations, so never above the measured step (the median over the
same iterations of the slowest rank's wall, the findings' "step"). Taking the difference keeps what the replay
does not model (the runtime's own overheads) out of the answer. Without a straggler, the ops it made late cost
what the same ops took where their parties met together (aligned_costs): in the measured iterations, or in the
aligned warm-up iterations (record/aligned.py), which a rank late at every step leaves as the only ones; where
none did, the step without is a lower bound.

    commprof profile --nproc 2 --trace t/ --json p.json -- train.py     (each finding's "step_ms_without")

Exercised by: `pytest tests/unit/test_whatif.py tests/test_findings.py`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from commprof.findings.arrivals import Analysis, median
from commprof.perfmodel.replay import replay
from commprof.perfmodel.timeline import RECVS, SENDS, Measured, Op, Program

Edit = Callable[[tuple[Program, ...]], tuple[Program, ...]]


def measured_costs(analysis: Analysis) -> Callable[[Op], float]:
    """Each op's cost in the replay: its transfer after the last arrival (its measured span when unmatched)."""
    took = {a.op.key: a.transfer_ms for a in analysis.arrivals}
    return lambda op: took.get(op.key, op.measured_ms)


MESSAGES = (SENDS, RECVS)
"""Point-to-point messages cost what they took, late or not: a receiver waiting for a late sender takes the
whole message once it is sent (the transfer after the last issue is all of it), and a late receiver finds the
bytes in its socket, as it would have found them had it come on time. Aligned iterations leave messages alone
(record/aligned.py), and a message's instances that met together are no better price: an irecv posted
ahead completes when its bytes come, long after both issues (a pipeline's stage posts every micro-batch's)."""
ALIGNED = 0.25
"""An op's parties met together when its arrival spread is at most this share of its transfer."""
MIN_MET = 2
"""The fewest instances of an op whose parties met together that price it: one alone is a lottery here (the
same 1 MiB all-reduce, aligned, took 1.2 to 6.6 ms from one iteration to the next on 2 shared cores)."""


def _late(analysis: Analysis, late: int) -> tuple[dict, list]:
    """({(name, group label, bytes): transfers of that op's instances whose parties met together, in the
    measured iterations and the aligned ones, where at least MIN_MET did}, the arrivals `late` came last at,
    beyond ALIGNED of their transfer)."""
    met: dict[tuple, list[float]] = {}
    for a in analysis.arrivals + analysis.aligned:
        if a.spread_ms <= ALIGNED * a.transfer_ms:
            met.setdefault((a.op.name, a.op.label, a.op.nbytes), []).append(a.transfer_ms)
    met = {op: took for op, took in met.items() if len(took) >= MIN_MET}
    return met, [a for a in analysis.arrivals
                 if a.last == late and a.spread_ms > ALIGNED * a.transfer_ms and a.op.name not in MESSAGES]


def priced_aligned(analysis: Analysis, late: int) -> float:
    """The share of the ops `late` made late that aligned_costs can price (1.0 when there are none): below
    1, the step without `late` is a lower bound."""
    met, made_late = _late(analysis, late)
    if not made_late:
        return 1.0
    return sum((a.op.name, a.op.label, a.op.nbytes) in met for a in made_late) / len(made_late)


def aligned_costs(analysis: Analysis, late: int) -> Callable[[Op], float]:
    """Costs with `late`'s lateness gone: an op it arrived last at, by more than ALIGNED of the transfer,
    costs what the same op (name, group, bytes) took in the instances whose parties met together (MIN_MET or
    more) — the median, and never less than it took itself. Where a party is late the others' bytes are
    already on their way when it arrives (a socket's buffer holds megabytes), so its transfer after the last
    arrival is short of what the op takes aligned: measured at 2 gloo ranks, 2.6 against 3.2 ms for 1 MiB.
    An op that met aligned too seldom keeps its own (the step without is then a lower bound)."""
    out = {a.op.key: a.transfer_ms for a in analysis.arrivals}
    met, made_late = _late(analysis, late)
    for a in made_late:
        aligned = met.get((a.op.name, a.op.label, a.op.nbytes))
        if aligned:
            out[a.op.key] = max(a.transfer_ms, median(aligned))
    return lambda op: out.get(op.key, op.measured_ms)


REPLAYED = 25
"""The most iterations a what-if replays (twice each: as measured and edited): the median of 25 evenly spaced
iterations stands for a long job's, and the replay, every rank's program op by op, costs a job's end at 4,096
ranks about as much as reading its traces."""


def spaced(items: tuple, most: int) -> tuple:
    """`items`, or `most` of them evenly spaced, the first and the last among them."""
    if len(items) <= most:
        return items
    return tuple(items[round(k * (len(items) - 1) / (most - 1))] for k in range(most))


def without_straggler(m: Measured, analysis: Analysis, rank: int) -> float:
    """The step with `rank`'s own time set to the others' and the ops it made late costing theirs aligned."""
    return step_without(m, analysis, edit=busy_as_median(rank), cost=aligned_costs(analysis, rank))


def step_without(m: Measured, analysis: Analysis, *, edit: Edit | None = None,
                 cost: Callable[[Op], float] | None = None) -> float:
    """The measured step (Measured.measured_wall_ms) less what `edit` (of each iteration's programs) and
    `cost` (of each op) save: their median saving over the iterations, or over REPLAYED of them evenly spaced
    in a longer job."""
    base_cost = measured_costs(analysis)
    cost = cost or base_cost
    saved = []
    for programs in spaced(m.iterations, REPLAYED):
        lags = _lags(programs)
        base = replay(_as_measured(programs, lags, base_cost), base_cost)[0]
        edited = replay(_as_measured(edit(programs) if edit else programs, lags, cost), cost)[0]
        # a cause taken away never lengthens an iteration: an edited replay that ends later (an op priced as
        # it took aligned costing more than it took late) saves nothing there
        saved.append(max(0.0, base - edited))
    # the step less the median saving: a finding's cost is then exactly the step less its step without
    return max(0.0, m.measured_wall_ms - median(saved))


def _lags(programs: tuple[Program, ...]) -> dict[tuple, float]:
    """{(op key, rank): ms}: how much longer the rank stayed blocked on the op than the replay keeps it, which
    ends an op on every party at once, at the earliest completion: the rank's own completion less the later
    of that and the start of its block (its thread resumes after its own completion, as measured)."""
    ends: dict[tuple, dict[int, float]] = {}
    for p in programs:
        for _, end, op in p.spans:
            ends.setdefault(op.key, {})[p.rank] = end
    first = {key: min(by_rank.values()) for key, by_rank in ends.items()}  # once an op, not once a block
    out = {}
    for p in programs:
        for op, blocked, _ in p.blocks:
            by_rank = ends.get(op.key, {})
            if p.rank in by_rank:
                lag = (by_rank[p.rank] - max(blocked, first[op.key])) / 1e3
                out[(op.key, p.rank)] = max(out.get((op.key, p.rank), 0.0), lag)
    return out


def _as_measured(programs: tuple[Program, ...], lags: dict, cost: Callable[[Op], float]) -> tuple[Program, ...]:
    """Each rank's program from the first rank's start (a rank that began later waits that long first), each
    wait on an op that still costs something followed by the rank's lag on it."""
    first = min(p.start_us for p in programs)

    def after(s, rank: int):
        if s[0] != "wait" or cost(s[1]) <= 0:
            return s
        return ("wait", s[1], s[2] + lags.get((s[1].key, rank), 0.0))
    return tuple(replace(p, steps=(("busy", (p.start_us - first) / 1e3), *(after(s, p.rank) for s in p.steps)))
                 for p in programs)


def busy_as_median(rank: int) -> Edit:
    """`rank`'s own time set to the other ranks': step by step when the programs have the same shape (the
    same busy stretches between the same ops), else scaled to the others' median total."""
    def edit(programs: tuple[Program, ...]) -> tuple[Program, ...]:
        mine = programs[rank]
        others = [p for p in programs if p.rank != rank]
        if not others:
            return programs
        shape = [s[0] for s in mine.steps]
        if all([s[0] for s in p.steps] == shape for p in others):
            steps = tuple(("busy", median(p.steps[i][1] for p in others)) if s[0] == "busy" else s
                          for i, s in enumerate(mine.steps))
        else:
            total = sum(s[1] for s in mine.steps if s[0] == "busy")
            want = median(sum(s[1] for s in p.steps if s[0] == "busy") for p in others)
            scale = want / total if total else 1.0
            steps = tuple(("busy", s[1] * scale) if s[0] == "busy" else s for s in mine.steps)
        return tuple(replace(p, steps=steps) if p.rank == rank else p for p in programs)
    return edit


def op_free(signature: tuple, analysis: Analysis) -> Callable[[Op], float]:
    """Costs with every op of `signature` (name, group label, bytes) free."""
    base = measured_costs(analysis)
    return lambda op: 0.0 if (op.name, op.label, op.nbytes) == signature else base(op)


def back_to_back(m: Measured, groups: dict[tuple, tuple], max_gap_ms: float) -> dict[tuple, tuple]:
    """`groups` ({op key: group}) cut into runs an iteration could fuse: ops of a group issued with at most
    `max_gap_ms` of any rank's own (busy) time since the group's previous op. Ops apart by compute (FSDP's
    gathers, a layer apart) stay apart: a fused op would be issued at the last and waited on at the first.
    {op key: group + (run,)}, the same on every rank."""
    gap: dict[tuple, float] = {}
    for programs in m.iterations:
        for p in programs:
            since: dict[tuple, float] = {}
            for s in p.steps:
                if s[0] == "busy":
                    since = {g: t + s[1] for g, t in since.items()}
                elif s[0] == "issue" and s[1].key in groups:
                    g = groups[s[1].key]
                    gap[s[1].key] = max(gap.get(s[1].key, 0.0), since.get(g, float("inf")))
                    since[g] = 0.0
    runs: dict[tuple, tuple] = {}
    count: dict[tuple, int] = {}
    for key in sorted(gap, key=lambda k: k[-1]):  # a group's ops in issue order (its keys count them)
        g = groups[key]
        if gap[key] > max_gap_ms or g not in count:
            count[g] = count.get(g, -1) + 1
        runs[key] = (*g, count[g])
    return runs


def fused(groups: dict[tuple, tuple], model: Callable[[Op], float],
          base: Callable[[Op], float]) -> tuple[Edit, Callable[[Op], float]]:
    """The ops of `groups` ({op key: its fusion group}) fused, each group's in an iteration into one op of
    their summed bytes: issued where the group's last was issued, waited on where that one was waited on,
    costing what `model` (the α–β fit) gives its size, or their measured costs (`base`) if less. Every other
    op and all busy time stay, so the sync points the small ops made go with them. (edit, cost) for
    step_without."""
    cost: dict[tuple, float] = {}

    def edit(programs: tuple[Program, ...]) -> tuple[Program, ...]:
        return tuple(replace(p, steps=_fuse(p.steps, groups, model, base, cost)) for p in programs)

    return edit, lambda op: cost[op.key] if op.key in cost else base(op)


def _fuse(steps: tuple, groups: dict, model, base, cost: dict) -> tuple:
    members: dict[tuple, list[Op]] = {}
    for s in steps:
        if s[0] == "issue" and s[1].key in groups:
            members.setdefault(groups[s[1].key], []).append(s[1])
    one = {}  # the group's last op's key -> the fused op standing for the group
    for group, ops in members.items():
        last = ops[-1]
        op = replace(last, key=("fused", *group, last.key), nbytes=sum(o.nbytes for o in ops),
                     measured_ms=sum(o.measured_ms for o in ops))
        one[last.key] = op
        cost[op.key] = min(model(op), sum(base(o) for o in ops))
    out = []
    for s in steps:
        if s[0] == "busy" or s[1].key not in groups:
            out.append(s)
        elif s[1].key in one:
            out.append((s[0], one[s[1].key], *s[2:]))
    return tuple(out)
