"""`ddp`: gradients in buckets of --bucket-mb, each all-reduced from backward hooks the moment it is
full, so communication overlaps the rest of backward — DistributedDataParallel's design, on Comm.

    commprof run --strategy ddp --model resnet18 --nproc 2 --bucket-mb 25

Parameters go into buckets in reverse registration order (roughly the order backward produces their
gradients). A hook after each gradient's accumulation copies it into its bucket; the last gradient of a
bucket issues an async all_reduce of the whole bucket. After backward, every bucket is waited on (that
wait is the exposed communication), averaged, and handed back as the gradients. With gradient
accumulation, hooks stay quiet until the last micro-batch (DDP's no_sync). A parameter that gets no
gradient in a step is sent as zeros, so every rank issues the same ops in the same order.
Exercised by: `pytest tests/unit/test_fake_comm_strategies.py` and `pytest tests/test_strategies.py -k cnn`.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from commprof.parallel.sizes import tensor_bytes
from commprof.strategies.base import Strategy


class Bucket:
    """A flat gradient buffer for a run of parameters, and its all_reduce once issued."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.offsets = []
        offset = 0
        for p in params:
            self.offsets.append(offset)
            offset += p.numel()
        self.buffer = params[0].detach().new_zeros(offset)
        self.pending = len(params)
        self.handle = None

    def put(self, index: int, grad: torch.Tensor | None) -> None:
        p, offset = self.params[index], self.offsets[index]
        chunk = self.buffer[offset:offset + p.numel()]
        if grad is None:
            chunk.zero_()
        else:
            chunk.copy_(grad.reshape(-1))
        self.pending -= 1


def make_buckets(params: list[torch.nn.Parameter], cap_bytes: int) -> list[Bucket]:
    """Reverse-order runs of parameters of at most `cap_bytes` each (a bigger tensor goes alone)."""
    buckets, run, size = [], [], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if run and size + nbytes > cap_bytes:
            buckets.append(Bucket(run))
            run, size = [], 0
        run.append(p)
        size += nbytes
    if run:
        buckets.append(Bucket(run))
    return buckets


class DDP(Strategy):
    """Bucketed all_reduce of gradients, issued during backward."""

    name = "ddp"

    def bucket_bytes(self) -> int:
        return int(self.config.bucket_mb * 2 ** 20)

    def setup(self) -> None:
        self.buckets = make_buckets(self.params, self.bucket_bytes())
        self._where = {}
        for bucket in self.buckets:
            for i, p in enumerate(bucket.params):
                self._where[p] = (bucket, i)
                p.register_post_accumulate_grad_hook(self._on_grad)
        self._sync = True
        self._issued: list[Bucket] = []

    @contextmanager
    def sync_context(self, last_micro: bool):
        self._sync = last_micro
        try:
            yield
        finally:
            self._sync = True

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        if not self._sync:
            return
        bucket, index = self._where[p]
        bucket.put(index, p.grad)
        if bucket.pending == 0:
            self._issue(bucket)

    def _issue(self, bucket: Bucket) -> None:
        bucket.handle = self.comm.all_reduce(bucket.buffer, async_op=True)
        self._issued.append(bucket)

    def backward_done(self, phases) -> None:
        for bucket in self.buckets:  # buckets whose parameters got no gradient this step
            if bucket.handle is None:
                for i, p in enumerate(bucket.params):
                    if p.grad is None:
                        bucket.put(i, None)
                self._issue(bucket)
        for bucket in self._issued:
            bucket.handle.wait()
            bucket.handle = None
            bucket.pending = len(bucket.params)
            bucket.buffer.div_(self.world_size)
            for p, offset in zip(bucket.params, bucket.offsets):
                p.grad = bucket.buffer[offset:offset + p.numel()].view_as(p)
        self._issued = []

    def predict(self) -> dict[str, int]:
        return {"all_reduce": tensor_bytes(self.params)}
