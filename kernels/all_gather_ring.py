"""Ring all_gather: n−1 steps around the ring 0 → 1 → … → n−1 → 0; in step s rank r passes on the
block of rank r−s (its own first) and receives the block of rank r−s−1 straight into place.

    commprof bench all_gather --algo ring --nproc 4
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import reference
from .common import OneChunkPerStep

if TYPE_CHECKING:  # only annotations: the cost model loads without torch (commprof predict)
    import torch

COLLECTIVE = "all_gather"
NAME = "ring"
expected = reference.all_gather


def run(comm, output: torch.Tensor, input: torch.Tensor) -> None:
    """Gather every rank's `input` into `output` (world_size × input, rank order)."""
    n, r, chunk = comm.world_size, comm.rank, input.numel()
    flat = output.view(-1)
    block = [flat[i * chunk:(i + 1) * chunk] for i in range(n)]
    if block[r].data_ptr() != input.data_ptr():
        block[r].copy_(input.view(-1))
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        with comm.range(f"{NAME}::step{s}"):
            comm.sendrecv(block[(r - s) % n], block[(r - s - 1) % n], dst=right, src=left)



# each step sends one chunk to one peer: the model is shared
steps, sent_bytes, cost = OneChunkPerStep.steps, OneChunkPerStep.sent_bytes, OneChunkPerStep.cost
