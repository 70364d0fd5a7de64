"""The classic PyTorch MNIST example network (21,840 parameters at 1×28×28, 10 classes), minus dropout.

conv 5×5 → maxpool 2 → relu → conv 5×5 → maxpool 2 → relu → fc 50 → relu → fc classes. The first
fully connected layer's width follows `image_size` (320 inputs at 28×28, 500 at 32×32), so CIFAR-shaped
data works too. Exercised by: `pytest tests/unit/test_models.py -k mnist`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from commprof.base.errors import UsageError
from commprof.models.spec import ModelSpec

MIN_IMAGE_SIZE = 16
"""Smallest square input that leaves at least one pixel after two (conv 5×5, pool 2) rounds."""


class MnistCNN(nn.Module):
    """Two conv layers and two fully connected ones; each is an FSDP unit of its own."""

    def __init__(self, *, num_classes: int, in_channels: int, image_size: int) -> None:
        super().__init__()
        side = ((image_size - 4) // 2 - 4) // 2
        self.conv1 = nn.Conv2d(in_channels, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(20 * side * side, 50)
        self.fc2 = nn.Linear(50, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The original's Dropout2d/dropout are left out so runs with different rank counts stay
        # numerically comparable; it returned log_softmax, here the loss takes raw logits.
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def build(*, num_classes: int, in_channels: int, image_size: int, frozen_backbone: bool,
          head_width: int = 0) -> ModelSpec:
    """The MNIST example net for `in_channels`×`image_size`² inputs and `num_classes` outputs (it has no
    backbone to freeze, so no head width to take)."""
    if frozen_backbone:
        raise UsageError("model 'mnist-cnn' has no backbone to freeze; use a torchvision model")
    if image_size < MIN_IMAGE_SIZE:
        raise UsageError(f"model 'mnist-cnn' needs image_size >= {MIN_IMAGE_SIZE}, got {image_size}")
    net = MnistCNN(num_classes=num_classes, in_channels=in_channels, image_size=image_size)
    # The same computation as forward(), as a chain that pipeline stages can cut (weights shared).
    layers = (nn.Sequential(net.conv1, nn.MaxPool2d(2), nn.ReLU()),
              nn.Sequential(net.conv2, nn.MaxPool2d(2), nn.ReLU()),
              nn.Sequential(nn.Flatten(1), net.fc1, nn.ReLU()), net.fc2)
    return ModelSpec(module=net, task="classify", units=(net.conv1, net.conv2, net.fc1, net.fc2), kind="image",
                     layers=layers, head=(net.fc1, net.fc2))
