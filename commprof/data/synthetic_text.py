"""Synthetic text: token sequences from a fixed random Markov chain, a pure function of (seed, index).

The chain (fixed by the seed) gives every token four likely successors with probabilities 0.5, 0.25,
0.15 and 0.1, mixed with 5% uniform, so a model can learn it: the loss falls from ln(vocab) towards
the chain's entropy (about 1.5 nats for 65 tokens). Sample i starts at a hashed token and walks T steps
with uniforms hashed from (seed, i, position); x is the first T tokens, y the next T.
The held-out split walks the same chain from other uniforms.

Exercised by: `pytest tests/unit/test_data.py -k synthetic`.
"""

from __future__ import annotations

import torch

from commprof.data import keys
from commprof.data.base import Batch, Source

_CHAIN_SALT, _SPLIT_SALT = 0xC4A1_7E27, 0x7E47_0000
_SUCCESSOR_P = (0.5, 0.25, 0.15, 0.1)
_UNIFORM_SHARE = 0.05


class SyntheticText(Source):
    """Walks of a seeded Markov chain over `num_classes` tokens."""

    name = "synthetic-text"
    kind = "text"
    task = "lm"

    def __init__(self, *, seed: int, num_samples: int, num_classes: int = 65, seq_len: int = 64,
                 heldout_samples: int | None = None, split: int = 0):
        self.num_samples = num_samples
        self.num_classes = num_classes
        self.seq_len = seq_len
        g = torch.Generator().manual_seed(keys.mix(seed, _CHAIN_SALT))
        successors = torch.randint(num_classes, (num_classes, len(_SUCCESSOR_P)), generator=g)
        p = torch.full((num_classes, num_classes), _UNIFORM_SHARE / num_classes, dtype=torch.float64)
        p.scatter_add_(1, successors, torch.tensor(_SUCCESSOR_P, dtype=torch.float64)
                       .mul(1 - _UNIFORM_SHARE).expand(num_classes, -1))
        self.transitions = p
        """Row-stochastic matrix [V, V]: probability of each next token given the current one."""
        self._cdf = p.cumsum(1).to(torch.float32)
        self._key = keys.mix(seed, _SPLIT_SALT + split)
        self.heldout = None
        heldout_samples = max(1, num_samples // 10) if heldout_samples is None else heldout_samples
        if split == 0 and heldout_samples > 0:
            self.heldout = SyntheticText(seed=seed, num_samples=heldout_samples, num_classes=num_classes,
                                         seq_len=seq_len, split=1)

    def get(self, indices: torch.Tensor) -> Batch:
        indices = self._check(indices)
        # Position-major, so each step reads and writes one contiguous row.
        u = keys.uniform(self._key, torch.arange(self.seq_len + 1)[:, None], indices[None, :])
        tokens = torch.empty(self.seq_len + 1, len(indices), dtype=torch.int64)
        tokens[0] = (u[0] * self.num_classes).long()
        for t in range(1, self.seq_len + 1):
            nxt = torch.searchsorted(self._cdf[tokens[t - 1]], u[t, :, None]).squeeze(1)
            tokens[t] = nxt.clamp_(max=self.num_classes - 1)  # float rounding can leave cdf[-1] < u
        tokens = tokens.t()
        return Batch(x=tokens[:, :-1].contiguous(), y=tokens[:, 1:].contiguous())
