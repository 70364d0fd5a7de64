"""Ring reduce_scatter: n−1 steps around the ring 0 → 1 → … → n−1 → 0. In step s rank r sends its
running partial sum of block r−s−1 (its own input block at first) to r+1, and adds its own input
block r−s−2 to the partial sum arriving from r−1; the last step leaves block r, reduced over every
rank, in `output`. One chunk-sized accumulator; the input is never written.

    commprof bench reduce_scatter --algo ring --nproc 4
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import reference
from .common import OneChunkPerStep, combine, finish, scratch

if TYPE_CHECKING:  # only annotations: the cost model loads without torch (commprof predict)
    import torch

COLLECTIVE = "reduce_scatter"
NAME = "ring"
expected = reference.reduce_scatter


def run(comm, output: torch.Tensor, input: torch.Tensor, *, op: str = "sum") -> None:
    """Reduce `input` (world_size chunks) across ranks; chunk `rank` of the result lands in `output`."""
    n, r, chunk = comm.world_size, comm.rank, output.numel()
    flat, out = input.view(-1), output.view(-1)
    block = [flat[i * chunk:(i + 1) * chunk] for i in range(n)]
    if n == 1:
        if out.data_ptr() != flat.data_ptr():
            out.copy_(flat)
    else:
        acc, incoming = scratch(comm, chunk, out, 0), scratch(comm, chunk, out, 1)
        send = block[(r - 1) % n]
        right, left = (r + 1) % n, (r - 1) % n
        for s in range(n - 1):
            target = out if s == n - 2 else acc  # acc was sent already: safe to overwrite
            with comm.range(f"{NAME}::step{s}"):
                comm.sendrecv(send, incoming, dst=right, src=left)
                combine(target, block[(r - s - 2) % n], incoming, op)
            send = target
    finish(output, op, n)



# each step sends one chunk to one peer: the model is shared
steps, sent_bytes, cost = OneChunkPerStep.steps, OneChunkPerStep.sent_bytes, OneChunkPerStep.cost
