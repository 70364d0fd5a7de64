"""Counter-based random numbers: a value is a hash of (key, counters), never a draw from a stream.

That is what makes sample i the same on every rank and in every batch it appears in: nothing depends on
how many values were drawn before it.

Exercised by: `pytest tests/unit/test_data.py -k determinism`.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF


def mix(*parts: int) -> int:
    """A 63-bit key from integers (seed, epoch, salt, …): splitmix64 folded over the parts."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h ^ (p & _M64)) & _M64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _M64
        h ^= h >> 31
    return h >> 1  # torch seeds and int64 tensors are signed


def _hash32(x: torch.Tensor) -> torch.Tensor:
    # Multipliers stay below 2**31 so a 32-bit value times one fits in int64 without overflow.
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x27D4EB2D) & _M32
    return x ^ (x >> 16)


def bits(key: int, *counters: torch.Tensor) -> torch.Tensor:
    """32 random bits (int64 in [0, 2**32)) per element of the broadcast counters (each < 2**32)."""
    h = torch.tensor(key & _M32, dtype=torch.int64)
    for c in counters:
        h = _hash32(h ^ c.to(torch.int64))
    return h


def uniform(key: int, *counters: torch.Tensor) -> torch.Tensor:
    """float32 in [0, 1) per element of the broadcast counters."""
    return (bits(key, *counters) >> 8).to(torch.float32) * 2.0**-24
