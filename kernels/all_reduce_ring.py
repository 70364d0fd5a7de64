"""Ring all_reduce: a reduce-scatter then an all-gather around the ring 0 → 1 → … → n−1 → 0.

The vector is cut into n blocks (sizes differ by at most one element, so any count works). In
reduce-scatter step s (s = 0 … n−2) rank r sends block r−s−1 to r+1 and adds the block arriving
from r−1 into its own copy; after n−1 steps rank r holds block r fully reduced. The all-gather then
passes the finished blocks on for n−1 more steps. Every rank sends 2(n−1)/n of the vector — the
bandwidth-optimal amount — in 2(n−1) latency-bound steps.

    commprof bench all_reduce --algo ring --nproc 4
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import reference
from .common import bounds, combine, finish, scratch

if TYPE_CHECKING:  # only annotations: the cost model loads without torch (commprof predict)
    import torch

COLLECTIVE = "all_reduce"
NAME = "ring"
expected = reference.all_reduce


def run(comm, tensor: torch.Tensor, *, op: str = "sum", output: torch.Tensor | None = None) -> None:
    """All-reduce `tensor` (in place, or into `output`) with the ring algorithm."""
    buf = tensor if output is None else output.copy_(tensor)
    n, r = comm.world_size, comm.rank
    if n > 1:
        b = bounds(buf.numel(), n)
        flat = buf.view(-1)
        block = [flat[b[i]:b[i + 1]] for i in range(n)]
        incoming_buf = scratch(comm, b[1] - b[0], buf)
        right, left = (r + 1) % n, (r - 1) % n
        for s in range(n - 1):
            out, into = block[(r - s - 1) % n], block[(r - s - 2) % n]
            incoming = incoming_buf[:into.numel()]
            with comm.range(f"ring::reduce_scatter::step{s}"):
                comm.sendrecv(out, incoming, dst=right, src=left)
                combine(into, into, incoming, op)
        for s in range(n - 1):
            with comm.range(f"ring::all_gather::step{s}"):
                comm.sendrecv(block[(r - s) % n], block[(r - s - 1) % n], dst=right, src=left)
    finish(buf, op, n)


def steps(n: int, nbytes: int) -> int:
    return 2 * (n - 1)


def sent_bytes(n: int, rank: int, count: int, itemsize: int, root: int = 0) -> int:
    """Every block but r in the reduce-scatter, every block but r+1 in the all-gather."""
    if n == 1:
        return 0
    b = bounds(count, n)
    size = [b[i + 1] - b[i] for i in range(n)]
    return (2 * count - size[rank] - size[(rank + 1) % n]) * itemsize


def cost(n: int, nbytes: int, alpha: float, beta: float) -> float:
    """2(n−1) α + 2(n−1)/n · m β."""
    return 2 * (n - 1) * (alpha + beta * nbytes / n)
