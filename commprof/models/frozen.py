"""A fixed feature extractor with a trained classifier on top, as in the DataParallel studies.

The backbone (a torchvision model's feature stages, random weights) never trains: its parameters have
requires_grad False and it stays in eval mode whatever `.train()` is called with, so BatchNorm uses
its running statistics and a data-parallel run computes exactly what one process does. The head is
Linear(feat, 4096), ReLU, Linear(4096, 4096), ReLU, Linear(4096, classes) — the studies' classifier,
without its dropout. Exercised by: `pytest tests/unit/test_models.py -k frozen`.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

HEAD_WIDTH = 4096
"""Width of the head's two hidden layers."""


class FrozenBackbone(nn.Module):
    """Wraps a feature extractor so that it never trains and never leaves eval mode."""

    def __init__(self, features: nn.Module) -> None:
        super().__init__()
        self.features = features
        self.requires_grad_(False)
        self.train(False)

    def train(self, mode: bool = True) -> FrozenBackbone:
        # Batch statistics would differ between one process and N ranks; running stats do not.
        return super().train(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


def fixed_feature_classifier(features: nn.Module, *, feat_dim: int, num_classes: int,
                             width: int = HEAD_WIDTH) -> tuple[nn.Sequential, tuple[nn.Module, ...]]:
    """`features` ([B, ...] → [B, feat_dim]) frozen, under a trainable 3-layer head.

    Returns the network and its FSDP units: (backbone, fc1, fc2, fc3).
    """
    backbone = FrozenBackbone(features)
    fc1, fc2, fc3 = nn.Linear(feat_dim, width), nn.Linear(width, width), nn.Linear(width, num_classes)
    # Not in-place: a unit's output must stay untouched for hooks that strategies put on it.
    net = nn.Sequential(OrderedDict(backbone=backbone, fc1=fc1, relu1=nn.ReLU(), fc2=fc2,
                                    relu2=nn.ReLU(), fc3=fc3))
    return net, (backbone, fc1, fc2, fc3)
