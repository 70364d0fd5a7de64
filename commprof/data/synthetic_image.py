"""Synthetic images: the default data, nothing to read, learnable, and a pure function of (seed, index).

Sample i of class c = hash(seed, i) mod classes is a smooth class prototype (an 8x8 random pattern
fixed by the seed, bilinearly upsampled) plus Gaussian noise from a generator seeded with (seed, i).
Prototype and noise are scaled so pixels have mean 0 and std about 1, like normalised real data; the
classes are far apart in pixel space, so the loss of any reasonable model falls within a few steps.
The held-out split shares the prototypes and draws other samples (other labels and noise).

Exercised by: `pytest tests/unit/test_data.py -k synthetic`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from commprof.data import keys
from commprof.data.base import Batch, Source

_PROTOTYPE_SALT, _SPLIT_SALT = 0x9907_0717, 0x5D17_0000
_PROTOTYPE_RES = 8
_SIGNAL, _NOISE = 0.6, 0.8


class SyntheticImage(Source):
    """Class prototype plus per-sample noise, generated on demand."""

    name = "synthetic-image"
    kind = "image"
    task = "classify"

    def __init__(self, *, seed: int, num_samples: int, num_classes: int = 10, in_channels: int = 3,
                 image_size: int = 32, heldout_samples: int = 10_000, split: int = 0):
        self.num_samples = num_samples
        self.num_classes = num_classes
        self.in_channels = in_channels
        self.image_size = image_size
        res = min(_PROTOTYPE_RES, image_size)
        g = torch.Generator().manual_seed(keys.mix(seed, _PROTOTYPE_SALT))
        self.prototypes = torch.randn(num_classes, in_channels, res, res, generator=g) * _SIGNAL
        """Low-resolution class patterns [classes, C, r, r], shared by both splits."""
        self._key = keys.mix(seed, _SPLIT_SALT + split)
        self.heldout = None
        if split == 0 and heldout_samples > 0:
            self.heldout = SyntheticImage(seed=seed, num_samples=heldout_samples, num_classes=num_classes,
                                          in_channels=in_channels, image_size=image_size, split=1)

    def labels(self, indices: torch.Tensor) -> torch.Tensor:
        """The classes of samples `indices`, without generating their pixels."""
        return keys.bits(self._key, self._check(indices)) % self.num_classes

    def get(self, indices: torch.Tensor) -> Batch:
        indices = self._check(indices)
        y = self.labels(indices)
        x = self.prototypes[y]  # indexing with a tensor copies
        if x.shape[-1] != self.image_size:
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False)
        noise = torch.empty_like(x)
        g = torch.Generator()
        # One generator reseeded per sample: a sample's noise cannot depend on its neighbours in the batch.
        for k, i in enumerate(indices.tolist()):
            g.manual_seed(keys.mix(self._key, i))
            noise[k].normal_(generator=g)
        return Batch(x=x.add_(noise, alpha=_NOISE), y=y)
