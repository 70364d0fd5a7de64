"""Bruck's all_gather: ⌈log2 n⌉ steps for any n. A rank keeps its blocks rotated so its own comes
first; at distance d = 1, 2, 4, … it sends its first min(d, n−d) blocks to rank r−d and appends the
ones rank r+d sends. A final local rotation puts the blocks in rank order.

    commprof bench all_gather --algo bruck --nproc 3
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import reference
from .common import log2_ceil, scratch

if TYPE_CHECKING:  # only annotations: the cost model loads without torch (commprof predict)
    import torch

COLLECTIVE = "all_gather"
NAME = "bruck"
expected = reference.all_gather


def run(comm, output: torch.Tensor, input: torch.Tensor) -> None:
    """Gather every rank's `input` into `output` (world_size × input, rank order)."""
    n, r, chunk = comm.world_size, comm.rank, input.numel()
    flat = output.view(-1)
    rotated = scratch(comm, flat.numel(), flat)  # block j = the block of rank (r + j) mod n
    rotated[:chunk].copy_(input.view(-1))
    for step in range(log2_ceil(n)):
        d = 1 << step
        blocks = min(d, n - d)
        with comm.range(f"{NAME}::step{step}"):
            comm.sendrecv(rotated[:blocks * chunk], rotated[d * chunk:(d + blocks) * chunk],
                          dst=(r - d) % n, src=(r + d) % n)
    head = (n - r) * chunk  # rotated[:head] holds ranks r … n−1
    flat[r * chunk:].copy_(rotated[:head])
    flat[:r * chunk].copy_(rotated[head:])


def steps(n: int, nbytes: int) -> int:
    return log2_ceil(n)


def sent_bytes(n: int, rank: int, count: int, itemsize: int, root: int = 0) -> int:
    """Σ min(d, n−d) blocks over the steps = n − 1 blocks."""
    return (n - 1) * (count // n) * itemsize


def cost(n: int, nbytes: int, alpha: float, beta: float) -> float:
    """⌈log2 n⌉ α + (n−1)/n · m β."""
    return log2_ceil(n) * alpha + (n - 1) / n * nbytes * beta
