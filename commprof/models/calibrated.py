"""A network of known timing: layers that take exactly `fwd_ms` forward and `bwd_ms` backward per call.

    spec = calibrated_chain(4, fwd_ms=20, bwd_ms=40)   # 4 layers, one trainable scalar each

What the measurement of a pipeline is checked against: with p equal stages and m micro-batches each
stage idles (p − 1)(fwd + bwd) per step, the bubble fraction (p − 1)/(m + p − 1). The layers sleep
rather than spin, so a stage's compute takes its time however many ranks share the cores.
Used by tests/bubble_worker.py and benchmarks/bubble.py.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from commprof.models.spec import ModelSpec


class _Sleep(torch.autograd.Function):
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
    """y = w · x with one trainable scalar w; forward takes `fwd_ms`, backward `bwd_ms`."""

    def __init__(self, fwd_ms: float, bwd_ms: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1))
        self.fwd_s, self.bwd_s = fwd_ms / 1e3, bwd_ms / 1e3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Sleep.apply(x, self.weight, self.fwd_s, self.bwd_s)


def calibrated_chain(n_layers: int, *, fwd_ms: float, bwd_ms: float) -> ModelSpec:
    """`n_layers` SleepLayers on [B, features] inputs; the output doubles as class logits."""
    layers = tuple(SleepLayer(fwd_ms, bwd_ms) for _ in range(n_layers))
    net = nn.Sequential(*layers)
    return ModelSpec(module=net, task="classify", units=layers, kind="image", layers=layers)
