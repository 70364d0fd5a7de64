"""Comm over torch.distributed: gloo on CPU, NCCL on GPU.

Synchronous NCCL ops are ordered on the current stream, so the CUDA events the clock records there
bracket the op exactly. Object exchange (results, host names) uses a separate gloo group so it never
touches the GPU or the timed stream. Exercised by: `pytest tests/test_comm.py -k gloo`.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch

from commprof.base.errors import UnsupportedError
from commprof.base.measurement import P2P
from commprof.comm.base import Comm
from commprof.comm.store import open_store
from commprof.comm.torch_own import c10d as dist  # torch's own: interpose.py rebinds distributed_c10d's names
from commprof.comm.torch_own import own
from commprof.comm.waiter import Waiter

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
}

# torch after 2.11 renamed the single-tensor collectives and warns on every call of the old names.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

class TorchComm(Comm):
    """torch.distributed process group (global or a subgroup) behind the Comm interface."""

    def __init__(self, *, backend: str, group, ranks: list[int], control_group, device, clock,
                 recorder=None) -> None:
        me = dist.get_rank()
        super().__init__(rank=ranks.index(me), world_size=len(ranks), device=device, clock=clock,
                         recorder=recorder)
        self.backend = backend
        self._group = group
        self._ranks = ranks
        self._control = control_group
        self.members = list(ranks)
        self._futureless: set[str] = set()
        """Ops whose works have no future on this backend (future_of)."""
        self._waiter: Waiter | None = None
        """The thread that waits on futureless collectives (comm/waiter.py), once one was issued async."""

    @classmethod
    def init(cls, *, backend: str, rank: int, world_size: int, addr: str, port: int,
             timeout_s: float, device: torch.device, clock) -> "TorchComm":
        kwargs = {"device_id": device} if backend == "nccl" else {}  # binds NCCL's communicator to the GPU
        store = open_store(addr, port, rank=rank, world_size=world_size, timeout_s=timeout_s)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s), **kwargs)
        control = dist.new_group(backend="gloo") if backend != "gloo" else None
        return cls(backend=backend, group=None, ranks=list(range(world_size)), control_group=control,
                   device=device, clock=clock)

    def _peer(self, r: int) -> int:
        return self._ranks[r]

    # ---- data plane ---------------------------------------------------------------------------
    def _all_reduce(self, tensor, op, output, async_op):
        if output is not None:
            raise UnsupportedError("torch.distributed has no out-of-place all_reduce")
        return dist.all_reduce(tensor, op=_OPS[op], group=self._group, async_op=async_op)

    def _all_gather(self, output, input, async_op):
        return _ALL_GATHER(output, input, group=self._group, async_op=async_op)

    def _reduce_scatter(self, output, input, op, async_op):
        return _REDUCE_SCATTER(output, input, op=_OPS[op], group=self._group, async_op=async_op)

    def _broadcast(self, tensor, src, async_op):
        return dist.broadcast(tensor, src=self._peer(src), group=self._group, async_op=async_op)

    def _reduce(self, tensor, dst, op, output, async_op):
        if output is not None:
            raise UnsupportedError("torch.distributed has no out-of-place reduce")
        return dist.reduce(tensor, dst=self._peer(dst), op=_OPS[op], group=self._group, async_op=async_op)

    def _all_to_all(self, output, input, async_op):
        return dist.all_to_all_single(output, input, group=self._group, async_op=async_op)

    def _send(self, tensor, dst, async_op):
        if async_op:
            return dist.isend(tensor, dst=self._peer(dst), group=self._group)
        dist.send(tensor, dst=self._peer(dst), group=self._group)

    def _recv(self, tensor, src, async_op):
        if async_op:
            return dist.irecv(tensor, src=self._peer(src), group=self._group)
        dist.recv(tensor, src=self._peer(src), group=self._group)

    def _sendrecv(self, send_tensor, recv_tensor, dst, src, async_op):
        if dst == self.rank and src == self.rank:
            # torch refuses a p2p op to oneself; NCCL does the same exchange as a local copy.
            recv_tensor.copy_(send_tensor)
            return [] if async_op else None
        # the receive posted first: gloo moves a send and a receive on one pair at once only in that order
        # (send first, a 4 MiB exchange between two hosts took twice the link's time)
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.irecv, recv_tensor, self._peer(src), self._group),
            dist.P2POp(dist.isend, send_tensor, self._peer(dst), self._group),
        ])
        if async_op:
            return works
        for work in works:
            work.wait()

    def _barrier(self):
        dist.barrier(group=self._group)

    def _wait(self, work) -> None:
        for w in work if isinstance(work, list) else (work,):
            w.wait()

    def _watch_completion(self, work, done, name: str) -> tuple:
        if isinstance(work, list):
            return None, None  # completion is seen at wait()
        future = None if name in self._futureless else self.future_of(work, name)
        if self.clock.kind == "cuda":
            # NCCL marks an op's future complete at issue, with its events; a callback chained on it runs at
            # once, on streams that wait on the op, and `done()` records the op's end there: when the op
            # finished on the device, not when the training stream next waits on it. gloo's future has no
            # CUDA streams (its callback runs on gloo's thread, on the default stream): it ends at wait().
            if future is not None and self.backend == "nccl":
                future.then(lambda _: done())
            return None, future
        if future is not None:
            future.add_done_callback(lambda _: done(time.perf_counter_ns()))
            return None, future
        if name in P2P:  # completion is seen at wait()
            return None, None
        if self._waiter is None:  # a collective without a future: a thread waits for it (comm/waiter.py)
            self._waiter = Waiter()
        return self._waiter.watch(work, done), None

    def future_of(self, work, name: str):
        """`work`'s future, or None where the backend gives op `name` none (gloo's send and recv). Known
        after the first ask: an ask that fails throws a C++ error with its backtrace, 8-15 µs, and a p2p op
        was asked twice (here and by interpose's Work) — 40 µs on an isend/irecv of 6 µs, a third of a
        pipeline step (benchmarks/profile_cost.py); Handle keeps the one it got."""
        if name in self._futureless or isinstance(work, list):
            return None
        try:
            return work.get_future()
        except RuntimeError:
            self._futureless.add(name)
            return None

    # ---- control plane ------------------------------------------------------------------------
    def _gather_object(self, obj, dst):
        group = self._control if self._control is not None else self._group
        out = [None] * self.world_size if self.rank == dst else None
        with own():  # its inner all_gather and gather are torch's, not the script's traffic
            dist.gather_object(obj, out, dst=self._peer(dst), group=group)
        return out

    def _broadcast_object(self, obj, src):
        group = self._control if self._control is not None else self._group
        box = [obj]
        with own():
            dist.broadcast_object_list(box, src=self._peer(src), group=group)
        return box[0]

    def _control_barrier(self, idle) -> None:  # gloo blocks in the kernel: no spinning to avoid
        group = self._control if self._control is not None else self._group
        dist.barrier(group=group)

    def new_group(self, ranks: list[int], label: str = "group") -> "TorchComm | None":
        members = [self._peer(r) for r in ranks]
        group = dist.new_group(members)
        control = dist.new_group(members, backend="gloo") if self.backend != "gloo" else None
        if dist.get_rank() not in members:
            return None
        sub = type(self)(backend=self.backend, group=group, ranks=members, control_group=control,
                         device=self.device, clock=self.clock, recorder=self.recorder)
        sub.label, sub.timeout_s, sub.fault = label, self.timeout_s, self.fault
        return sub

    def close(self) -> None:
        self.control = None
        if self._waiter is not None:
            self._waiter.close()
        if self._group is None and dist.is_initialized():
            dist.destroy_process_group()
