"""Recursive doubling all_gather: log2 p steps; at distance d = 1, 2, 4, … a rank swaps everything it
has gathered so far (d blocks' worth) with its partner, so the data doubles each step: (p−1)/p of
the result sent with only log2 p latencies.

Other rank counts fold first (common.Fold): the even rank of each of the first 2·rem pairs hands
its chunk to the odd one, which gathers for both and sends the whole result back. `double` is also
the second half of Rabenseifner's all_reduce.

    commprof bench all_gather --algo recursive_doubling --nproc 3
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import reference
from .common import Fold, fold_out, log2_ceil

if TYPE_CHECKING:  # only annotations: the cost model loads without torch (commprof predict)
    import torch

COLLECTIVE = "all_gather"
NAME = "recursive_doubling"
expected = reference.all_gather


def double(comm, buf: torch.Tensor, b: list[int], fold: Fold, name: str) -> None:
    """Core recursive doubling over p = len(b) − 1 core ranks: core rank c starts with
    buf[b[c]:b[c+1]] and ends with all of buf[b[0]:b[p]]."""
    c = fold.core(comm.rank)
    for step in range(log2_ceil(fold.p)):
        d = 1 << step
        mine = c & ~(d - 1)
        theirs = mine ^ d
        peer = fold.real(c ^ d)
        with comm.range(f"{name}::all_gather::step{step}"):
            comm.sendrecv(buf[b[mine]:b[mine + d]], buf[b[theirs]:b[theirs + d]], dst=peer, src=peer)


def sent_in_core(b: list[int], c: int, p: int) -> int:
    """Elements core rank c sends in `double`: its gathered range at each step."""
    total = 0
    for step in range(log2_ceil(p)):
        d = 1 << step
        mine = c & ~(d - 1)
        total += b[mine + d] - b[mine]
    return total


def run(comm, output: torch.Tensor, input: torch.Tensor) -> None:
    """Gather every rank's `input` into `output` (world_size × input, rank order)."""
    n, r, chunk = comm.world_size, comm.rank, input.numel()
    flat, fold = output.view(-1), Fold(n)
    own = flat[r * chunk:(r + 1) * chunk]
    if own.data_ptr() != input.data_ptr():
        own.copy_(input.view(-1))
    core, partner = fold.core(r), fold.partner(r)
    if partner is not None:
        with comm.range(f"{NAME}::fold"):
            if core is None:
                comm.send(own, dst=partner)
            else:
                comm.recv(flat[partner * chunk:(partner + 1) * chunk], src=partner)
    if core is not None:
        double(comm, flat, [chunk * fold.first(c) for c in range(fold.p + 1)], fold, NAME)
    fold_out(comm, fold, flat, NAME)


def steps(n: int, nbytes: int) -> int:
    fold = Fold(n)
    return log2_ceil(fold.p) + (2 if fold.rem else 0)


def sent_bytes(n: int, rank: int, count: int, itemsize: int, root: int = 0) -> int:
    """Core: its gathered range at each step; a folded pair: the even rank its chunk, the odd one
    the whole result back."""
    fold, chunk = Fold(n), count // n
    core = fold.core(rank)
    if core is None:
        return chunk * itemsize
    b = [chunk * fold.first(c) for c in range(fold.p + 1)]
    return (sent_in_core(b, core, fold.p) + (count if fold.partner(rank) is not None else 0)) * itemsize


def cost(n: int, nbytes: int, alpha: float, beta: float) -> float:
    """log2 p α + (p−1)/p · m β, plus α + m/n β and α + m β for the fold."""
    fold = Fold(n)
    t = log2_ceil(fold.p) * alpha + (fold.p - 1) / fold.p * nbytes * beta
    if fold.rem:
        t += 2 * alpha + nbytes / n * beta + nbytes * beta
    return t
