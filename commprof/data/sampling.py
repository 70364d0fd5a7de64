"""Which samples each step uses, and which part of them each rank takes.

Every rank computes the same global batch for step t from (seed, epoch, step) alone and keeps its
contiguous share, so the samples of step t do not depend on the number of ranks: a run on 1, 2 or 3
ranks trains on the same data and the gradients averaged over ranks match the single-rank ones.

Exercised by: `pytest tests/unit/test_data.py -k "indices or shard"`.
"""

from __future__ import annotations

import functools

import torch

from commprof.base.errors import UsageError
from commprof.data.base import Batch
from commprof.data.keys import mix

_EPOCH_SALT = 0x5EED_E90C


def steps_per_epoch(num_samples: int, global_batch: int) -> int:
    """ceil(N / G): the last step tops itself up from the start of the epoch's permutation."""
    if num_samples < 1 or global_batch < 1:
        raise UsageError(f"need at least one sample and a batch of at least one (N={num_samples}, "
                         f"global batch={global_batch})")
    return -(-num_samples // global_batch)


@functools.lru_cache(maxsize=4)
def _permutation(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    # Cached because every step of an epoch needs the same permutation; callers only read it.
    g = torch.Generator().manual_seed(mix(seed, epoch, _EPOCH_SALT))
    return torch.randperm(num_samples, generator=g)


def global_indices(num_samples: int, *, seed: int, epoch: int, step: int, global_batch: int) -> torch.Tensor:
    """The G sample indices (int64) of global step `step` of `epoch`.

    Positions [step·G, (step+1)·G) of a permutation of range(N) seeded by (seed, epoch); positions past
    N wrap around to the start, so every step has exactly G samples.
    """
    steps = steps_per_epoch(num_samples, global_batch)
    if not 0 <= step < steps:
        raise UsageError(f"step {step} is outside the epoch (0 … {steps - 1} for N={num_samples}, "
                         f"global batch {global_batch})")
    perm = _permutation(num_samples, seed, epoch)
    positions = torch.arange(step * global_batch, (step + 1) * global_batch) % num_samples
    return perm[positions]


def shard(batch: Batch | torch.Tensor, *, rank: int, world_size: int) -> Batch | torch.Tensor:
    """Contiguous chunk `rank` of `world_size` of a global batch (or of its index tensor).

    Sharding the indices and then calling `Source.get` gives the same samples as sharding the batch,
    without building the whole global batch on every rank.
    """
    n = len(batch)
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not in a world of {world_size}")
    if n % world_size:
        raise UsageError(f"global batch {n} is not divisible by world size {world_size}")
    b = n // world_size
    if isinstance(batch, Batch):
        return Batch(x=batch.x[rank * b:(rank + 1) * b], y=batch.y[rank * b:(rank + 1) * b])
    return batch[rank * b:(rank + 1) * b]
