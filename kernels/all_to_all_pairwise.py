"""Pairwise-exchange all_to_all: n−1 steps; in step k rank r sends its chunk for rank r+k and
receives the chunk of rank r−k, so every pair of ranks meets exactly once. Its own chunk is a
local copy.

    commprof bench all_to_all --algo pairwise --nproc 4
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import reference
from .common import OneChunkPerStep

if TYPE_CHECKING:  # only annotations: the cost model loads without torch (commprof predict)
    import torch

COLLECTIVE = "all_to_all"
NAME = "pairwise"
MODES = (False,)
expected = reference.all_to_all


def run(comm, output: torch.Tensor, input: torch.Tensor) -> None:
    """Chunk j of every rank's `input` goes to rank j; chunk i of `output` comes from rank i."""
    n, r = comm.world_size, comm.rank
    chunk = input.numel() // n
    src, out = input.view(-1), output.view(-1)
    part = lambda t, i: t[i * chunk:(i + 1) * chunk]  # noqa: E731
    part(out, r).copy_(part(src, r))
    for k in range(1, n):
        with comm.range(f"{NAME}::step{k - 1}"):
            comm.sendrecv(part(src, (r + k) % n), part(out, (r - k) % n), dst=(r + k) % n, src=(r - k) % n)



# each step sends one chunk to one peer: the model is shared
steps, sent_bytes, cost = OneChunkPerStep.steps, OneChunkPerStep.sent_bytes, OneChunkPerStep.cost
