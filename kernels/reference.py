"""What each collective must produce, computed on one process from every rank's input: the
`expected` of every algorithm module (an algorithm changes how, never what).

`inputs[r]` is rank r's input tensor, laid out as the Comm method of the same name takes it.
Exercised by: `pytest tests/test_kernels.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a tensor is made: the kernels' cost models load without torch
    import torch


def _reduce(stacked: torch.Tensor, op: str) -> torch.Tensor:
    if op == "sum":
        return stacked.sum(0, dtype=stacked.dtype)
    if op == "avg":
        return stacked.sum(0, dtype=stacked.dtype) / stacked.shape[0]
    if op == "prod":
        return stacked.prod(0, dtype=stacked.dtype)
    if op == "min":
        return stacked.amin(0)
    return stacked.amax(0)


def all_reduce(inputs: list[torch.Tensor], rank: int, op: str = "sum", root: int = 0) -> torch.Tensor:
    import torch

    return _reduce(torch.stack(inputs), op)


def reduce_scatter(inputs: list[torch.Tensor], rank: int, op: str = "sum", root: int = 0) -> torch.Tensor:
    return all_reduce(inputs, rank, op).chunk(len(inputs))[rank]


def all_gather(inputs: list[torch.Tensor], rank: int, op: str = "sum", root: int = 0) -> torch.Tensor:
    import torch

    return torch.cat(inputs)


def broadcast(inputs: list[torch.Tensor], rank: int, op: str = "sum", root: int = 0) -> torch.Tensor:
    return inputs[root].clone()


def all_to_all(inputs: list[torch.Tensor], rank: int, op: str = "sum", root: int = 0) -> torch.Tensor:
    import torch

    n = len(inputs)
    return torch.cat([x.chunk(n)[rank] for x in inputs])
