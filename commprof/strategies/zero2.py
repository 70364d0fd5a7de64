"""`zero2`: ZeRO stage 2 — optimizer state and gradients sharded.

    commprof run --strategy zero2 --model resnet18 --nproc 2 --optimizer adam

As zero1, but the flat gradient is reduce-scattered instead of all-reduced: each rank receives only
the reduced gradient of its own slice and keeps nothing else between steps. Its slice is stepped and
the updated slices are all-gathered back into the full parameters. Communication per step: one
reduce_scatter and one all_gather of the parameter bytes — the same wire bytes as one all_reduce.
Exercised by: `pytest tests/unit/test_fake_comm_strategies.py` and `pytest tests/test_strategies.py -k cnn`.
"""

from __future__ import annotations

from commprof.strategies.base import Strategy
from commprof.strategies.zero1 import Zero1


class Zero2(Zero1):
    """Sharded optimizer state and gradients over replicated parameters."""

    name = "zero2"

    def setup(self) -> None:
        super().setup()
        self.grad_buffer = None  # the full gradient exists only while it is reduce-scattered
        self.shard_grad = self.flat.shard.detach().new_zeros(self.flat.shard_numel)

    def backward_done(self, phases) -> None:
        with phases.phase("backward"):
            full = self.flat.grads()
            for p in self.params:
                p.grad = None
        self.comm.reduce_scatter(self.shard_grad, full)
        del full
        self.flat.shard.grad = self.shard_grad.div_(self.world_size)

    def predict(self) -> dict[str, int]:
        return {"reduce_scatter": self.flat.nbytes(), "all_gather": self.flat.nbytes()}

    def held_bytes(self) -> dict[str, int]:
        held = Strategy.held_bytes(self)  # not zero1's full gradient buffer
        held["grads"] += self.shard_grad.nbytes
        return held
