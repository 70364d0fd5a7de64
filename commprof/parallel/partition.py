"""Cutting a model's layer chain into pipeline stages: by parameter count, by measured time, or by hand.

    commprof run --strategy pipeline-gpipe --model gpt2 --pp 4 --balance time
    commprof run --strategy pipeline-1f1b --model mnist-cnn --pp 2 --cuts 2

A partition is the list of each stage's first layer index (stage s runs layers[starts[s]:starts[s+1]]).
Balancing picks the contiguous split that minimises the most expensive stage, since a pipeline runs at
the pace of its slowest stage. Exercised by: `pytest tests/unit/test_partition_schedule.py -k partition`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from commprof.base.errors import UsageError

if TYPE_CHECKING:
    import torch

BALANCE = ("params", "time")
"""What `--balance` may equalise across stages."""


def balanced_starts(costs: list[float], stages: int) -> list[int]:
    """First layer of each stage for the contiguous split of `costs` whose largest stage sum is least
    (ties: the earliest cut), every stage at least one layer."""
    n = len(costs)
    if stages > n:
        raise UsageError(f"--stages {stages} is more stages than the {n} layers the model can be cut into")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[s][i]: least max-stage cost of layers[:i] cut into s stages; cut[s][i]: where stage s starts.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(s - 1, i):
                value = max(best[s - 1][j], prefix[i] - prefix[j])
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    starts, i = [], n
    for s in range(stages, 0, -1):
        i = cut[s][i]
        starts.append(i)
    return starts[::-1]


def explicit_starts(cuts: tuple[int, ...], stages: int, n_layers: int) -> list[int]:
    """--cuts: the first layer of stages 1…p−1, strictly increasing inside (0, n_layers)."""
    if len(cuts) != stages - 1:
        raise UsageError(f"--cuts gives {len(cuts)} cut point(s); {stages} stages need {stages - 1}")
    starts = [0, *cuts]
    if any(b <= a for a, b in zip(starts, starts[1:])) or starts[-1] >= n_layers:
        raise UsageError(f"--cuts {','.join(map(str, cuts))} must increase strictly within 1…{n_layers - 1} "
                         f"(the model has {n_layers} layers)")
    return starts


def param_costs(layers) -> list[float]:
    """Trainable parameter elements per layer (a frozen layer counts 1, so it still gets a place)."""
    return [max(1, sum(p.numel() for p in layer.parameters() if p.requires_grad)) for layer in layers]


def time_costs(model: torch.nn.Module, layers, x: torch.Tensor, *, repeats: int = 3) -> list[float]:
    """Seconds of forward + backward per layer on input `x` (best of `repeats`). The model's buffers
    (BatchNorm running statistics) and gradients are left as they were."""
    import torch  # here, not at the top: the launcher checks --balance without loading torch

    saved = {name: b.clone() for name, b in model.named_buffers()}
    costs, h = [], x
    for layer in layers:
        best = float("inf")
        for _ in range(repeats):
            inp = h.detach().requires_grad_(h.is_floating_point())
            start = time.perf_counter()
            out = layer(inp)
            if out.requires_grad:
                out.float().sum().backward()
            best = min(best, time.perf_counter() - start)
        costs.append(best)
        h = out.detach()
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(saved[name])
    model.zero_grad(set_to_none=True)
    return costs


def describe(starts: list[int], n_layers: int) -> list[list[int]]:
    """[first, last] layer index of each stage."""
    ends = [*starts[1:], n_layers]
    return [[a, b - 1] for a, b in zip(starts, ends)]
