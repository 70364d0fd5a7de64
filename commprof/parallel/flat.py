"""A run of parameters as one flat vector cut into world_size equal shards (the ZeRO/FSDP layout).

The vector is padded with zeros to a multiple of world_size so every shard has the same length: the
tensor flavours of all_gather and reduce_scatter need equal chunks. Shard `rank` is an ordinary
parameter the optimizer updates; SGD and Adam are elementwise, so updating shards equals updating
the whole. Exercised by: `pytest tests/unit/test_fake_comm_strategies.py` (zero1, zero2, fsdp).
"""

from __future__ import annotations

import torch


class FlatShards:
    """Layout of `params` in one padded flat vector, and this rank's shard of it."""

    def __init__(self, params: list[torch.nn.Parameter], *, rank: int, world_size: int) -> None:
        self.params = params
        self.rank, self.world_size = rank, world_size
        self.offsets, total = [], 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        self.numel = total
        self.shard_numel = -(-total // world_size)
        self.padded = self.shard_numel * world_size
        first = params[0]
        self.dtype, self.device = first.dtype, first.device
        full = self.flatten([p.detach() for p in params])
        lo = rank * self.shard_numel
        self.shard = torch.nn.Parameter(full[lo:lo + self.shard_numel].clone())
        """This rank's slice: the tensor the optimizer owns."""

    def empty(self) -> torch.Tensor:
        return torch.zeros(self.padded, dtype=self.dtype, device=self.device)

    def flatten(self, tensors, out: torch.Tensor | None = None) -> torch.Tensor:
        """Tensors (None = zeros) laid out flat, padded."""
        out = self.empty() if out is None else out
        for t, p, offset in zip(tensors, self.params, self.offsets):
            chunk = out[offset:offset + p.numel()]
            if t is None:
                chunk.zero_()
            else:
                chunk.copy_(t.reshape(-1))
        out[self.numel:].zero_()
        return out

    def grads(self, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.flatten([p.grad for p in self.params], out)

    def views(self, full: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's slice of a full flat vector, shaped like the parameter."""
        return [full[o:o + p.numel()].view_as(p) for p, o in zip(self.params, self.offsets)]

    def load(self, full: torch.Tensor) -> None:
        """Copy a gathered full vector into the parameters."""
        with torch.no_grad():
            for p, view in zip(self.params, self.views(full)):
                p.copy_(view)

    def nbytes(self) -> int:
        """Bytes of the padded full vector: the payload of one all_gather or reduce_scatter of it."""
        return self.padded * self.shard.element_size()
