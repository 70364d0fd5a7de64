"""Comm over MPI through mpi4py (torch's own MPI backend is absent from registry builds).

Tensors are CPU tensors handed to MPI as zero-copy NumPy views. MPI has no bfloat16 type, so bfloat16
moves as raw 16-bit words where nothing is reduced, and reductions on it are refused. Async ops use
MPI-3 nonblocking collectives; their completion is observed when waited on.
Exercised by: `pytest tests/test_comm.py -k mpi`.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from commprof.base.errors import UnsupportedError
from commprof.comm.base import Comm

_NUMPY = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
          torch.bfloat16: np.int16, torch.int8: np.int8, torch.uint8: np.uint8, torch.int16: np.int16,
          torch.int32: np.int32, torch.int64: np.int64, torch.bool: np.bool_}
"""The NumPy dtype MPI sees for each torch dtype (bfloat16: its raw 16-bit words)."""

IDLE_POLL_S = 1e-3
"""How often an idle rank's barrier looks for its peers: short against any point's warm-up and timed loop."""


class MpiComm(Comm):
    """An mpi4py communicator behind the Comm interface."""

    backend = "mpi"

    def __init__(self, *, comm, clock, recorder=None) -> None:
        super().__init__(rank=comm.Get_rank(), world_size=comm.Get_size(), device=torch.device("cpu"),
                         clock=clock, recorder=recorder)
        from mpi4py import MPI

        self._MPI = MPI
        self._comm = comm
        self._views: dict[int, tuple] = {}
        self._ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

    def _op(self, name: str):
        try:
            return self._ops[name]
        except KeyError:
            raise UnsupportedError(f"MPI has no {name} reduce op") from None

    def _buf(self, t: torch.Tensor):
        """Zero-copy NumPy array over the tensor's memory; bfloat16 as raw words (only valid where nothing
        is reduced).

        Made from the address, not with tensor.numpy(): torch marks a storage exported to NumPy as never
        resizable again, and fsdp frees and re-allocates its gathered buffers by resizing their storage.
        Arrays of the last two tensors are kept (the tensor pinned with them, so the memory stays
        valid while its address and size do): a benchmark or training loop hands the same buffers over
        and over, and building one costs a quarter of a small MPI op."""
        key = (t.data_ptr(), t.nbytes)
        hit = self._views.get(id(t))
        if hit is not None and hit[0] is t and hit[1] == key:
            return hit[2]
        if not t.is_contiguous():
            raise UnsupportedError("MPI sends contiguous tensors only")
        view = np.frombuffer(self._MPI.buffer.fromaddress(t.data_ptr(), t.nbytes), dtype=self._dtype(t))
        if len(self._views) >= 2:
            self._views.clear()  # never pin more than two stale buffers
        self._views[id(t)] = (t, key, view)
        return view

    @staticmethod
    def _dtype(t: torch.Tensor):
        try:
            return _NUMPY[t.dtype]
        except KeyError:
            raise UnsupportedError(f"MPI cannot move {t.dtype}") from None

    # ---- data plane ---------------------------------------------------------------------------
    def _all_reduce(self, tensor, op, output, async_op):
        c, buf = self._comm, self._buf(tensor)
        send, recv = (self._MPI.IN_PLACE, buf) if output is None else (buf, self._buf(output))
        if async_op:
            return c.Iallreduce(send, recv, op=self._op(op))
        c.Allreduce(send, recv, op=self._op(op))

    def _all_gather(self, output, input, async_op):
        c, out = self._comm, self._buf(output)
        inplace = input.data_ptr() == output.data_ptr() + self.rank * input.nbytes
        send = self._MPI.IN_PLACE if inplace else self._buf(input)
        return c.Iallgather(send, out) if async_op else c.Allgather(send, out)

    def _reduce_scatter(self, output, input, op, async_op):
        c = self._comm
        chunk = output.numel()
        if output.data_ptr() == input.data_ptr() + self.rank * output.nbytes:
            if async_op:
                raise UnsupportedError("MPI in-place reduce_scatter is synchronous only")
            # MPI_IN_PLACE leaves the result at the start of the buffer; NCCL's in-place contract
            # wants it in chunk `rank`, so it is moved there (part of the measured time). NumPy copies
            # a small chunk ~2 µs faster than slicing the tensor and copy_.
            buf = self._buf(input)
            c.Reduce_scatter_block(self._MPI.IN_PLACE, buf, op=self._op(op))
            if self.rank:
                buf[self.rank * chunk:(self.rank + 1) * chunk] = buf[:chunk]
            return None
        send, recv = self._buf(input), self._buf(output)
        if async_op:
            return c.Ireduce_scatter_block(send, recv, op=self._op(op))
        c.Reduce_scatter_block(send, recv, op=self._op(op))

    def _broadcast(self, tensor, src, async_op):
        c, buf = self._comm, self._buf(tensor)
        return c.Ibcast(buf, root=src) if async_op else c.Bcast(buf, root=src)

    def _reduce(self, tensor, dst, op, output, async_op):
        c, buf, root = self._comm, self._buf(tensor), self.rank == dst
        if output is None:
            send, recv = (self._MPI.IN_PLACE, buf) if root else (buf, None)
        else:
            send, recv = buf, (self._buf(output) if root else None)
        if async_op:
            return c.Ireduce(send, recv, op=self._op(op), root=dst)
        c.Reduce(send, recv, op=self._op(op), root=dst)

    def _all_to_all(self, output, input, async_op):
        c, out = self._comm, self._buf(output)
        send = self._MPI.IN_PLACE if input.data_ptr() == output.data_ptr() else self._buf(input)
        return c.Ialltoall(send, out) if async_op else c.Alltoall(send, out)

    def _send(self, tensor, dst, async_op):
        c, buf = self._comm, self._buf(tensor)
        return c.Isend(buf, dest=dst) if async_op else c.Send(buf, dest=dst)

    def _recv(self, tensor, src, async_op):
        c, buf = self._comm, self._buf(tensor)
        return c.Irecv(buf, source=src) if async_op else c.Recv(buf, source=src)

    def _sendrecv(self, send_tensor, recv_tensor, dst, src, async_op):
        c, send, recv = self._comm, self._buf(send_tensor), self._buf(recv_tensor)
        if async_op:
            return [c.Irecv(recv, source=src), c.Isend(send, dest=dst)]
        c.Sendrecv(send, dest=dst, recvbuf=recv, source=src)

    def _barrier(self):
        self._comm.Barrier()

    def _wait(self, work) -> None:
        if isinstance(work, list):
            self._MPI.Request.Waitall(work)
        else:
            work.Wait()

    # ---- control plane ------------------------------------------------------------------------
    def _gather_object(self, obj, dst):
        return self._comm.gather(obj, root=dst)

    def _broadcast_object(self, obj, src):
        return self._comm.bcast(obj, root=src)

    def _control_barrier(self, idle) -> None:
        if idle is None:
            self._comm.Barrier()
            return
        # An idle rank polls a nonblocking barrier with sleeps, where MPI_Barrier would spin on a core the
        # measuring ranks need; the others wait on the same kind, as MPI matches like with like.
        request = self._comm.Ibarrier()
        if not idle:
            request.Wait()
            return
        while not request.Test():
            time.sleep(IDLE_POLL_S)

    def close(self) -> None:
        # NumPy views that outlive the interpreter's teardown of torch abort the process at exit.
        self._views.clear()
        self.control = None

    def new_group(self, ranks: list[int], label: str = "group") -> "MpiComm | None":
        me = self.rank
        color = 0 if me in ranks else self._MPI.UNDEFINED
        sub = self._comm.Split(color, ranks.index(me) if me in ranks else 0)
        if sub == self._MPI.COMM_NULL:
            return None
        out = MpiComm(comm=sub, clock=self.clock, recorder=self.recorder)
        out.label, out.timeout_s, out.fault = label, self.timeout_s, self.fault
        out.members = [self.members[r] for r in ranks]
        return out
