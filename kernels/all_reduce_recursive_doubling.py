"""Recursive doubling all_reduce: log2 p steps, each exchanging the whole vector with the rank at
distance 1, 2, 4, … and reducing it in — latency-optimal, but every step moves all m bytes.

On n ranks that are not a power of two the first 2·rem ranks fold in pairs first (common.Fold): the
even rank of a pair sends its vector to the odd one and gets the result back at the end.

    commprof bench all_reduce --algo recursive_doubling --nproc 3
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import reference
from .common import Fold, combine, finish, fold_in, fold_out, log2_ceil, scratch

if TYPE_CHECKING:  # only annotations: the cost model loads without torch (commprof predict)
    import torch

COLLECTIVE = "all_reduce"
NAME = "recursive_doubling"
expected = reference.all_reduce


def run(comm, tensor: torch.Tensor, *, op: str = "sum", output: torch.Tensor | None = None) -> None:
    """All-reduce `tensor` (in place, or into `output`) by recursive doubling."""
    buf = tensor if output is None else output.copy_(tensor)
    n, r = comm.world_size, comm.rank
    if n > 1:
        flat, fold = buf.view(-1), Fold(n)
        core = fold.core(r)
        fold_in(comm, fold, flat, op, NAME)
        if core is not None:
            incoming = scratch(comm, flat.numel(), flat)
            for step in range(log2_ceil(fold.p)):
                peer = fold.real(core ^ (1 << step))
                with comm.range(f"{NAME}::step{step}"):
                    comm.sendrecv(flat, incoming, dst=peer, src=peer)
                    combine(flat, flat, incoming, op)  # a∘b == b∘a bit for bit: both sides agree
        fold_out(comm, fold, flat, NAME)
    finish(buf, op, n)


def steps(n: int, nbytes: int) -> int:
    fold = Fold(n)
    return log2_ceil(fold.p) + (2 if fold.rem else 0)


def sent_bytes(n: int, rank: int, count: int, itemsize: int, root: int = 0) -> int:
    """The whole vector per core step; a folded pair adds one whole vector each way."""
    fold = Fold(n)
    if fold.core(rank) is None:
        return count * itemsize
    return (log2_ceil(fold.p) + (fold.partner(rank) is not None)) * count * itemsize


def cost(n: int, nbytes: int, alpha: float, beta: float) -> float:
    """log2 p (α + m β), plus 2 (α + m β) for the fold when n is not a power of two."""
    return steps(n, 0) * (alpha + beta * nbytes)
