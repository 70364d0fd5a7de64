"""`torch-ddp` and `torch-fsdp`: PyTorch's own DistributedDataParallel and FSDP2 (`fully_shard`), measured
through the same interposition `commprof profile` uses, beside the strategies written on Comm.

    commprof run --strategy torch-ddp,ddp --model resnet18 --nproc 2
    commprof run --strategy torch-fsdp,fsdp --model gpt2-tiny --nproc 2

The run's world Comm becomes the default group's Comm of commprof/intercept/interpose.py, so every collective
torch's code makes through `torch.distributed` — FSDP2's all-gathers and reduce-scatters, DDP's buffer
broadcasts, and DDP's buckets through its reducer's own process group (commprof/intercept/ddp_reducer.py) —
lands in the same op log, timed, counted and NVTX-wrapped. DDP's reducer waits for its buckets at the end
of backward, in C++: the backward phase ends where autograd did and the rest is exposed comm
(record/hooks.py, split_backward).

`torch-ddp`: --bucket-mb is DDP's bucket_cap_mb; gradient accumulation uses `no_sync`; buffers are
broadcast from rank 0 every forward, as DDP does by default (predicted with the gradients). `torch-fsdp`:
`fully_shard` on each of the model's units — the units our `fsdp` wraps — then the root; FSDP2 shards each
parameter along dim 0, padded to a multiple of the world size: every unit gathered for forward and again
for backward (the root, kept after forward, once) per micro-batch, every gradient reduce-scattered once per
step (FSDP2 accumulates unsharded gradients while gradient sync is off), all padded bytes.
Exercised by: `pytest tests/test_strategies.py -k torch`.
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from commprof.intercept import ddp_reducer, interpose
from commprof.parallel.sizes import tensor_bytes
from commprof.record.hooks import split_backward
from commprof.strategies.base import Strategy, trainable


class TorchDDP(Strategy):
    """torch.nn.parallel.DistributedDataParallel, its traffic through Comm."""

    name = "torch-ddp"
    backends = ("gloo", "nccl")

    def setup(self) -> None:
        ddp_reducer.install(interpose.ensure(self.comm))
        self.ddp = DistributedDataParallel(self.model, bucket_cap_mb=self.config.bucket_mb)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ddp(x)

    def sync_context(self, last_micro: bool):
        return nullcontext() if last_micro else self.ddp.no_sync()

    def backward(self, loss: torch.Tensor, phases) -> None:
        with phases.phase("backward") as span:
            computed = split_backward(self.comm.recorder, loss, loss.backward)
            if self.comm.clock.kind != "cuda":  # host stamps: the phase's own clock
                span.end = computed

    def predict(self) -> dict[str, int]:
        out = {"all_reduce": tensor_bytes(self.params)}
        buffers = list(self.model.buffers())
        if buffers:  # every forward, on one rank as well
            out["broadcast"] = self.config.grad_accum * tensor_bytes(buffers)
        return out


class TorchFSDP(Strategy):
    """torch.distributed.fsdp.fully_shard (FSDP2) per unit, then the root; its traffic through Comm."""

    name = "torch-fsdp"
    backends = ("gloo", "nccl")

    def setup(self) -> None:
        interpose.ensure(self.comm)
        self._unit_params = [list(unit.parameters()) for unit in self.spec.units]
        in_units = {id(p) for ps in self._unit_params for p in ps}
        self._root_params = [p for p in self.model.parameters() if id(p) not in in_units]
        for unit in self.spec.units:
            fully_shard(unit)
        fully_shard(self.model)
        self.params = trainable(self.model)  # the sharded parameters (DTensors) from here on

    @contextmanager
    def sync_context(self, last_micro: bool):
        self.model.set_requires_gradient_sync(last_micro)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    def _padded(self, params) -> int:
        """Bytes of `params` as FSDP2 gathers them: dim 0 padded to a multiple of the world size."""
        n = self.world_size
        return sum(math.ceil(p.shape[0] / n) * n * (p.numel() // p.shape[0]) * p.element_size()
                   for p in params if p.dim() > 0)

    def predict(self) -> dict[str, int]:
        if self.world_size == 1:  # FSDP2 on one rank keeps whole parameters and sends nothing
            return {}
        micro = self.config.grad_accum
        gathers = sum(2 * self._padded(ps) for ps in self._unit_params) + self._padded(self._root_params)
        scatters = sum(self._padded([p for p in ps if p.requires_grad])
                       for ps in (*self._unit_params, self._root_params))
        return {"all_gather": micro * gathers, "reduce_scatter": scatters}  # gradients accumulate unsharded

    def full_state(self) -> dict[str, torch.Tensor]:
        return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
                for k, v in self.model.state_dict().items()}

    def held_bytes(self, module=None) -> dict[str, int]:
        def local(t):
            return t.to_local() if isinstance(t, DTensor) else t

        params = tensor_bytes(local(p) for p in self.model.parameters())
        grads = tensor_bytes(local(p.grad) for p in self.model.parameters() if p.grad is not None)
        state = tensor_bytes(local(v) for s in self.optimizer.state.values() for v in s.values()
                             if torch.is_tensor(v) and v.dim() > 0)
        return {"params": params, "grads": grads, "optimizer": state}
