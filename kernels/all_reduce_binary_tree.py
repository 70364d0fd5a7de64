"""Binary-tree all_reduce: a reduce up the heap-ordered binary tree (rank r's children are 2r+1 and
2r+2) to rank 0, then a broadcast back down the same tree. Every step moves the whole vector, and a
parent serves its two children one after the other: simple, and the slowest for long vectors.

    commprof bench all_reduce --algo binary_tree --nproc 4
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import reference
from .common import combine, finish, scratch

if TYPE_CHECKING:  # only annotations: the cost model loads without torch (commprof predict)
    import torch

COLLECTIVE = "all_reduce"
NAME = "binary_tree"
expected = reference.all_reduce


def _children(rank: int, n: int) -> list[int]:
    return [c for c in (2 * rank + 1, 2 * rank + 2) if c < n]


def run(comm, tensor: torch.Tensor, *, op: str = "sum", output: torch.Tensor | None = None) -> None:
    """All-reduce `tensor` (in place, or into `output`) through a binary tree rooted at rank 0."""
    buf = tensor if output is None else output.copy_(tensor)
    n, r = comm.world_size, comm.rank
    flat, children, parent = buf.view(-1), _children(r, n), (r - 1) // 2
    incoming = scratch(comm, flat.numel(), flat) if children else None
    for i, child in enumerate(children):
        with comm.range(f"{NAME}::reduce::child{i}"):
            comm.recv(incoming, src=child)
            combine(flat, flat, incoming, op)
    if r > 0:
        with comm.range(f"{NAME}::reduce::parent"):
            comm.send(flat, dst=parent)
        with comm.range(f"{NAME}::broadcast::parent"):
            comm.recv(flat, src=parent)
    for i, child in enumerate(children):
        with comm.range(f"{NAME}::broadcast::child{i}"):
            comm.send(flat, dst=child)
    finish(buf, op, n)


def steps(n: int, nbytes: int) -> int:
    """Transfers on the critical path: down the leftmost branch, each parent serving its children in
    turn, once up and once down."""
    total, v = 0, 0
    while 2 * v + 1 < n:
        total += len(_children(v, n))
        v = 2 * v + 1
    return 2 * total


def sent_bytes(n: int, rank: int, count: int, itemsize: int, root: int = 0) -> int:
    """The whole vector to the parent, and to each child."""
    return ((rank > 0) + len(_children(rank, n))) * count * itemsize


def cost(n: int, nbytes: int, alpha: float, beta: float) -> float:
    """steps(n) · (α + m β)."""
    return steps(n, 0) * (alpha + beta * nbytes)
