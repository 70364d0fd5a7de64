"""A pipeline over stages of known duration, measured as `commprof run` measures any step: the check
that the bubble it reports is the bubble there is.

    fractions = calibrated_bubble(comm, "pipeline-gpipe", micro_batches=8, fwd_ms=20, bwd_ms=40)

Every rank of `comm` is one stage of `commprof.models.calibrated`'s chain (one layer each); each step
runs under a real Phases and returns this stage's bubble / schedule. Used by tests/bubble_worker.py
and benchmarks/bubble.py.
"""

from __future__ import annotations

import torch

from commprof.models.calibrated import calibrated_chain
from commprof.record.phases import Phases
from commprof.run.config import RunConfig
from commprof.strategies import CATALOG


def calibrated_bubble(comm, schedule: str, *, micro_batches: int, fwd_ms: float, bwd_ms: float,
                      steps: int = 5, warmup: int = 2, last_stage_layers: int = 1) -> list[dict]:
    """Per measured step on this rank: bubble_ms, schedule_ms and their ratio. Every stage holds one layer,
    the last `last_stage_layers` (more: stages of unequal work, whose bubble exceeds the schedule's own)."""
    p, m = comm.world_size, micro_batches
    spec = calibrated_chain(p - 1 + last_stage_layers, fwd_ms=fwd_ms, bwd_ms=bwd_ms)
    cfg = RunConfig(strategy=schedule, model="(calibrated)", backend=comm.backend, micro_batches=m,
                    cuts=tuple(range(1, p)), batch_size=m, lr=0.0)
    strategy = CATALOG[schedule].load()(spec=spec, comm=comm, config=cfg)
    phases = Phases(comm.recorder, comm.recorder.clock)
    x, y = torch.ones(m, 2), torch.zeros(m, dtype=torch.long)
    out = []
    for t in range(warmup + steps):
        phases.begin(t)
        strategy.train_step([(x[i:i + 1], y[i:i + 1]) for i in range(m)], phases)
        split = phases.end()
        comm.recorder.clear()
        if t >= warmup:
            out.append({"bubble_ms": split.bubble_ns / 1e6, "schedule_ms": split.schedule_ns / 1e6,
                        "fraction": split.bubble_ns / split.schedule_ns})
    return out
