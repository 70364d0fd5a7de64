"""One rank of the calibrated pipeline: p stages whose forward sleeps F ms and backward B ms per
micro-batch, so the ideal GPipe/1F1B bubble is exactly (p − 1) / (m + p − 1). Rank 0 prints, per
micro-batch count, each stage's measured bubble fraction (median over steps) next to that prediction.

    python tests/bubble_worker.py '{"schedule": "pipeline-gpipe", "micro_batches": [4, 8]}'

Started by tests/test_pipeline.py as 4 real gloo processes. Sleeping rather than spinning keeps
4 ranks on 2 cores honest: a stage's compute takes its time whatever the others do.
"""

import json
import sys
import time

import numpy as np
import torch
from torch import nn

from commprof.comm import init_comm
from commprof.models import ModelSpec
from commprof.profile.phases import Phases
from commprof.run.config import RunConfig
from commprof.strategies import STRATEGIES
from commprof.world import discover


class Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, fwd_s, bwd_s):
        ctx.bwd_s = bwd_s
        time.sleep(fwd_s)
        return x * weight

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.bwd_s)
        return grad, grad.sum().reshape(1), None, None


class SleepLayer(nn.Module):
    """A layer of known duration: forward `fwd_ms`, backward `bwd_ms`, one trainable scalar."""

    def __init__(self, fwd_ms: float, bwd_ms: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1))
        self.fwd_s, self.bwd_s = fwd_ms / 1e3, bwd_ms / 1e3

    def forward(self, x):
        return Sleep.apply(x, self.weight, self.fwd_s, self.bwd_s)


def main(spec: dict) -> int:
    comm = init_comm(discover(), backend="gloo", timeout_s=120)
    p = comm.world_size
    fwd, bwd, steps, warmup = spec.get("fwd_ms", 20), spec.get("bwd_ms", 40), spec.get("steps", 5), 2
    for m in spec["micro_batches"]:
        layers = tuple(SleepLayer(fwd, bwd) for _ in range(p))
        net = nn.Sequential(*layers, nn.Flatten(1))
        model = ModelSpec(module=net, task="classify", units=layers, kind="image", layers=(*layers, net[-1]))
        cfg = RunConfig(strategy=spec["schedule"], model="(calibrated)", backend="gloo", micro_batches=m,
                        cuts=tuple(range(1, p)), batch_size=m, lr=0.0)
        strategy = STRATEGIES[cfg.strategy](spec=model, comm=comm, config=cfg)
        phases = Phases(comm.recorder, comm.recorder.clock)
        x, y = torch.ones(m, 2), torch.zeros(m, dtype=torch.long)
        fractions = []
        for t in range(steps + warmup):
            phases.begin(t)
            strategy.train_step([(x[i:i + 1], y[i:i + 1]) for i in range(m)], phases)
            split = phases.end()
            comm.recorder.clear()
            if t >= warmup:
                fractions.append(split.bubble_ns / split.schedule_ns)
        every = comm.gather_object(float(np.median(fractions)), dst=0)
        if comm.rank == 0:
            print(json.dumps({"micro_batches": m, "stages": p, "measured": every,
                              "predicted": (p - 1) / (m + p - 1)}), flush=True)
    comm.control_barrier()
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
