"""Deterministic inputs and their closed-form results, for checking every collective (-c).

Every value stays a small integer, so results are exact in every dtype (int8 … bfloat16) for up to
63 ranks; reductions are checked against formulas, never against another reduction. Element j of
rank r holds:

  moved data (gather, broadcast, …)   (7r + j) mod 11           pattern(r)
  all_to_all, chunk for rank d        (5r + 3d + j) mod 11
  sum / avg                           (r + j) mod 3             Σ_r = 3⌊n/3⌋ + Σ_{r<n mod 3} (r+j) mod 3
  prod                                2 + j mod 2 on the one rank with (r+j) mod n = 0, else 1
  min / max                           (r + j) mod 5             a window of n consecutive residues

Exercised by: `pytest tests/unit/test_closed_forms.py tests/test_data_world.py`.
"""

from __future__ import annotations

import torch

SENTINEL = 99
"""Fill for buffers a collective must overwrite (outside every pattern's range)."""


def _j(count: int, offset: int = 0) -> torch.Tensor:
    return torch.arange(offset, offset + count, dtype=torch.int64)


def pattern(rank: int, count: int, offset: int = 0) -> torch.Tensor:
    return (7 * rank + _j(count, offset)) % 11


def all_to_all_input(rank: int, n: int, chunk: int) -> torch.Tensor:
    dest = torch.arange(n, dtype=torch.int64).repeat_interleave(chunk)
    return (5 * rank + 3 * dest + _j(chunk).repeat(n)) % 11


def all_to_all_expected(rank: int, n: int, chunk: int) -> torch.Tensor:
    source = torch.arange(n, dtype=torch.int64).repeat_interleave(chunk)
    return (5 * source + 3 * rank + _j(chunk).repeat(n)) % 11


def reduce_input(op: str, rank: int, n: int, count: int, offset: int = 0) -> torch.Tensor:
    j = _j(count, offset)
    if op in ("sum", "avg"):
        return (rank + j) % 3
    if op == "prod":
        return 1 + ((rank + j) % n == 0) * (1 + j % 2)
    return (rank + j) % 5


def reduce_expected(op: str, n: int, count: int, offset: int = 0) -> torch.Tensor:
    """Closed form of reducing `reduce_input(op, r, n, …)` over r = 0 … n-1 (float64)."""
    j = _j(count, offset)
    if op in ("sum", "avg"):
        total = torch.full_like(j, 3 * (n // 3))
        for r in range(n % 3):
            total += (r + j) % 3
        return total.double() / (n if op == "avg" else 1)
    if op == "prod":
        return (2 + j % 2).double()
    if n >= 5:
        return torch.full((count,), 0.0 if op == "min" else 4.0, dtype=torch.float64)
    start = j % 5
    wraps = start + n - 1 >= 5
    if op == "min":
        return torch.where(wraps, 0, start).double()
    return torch.where(wraps, 4, start + n - 1).double()


def count_wrong(actual: torch.Tensor, expected: torch.Tensor, *, n: int, approx: bool) -> int:
    """Elements of `actual` that differ from `expected`; `approx` allows rounding (avg)."""
    actual = actual.detach().to("cpu")
    if not approx:
        return int((actual != expected.to(actual.dtype)).sum())
    if actual.dtype.is_floating_point:
        tol = torch.finfo(actual.dtype).eps * max(n, 4) * expected.abs().clamp(min=1)
    else:
        tol = torch.ones_like(expected)  # integer avg may round either way
    return int(((actual.double() - expected).abs() > tol).sum())
