"""`mpi-dp`: Horovod-style data parallelism — gradients fused into one buffer and all-reduced through
mpi4py.

    commprof run --strategy mpi-dp --backend mpi --model resnet18 --nproc 2

Horovod's tensor fusion packs ready gradients into a fusion buffer (HOROVOD_FUSION_THRESHOLD, 64 MiB
by default) and issues one MPI all-reduce per full buffer. Here backward hooks copy each gradient into
the fusion buffer as it is produced and a full buffer goes out as an MPI non-blocking all-reduce; the
rest after backward. --bucket-mb sets the threshold (default 64 for this strategy). MPI progresses a
non-blocking collective mostly inside the wait, so little of it overlaps backward: the report shows it.
Exercised by: `pytest tests/test_strategies.py -k mpi`.
"""

from __future__ import annotations

from commprof.strategies.ddp import DDP

FUSION_MB = 64.0
"""Horovod's default fusion threshold."""


class MpiDP(DDP):
    """Fused gradient all-reduce over MPI."""

    name = "mpi-dp"
    backends = ("mpi",)

    def bucket_bytes(self) -> int:
        mb = self.config.bucket_mb if self.config.bucket_mb_given else FUSION_MB
        return int(mb * 2 ** 20)
