"""A real image data set held in memory as uint8, turned into normalised float batches on demand.

MNIST and CIFAR readers parse their files into this one class. Images stay uint8 until a batch is
asked for, so a resize to 224 pixels costs memory per batch, not per data set.

Shape changes, applied to pixel values in [0, 1] before normalising:
  channels  1 → 3 repeats the grey channel; 3 → 1 takes the ITU-R 601 luma 0.299 R + 0.587 G + 0.114 B
            (normalised with the same weights applied to the per-channel means and stds: the mean is
            exact, the std an approximation).
  size      bilinear resize (torch.nn.functional.interpolate, antialiased when shrinking); no padding.

Exercised by: `pytest tests/unit/test_data.py -k "mnist or cifar"`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from commprof.base.errors import UsageError
from commprof.data.base import Batch, Source

_LUMA = (0.299, 0.587, 0.114)


class ImageArrays(Source):
    """Images [N, C, H, W] uint8 and labels [N] from files, with the shape and normalisation asked for."""

    kind = "image"
    task = "classify"

    def __init__(self, *, name: str, images: torch.Tensor, labels: torch.Tensor, num_classes: int,
                 mean: tuple[float, ...], std: tuple[float, ...], in_channels: int | None = None,
                 image_size: int | None = None, heldout: Source | None = None):
        stored = images.shape[1]
        in_channels = stored if in_channels is None else in_channels
        if in_channels not in (1, 3):
            raise UsageError(f"{name}: in_channels must be 1 or 3, not {in_channels}")
        image_size = images.shape[-1] if image_size is None else image_size
        if image_size < 1:
            raise UsageError(f"{name}: image size must be positive, not {image_size}")
        self.name = name
        self.num_samples = images.shape[0]
        self.num_classes = num_classes
        self.in_channels = in_channels
        self.image_size = image_size
        self.heldout = heldout
        self.images = images
        """The stored pixels, uint8 [N, C, H, W], as read from the files."""
        self.labels = labels
        """The stored classes, int64 [N]."""
        if stored == 3 and in_channels == 1:
            mean = (sum(w * m for w, m in zip(_LUMA, mean)),)
            std = (sum(w * s for w, s in zip(_LUMA, std)),)
        elif stored == 1 and in_channels == 3:
            mean, std = mean * 3, std * 3
        self.mean = mean
        """Per-channel mean subtracted from pixel values in [0, 1]."""
        self.std = std
        """Per-channel std they are divided by."""

    def get(self, indices: torch.Tensor) -> Batch:
        indices = self._check(indices)
        x = self.images[indices].to(torch.float32).div_(255)
        if x.shape[1] == 1 and self.in_channels == 3:
            x = x.expand(-1, 3, -1, -1)
        elif x.shape[1] == 3 and self.in_channels == 1:
            w = torch.tensor(_LUMA).view(1, 3, 1, 1)
            x = (x * w).sum(1, keepdim=True)
        if x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear",
                              align_corners=False, antialias=self.image_size < x.shape[-1])
        mean = torch.tensor(self.mean).view(1, -1, 1, 1)
        std = torch.tensor(self.std).view(1, -1, 1, 1)
        return Batch(x=((x - mean) / std).contiguous(), y=self.labels[indices])
