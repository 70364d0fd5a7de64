"""`naive-dp`: after backward, one all_reduce per parameter gradient, then average. No overlap.

    commprof run --strategy naive-dp --model mnist-cnn --nproc 2

Not used in practice, but the right starting point: every replica computes gradients on its shard of
the global batch, and the mean of those gradients is the gradient of the global batch. The studies'
"vanilla" data parallelism; `ddp` is the same arithmetic with buckets issued during backward.
Exercised by: `pytest tests/unit/test_fake_comm_strategies.py` and `pytest tests/test_strategies.py -k cnn`.
"""

from __future__ import annotations

from commprof.parallel.sizes import tensor_bytes
from commprof.strategies.base import Strategy


class NaiveDP(Strategy):
    """Data parallel, one blocking all_reduce per parameter after backward."""

    name = "naive-dp"

    def backward_done(self, phases) -> None:
        for p in self.params:
            if p.grad is None:  # a parameter unused this step still takes part: every rank calls every op
                p.grad = p.detach().new_zeros(p.shape)
            self.comm.all_reduce(p.grad)
            p.grad.div_(self.world_size)

    def predict(self) -> dict[str, int]:
        return {"all_reduce": tensor_bytes(self.params)}
