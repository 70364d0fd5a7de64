"""The measured step with one cause taken away: every iteration replayed (predict/replay.py, at the measured
rank count) once as measured and once edited, each op costing the transfer time it took once all its
parties were there, and each rank starting when it started (the replay's ranks otherwise start together).
Per iteration, the step without the cause is the measured step less what the edit saved in the replay; the
figure is the median over iterations. Taking the difference keeps what the replay does not model (the
runtime's own overheads) out of the answer.

    commprof profile --nproc 2 --trace t/ --json p.json -- train.py     (each finding's "step_ms_without")

Exercised by: `pytest tests/test_findings.py`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from commprof.findings.arrivals import Analysis, median
from commprof.predict.replay import replay
from commprof.predict.timeline import Measured, Op, Program

Edit = Callable[[tuple[Program, ...]], tuple[Program, ...]]


def measured_costs(analysis: Analysis) -> Callable[[Op], float]:
    """Each op's cost in the replay: its transfer after the last arrival (its measured span when unmatched)."""
    took = {a.op.key: a.transfer_ms for a in analysis.arrivals}
    return lambda op: took.get(op.key, op.measured_ms)


def step_without(m: Measured, analysis: Analysis, *, edit: Edit | None = None,
                 cost: Callable[[Op], float] | None = None) -> float:
    """The measured step less what `edit` (of each iteration's programs) and `cost` (of each op) save."""
    base_cost = measured_costs(analysis)
    out = []
    for programs in m.iterations:
        base = replay(_started(programs), base_cost)[0]
        edited = replay(_started(edit(programs) if edit else programs), cost or base_cost)[0]
        out.append(max(p.wall_ms for p in programs) - (base - edited))
    return max(0.0, median(out))


def _started(programs: tuple[Program, ...]) -> tuple[Program, ...]:
    """Each rank's program from the first rank's start: a rank that began later waits that long first."""
    first = min(p.start_us for p in programs)
    return tuple(replace(p, steps=(("busy", (p.start_us - first) / 1e3), *p.steps)) for p in programs)


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
