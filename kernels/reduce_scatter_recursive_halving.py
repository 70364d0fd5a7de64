"""Recursive halving reduce_scatter: log2 p steps; in each a rank keeps half of the blocks it is
still reducing and sends the other half to the rank at distance p/2, p/4, …, adding what comes back.
Half the data each step, so (p−1)/p of the input in all with only log2 p latencies.

Other rank counts fold first (common.Fold): the even rank of each of the first 2·rem pairs sends its
whole input to the odd one, which reduces the pair's two chunks in the core and sends the even rank
its chunk at the end. `halve` is also the first half of Rabenseifner's all_reduce.

    commprof bench reduce_scatter --algo recursive_halving --nproc 3
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import reference
from .common import Fold, combine, finish, log2_ceil, scratch

if TYPE_CHECKING:  # only annotations: the cost model loads without torch (commprof predict)
    import torch

COLLECTIVE = "reduce_scatter"
NAME = "recursive_halving"
expected = reference.reduce_scatter


def halve(comm, src: torch.Tensor, work: torch.Tensor, b: list[int], fold: Fold, op: str, name: str) -> None:
    """Core recursive halving over p = len(b) − 1 core ranks: afterwards core rank c holds in
    work[b[c]:b[c+1]] its blocks reduced over every core rank. `src` holds this rank's data (it may be
    `work` itself); only `work` is written."""
    c = fold.core(comm.rank)
    incoming_buf = scratch(comm, b[-1], work, slot=1)
    lo, hi = 0, fold.p
    for step in range(log2_ceil(fold.p)):
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if c < mid else ((mid, hi), (lo, mid))
        peer = fold.real(c ^ (1 << (log2_ceil(fold.p) - 1 - step)))
        k0, k1 = b[keep[0]], b[keep[1]]
        incoming = incoming_buf[:k1 - k0]
        with comm.range(f"{name}::reduce_scatter::step{step}"):
            comm.sendrecv(src[b[give[0]]:b[give[1]]], incoming, dst=peer, src=peer)
            combine(work[k0:k1], src[k0:k1], incoming, op)
        src, (lo, hi) = work, keep
    if src is not work:  # no step ran (p = 1): the data is already reduced
        work.copy_(src)


def run(comm, output: torch.Tensor, input: torch.Tensor, *, op: str = "sum") -> None:
    """Reduce `input` (world_size chunks) across ranks; chunk `rank` of the result lands in `output`."""
    n, r, chunk = comm.world_size, comm.rank, output.numel()
    flat, out, fold = input.view(-1), output.view(-1), Fold(n)
    core, partner = fold.core(r), fold.partner(r)
    if core is None:
        with comm.range(f"{NAME}::fold"):
            comm.send(flat, dst=partner)
        with comm.range(f"{NAME}::unfold"):
            comm.recv(out, src=partner)
    else:
        work, src = scratch(comm, flat.numel(), flat, slot=0), flat
        if partner is not None:
            with comm.range(f"{NAME}::fold"):
                comm.recv(work, src=partner)
                combine(work, work, flat, op)
            src = work
        b = [chunk * fold.first(c) for c in range(fold.p + 1)]
        halve(comm, src, work, b, fold, op, NAME)
        if partner is not None:
            with comm.range(f"{NAME}::unfold"):
                comm.send(work[partner * chunk:(partner + 1) * chunk], dst=partner)
        out.copy_(work[r * chunk:(r + 1) * chunk])
    finish(output, op, n)


def steps(n: int, nbytes: int) -> int:
    fold = Fold(n)
    return log2_ceil(fold.p) + (2 if fold.rem else 0)


def sent_bytes(n: int, rank: int, count: int, itemsize: int, root: int = 0) -> int:
    """A core rank sends everything but the chunks it ends with; a folded pair: the even rank its
    whole input, the odd one the even rank's chunk back."""
    fold, chunk = Fold(n), count // n
    core = fold.core(rank)
    if core is None:
        return count * itemsize
    mine = fold.first(core + 1) - fold.first(core)
    return (count - mine * chunk + (chunk if fold.partner(rank) is not None else 0)) * itemsize


def cost(n: int, nbytes: int, alpha: float, beta: float) -> float:
    """log2 p α + (p−1)/p · m β, plus α + m β and α + m/n β for the fold."""
    fold = Fold(n)
    t = log2_ceil(fold.p) * alpha + (fold.p - 1) / fold.p * nbytes * beta
    if fold.rem:
        t += 2 * alpha + nbytes * beta + nbytes / n * beta
    return t
