"""Binomial-tree broadcast: ⌈log2 n⌉ steps; in step k every rank that already has the data sends
it to the rank 2^(⌈log2 n⌉−1−k) further on (ranks counted from the root), so the number of ranks
holding it doubles each step. The whole vector moves in every step: latency-optimal, not bandwidth.

    commprof bench broadcast --algo binomial_tree --nproc 4
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import reference
from .common import log2_ceil

if TYPE_CHECKING:  # only annotations: the cost model loads without torch (commprof predict)
    import torch

COLLECTIVE = "broadcast"
NAME = "binomial_tree"
MODES = (True,)
expected = reference.broadcast


def _children(vrank: int, n: int) -> list[int]:
    """Relative ranks this relative rank sends to, in step order (largest distance first)."""
    low = vrank & -vrank if vrank else 1 << log2_ceil(n)  # a rank sends below its lowest set bit
    out, mask = [], low >> 1
    while mask:
        if vrank + mask < n:
            out.append(vrank + mask)
        mask >>= 1
    return out


def run(comm, tensor: torch.Tensor, *, src: int) -> None:
    """Copy `tensor` of rank `src` to every rank."""
    n, r = comm.world_size, comm.rank
    vrank, rounds = (r - src) % n, log2_ceil(n)
    if vrank:
        low = vrank & -vrank
        with comm.range(f"{NAME}::step{rounds - low.bit_length()}"):
            comm.recv(tensor, src=(vrank - low + src) % n)
    for child in _children(vrank, n):
        with comm.range(f"{NAME}::step{rounds - (child - vrank).bit_length()}"):
            comm.send(tensor, dst=(child + src) % n)


def steps(n: int, nbytes: int) -> int:
    return log2_ceil(n)


def sent_bytes(n: int, rank: int, count: int, itemsize: int, root: int = 0) -> int:
    """The whole vector to each child."""
    return len(_children((rank - root) % n, n)) * count * itemsize


def cost(n: int, nbytes: int, alpha: float, beta: float) -> float:
    """⌈log2 n⌉ (α + m β)."""
    return log2_ceil(n) * (alpha + beta * nbytes)
