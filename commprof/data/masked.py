"""BERT-style masked language modelling on top of any text source (task "mlm").

Each sample masks exactly k = max(1, round(0.15·T)) of its T positions, chosen from (seed, sample
index): the k positions with the smallest hash keys. Masked positions hold the mask token, id V for a
text vocabulary of V characters, so the model's vocabulary (`num_classes`) is V + 1; every masked
position gets the mask token (no 80/10/10 split). y is the original token at masked positions and -100
(cross_entropy's ignore_index) elsewhere.

The fixed count is what keeps the loss of a global batch equal to the mean of the per-rank losses:
each rank averages over the same number of labelled tokens per sample.

Exercised by: `pytest tests/unit/test_data.py -k mlm`.
"""

from __future__ import annotations

import torch

from commprof.data import keys
from commprof.data.base import Batch, Source

IGNORE = -100
"""Label of positions that are not predicted (torch.nn.functional.cross_entropy's ignore_index)."""
_MASK_SALT = 0x3A5C_0B1E


class MaskedText(Source):
    """A text source whose windows have a fixed number of tokens replaced by a mask token."""

    kind = "text"
    task = "mlm"

    def __init__(self, inner: Source, *, seed: int):
        self.inner = inner
        """The next-token source whose windows are masked."""
        self.name = inner.name
        self.seq_len = inner.seq_len
        self.num_samples = inner.num_samples
        self.mask_id = inner.num_classes
        self.num_classes = inner.num_classes + 1
        self.masked_per_sample = max(1, round(0.15 * inner.seq_len))
        """Masked positions in every sample."""
        self.heldout = MaskedText(inner.heldout, seed=seed) if inner.heldout is not None else None
        self._key = keys.mix(seed, _MASK_SALT)

    def get(self, indices: torch.Tensor) -> Batch:
        indices = self._check(indices)
        x = self.inner.get(indices).x.clone()
        rank = keys.bits(self._key, indices[:, None], torch.arange(self.seq_len)[None, :])
        positions = rank.argsort(dim=1, stable=True)[:, :self.masked_per_sample]
        y = torch.full_like(x, IGNORE)
        y.scatter_(1, positions, x.gather(1, positions))
        x.scatter_(1, positions, self.mask_id)
        return Batch(x=x, y=y)
