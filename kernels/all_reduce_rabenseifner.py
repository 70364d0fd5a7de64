"""Rabenseifner's all_reduce: a recursive-halving reduce-scatter, then a recursive-doubling
all-gather of the reduced blocks — the bandwidth of the ring (2(p−1)/p of the vector sent) with
2 log2 p latencies instead of 2(p−1). MPICH's choice for long vectors.

The vector is cut into p blocks (sizes differ by at most one element). Other rank counts fold
first (common.Fold): the even rank of each of the first 2·rem pairs sends its whole vector to the
odd one and gets the whole result back.

    commprof bench all_reduce --algo rabenseifner --nproc 4
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import reference
from .all_gather_recursive_doubling import double, sent_in_core
from .common import Fold, bounds, finish, fold_in, fold_out, log2_ceil
from .reduce_scatter_recursive_halving import halve

if TYPE_CHECKING:  # only annotations: the cost model loads without torch (commprof predict)
    import torch

COLLECTIVE = "all_reduce"
NAME = "rabenseifner"
expected = reference.all_reduce


def run(comm, tensor: torch.Tensor, *, op: str = "sum", output: torch.Tensor | None = None) -> None:
    """All-reduce `tensor` (in place, or into `output`) with Rabenseifner's algorithm."""
    buf = tensor if output is None else output.copy_(tensor)
    n, r = comm.world_size, comm.rank
    if n > 1:
        flat, fold = buf.view(-1), Fold(n)
        fold_in(comm, fold, flat, op, NAME)
        if fold.core(r) is not None:
            b = bounds(flat.numel(), fold.p)
            halve(comm, flat, flat, b, fold, op, NAME)
            double(comm, flat, b, fold, NAME)
        fold_out(comm, fold, flat, NAME)
    finish(buf, op, n)


def steps(n: int, nbytes: int) -> int:
    fold = Fold(n)
    return 2 * log2_ceil(fold.p) + (2 if fold.rem else 0)


def sent_bytes(n: int, rank: int, count: int, itemsize: int, root: int = 0) -> int:
    """Core: all but its own block in the halving, its gathered range at each doubling step; a
    folded pair: one whole vector each way."""
    fold = Fold(n)
    core = fold.core(rank)
    if n == 1:
        return 0
    if core is None:
        return count * itemsize
    b = bounds(count, fold.p)
    halving = count - (b[core + 1] - b[core])
    unfold = count if fold.partner(rank) is not None else 0
    return (halving + sent_in_core(b, core, fold.p) + unfold) * itemsize


def cost(n: int, nbytes: int, alpha: float, beta: float) -> float:
    """2 log2 p α + 2 (p−1)/p · m β, plus 2 (α + m β) for the fold."""
    fold = Fold(n)
    t = 2 * log2_ceil(fold.p) * alpha + 2 * (fold.p - 1) / fold.p * nbytes * beta
    if fold.rem:
        t += 2 * (alpha + nbytes * beta)
    return t
