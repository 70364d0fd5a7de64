"""`zero1`: ZeRO stage 1 — optimizer state sharded, gradients all-reduced whole.

    commprof run --strategy zero1 --model resnet18 --nproc 2 --optimizer adam

Every rank holds the full parameters and full gradients, but the optimizer (and its momentum / Adam
moments) only for its 1/world_size slice of the flat parameter vector. After backward the flat
gradient is all-reduced; each rank steps its slice; the updated slices are all-gathered back into the
full parameters. Communication: one all_reduce and one all_gather of the parameter bytes per step.
Exercised by: `pytest tests/unit/test_fake_comm_strategies.py` and `pytest tests/test_strategies.py -k cnn`.
"""

from __future__ import annotations

from commprof.parallel.flat import FlatShards
from commprof.strategies.base import Strategy


class Zero1(Strategy):
    """Sharded optimizer state over replicated parameters and gradients."""

    name = "zero1"

    def setup(self) -> None:
        self.flat = FlatShards(self.params, rank=self.comm.rank, world_size=self.world_size)
        self.grad_buffer = self.flat.empty()
        self.param_buffer = self.flat.empty()

    def optimizer_params(self):
        return [self.flat.shard]

    def my_slice(self, full):
        lo = self.flat.rank * self.flat.shard_numel
        return full[lo:lo + self.flat.shard_numel]

    def backward_done(self, phases) -> None:
        with phases.phase("backward"):  # packing gradients is part of the backward pass's work
            self.flat.grads(self.grad_buffer)
        self.comm.all_reduce(self.grad_buffer)
        self.flat.shard.grad = self.my_slice(self.grad_buffer).div_(self.world_size)
        for p in self.params:
            p.grad = None

    def after_step(self, phases) -> None:
        self.comm.all_gather(self.param_buffer, self.flat.shard.detach())
        with phases.phase("step"):
            self.flat.load(self.param_buffer)

    def predict(self) -> dict[str, int]:
        return {"all_reduce": self.flat.nbytes(), "all_gather": self.flat.nbytes()}

    def held_bytes(self) -> dict[str, int]:
        held = super().held_bytes()
        held["grads"] += self.grad_buffer.nbytes  # the full gradient stays allocated between steps
        return held
