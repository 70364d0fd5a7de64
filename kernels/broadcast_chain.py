"""Pipelined chain broadcast: the ranks form a chain from the root (root, root+1, …), and the vector
is cut into segments of SEGMENT_BYTES; each rank receives segment s while its send of segment s−1
to the next rank is still in flight. With S segments it takes S + n − 2 steps of m/S bytes: close to
m β for long vectors at any n, at the price of (S + n − 2) latencies.

    commprof bench broadcast --algo chain --nproc 4
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from . import reference
from .common import bounds

if TYPE_CHECKING:  # only annotations: the cost model loads without torch (commprof predict)
    import torch

COLLECTIVE = "broadcast"
NAME = "chain"
MODES = (True,)
expected = reference.broadcast

SEGMENT_BYTES = 256 << 10
"""Target segment size: large enough to amortise a step's latency, small enough to pipeline."""


def segments(nbytes: int) -> int:
    """How many segments a vector of `nbytes` is cut into."""
    return max(1, math.ceil(nbytes / SEGMENT_BYTES))


def run(comm, tensor: torch.Tensor, *, src: int) -> None:
    """Copy `tensor` of rank `src` to every rank."""
    n, r = comm.world_size, comm.rank
    if n == 1:
        return
    vrank, flat = (r - src) % n, tensor.view(-1)
    b = bounds(flat.numel(), segments(flat.nbytes))
    sends = []
    for s in range(len(b) - 1):
        seg = flat[b[s]:b[s + 1]]
        with comm.range(f"{NAME}::step{vrank + s}"):  # rank v handles segment s in step v + s
            if vrank > 0:
                comm.recv(seg, src=(r - 1) % n)
            if vrank < n - 1:
                sends.append(comm.isend(seg, dst=(r + 1) % n))
    for handle in sends:
        handle.wait()


def steps(n: int, nbytes: int) -> int:
    return 0 if n == 1 else segments(nbytes) + n - 2


def sent_bytes(n: int, rank: int, count: int, itemsize: int, root: int = 0) -> int:
    """The whole vector once, by every rank but the last in the chain."""
    return count * itemsize if (rank - root) % n < n - 1 else 0


def cost(n: int, nbytes: int, alpha: float, beta: float) -> float:
    """(S + n − 2)(α + m/S β), S = ⌈m / SEGMENT_BYTES⌉."""
    if n == 1:
        return 0.0
    s = segments(nbytes)
    return (s + n - 2) * (alpha + beta * nbytes / s)
