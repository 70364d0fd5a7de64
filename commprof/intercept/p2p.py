"""The Interposer's point-to-point wrappers (intercept/interposer.py): send, recv, isend, irecv and
batch_isend_irecv with torch.distributed's signatures, each calling the Comm of the call's process group, and
the P2POp that accepts the rebound isend/irecv. A recv from any source, a tensor that is not contiguous and a
batch of more than one op on NCCL (NCCL needs them in one group call) run as torch's own, counted in `unseen`.

Exercised by: `pytest tests/test_interpose.py -k call_by_call` (tests/interpose_worker.py sends, receives and
batches p2p ops by every name).
"""

from __future__ import annotations

from torch.compiler import is_compiling
from torch.distributed import distributed_c10d as c10d

from commprof.comm import torch_own
from commprof.intercept.work import Work

_compiling = is_compiling
"""Whether torch.compile is tracing the call: the wrapper then hands it to torch's own (interposer.py says why)."""


class PointToPoint:
    """The Interposer's p2p wrappers; `comm(group)` and `_torch(name, …)` are the Interposer's."""

    def send(self, tensor, dst=None, group=None, tag=0, group_dst=None):
        if _compiling():
            return torch_own.c10d.send(tensor, dst=dst, group=group, tag=tag, group_dst=group_dst)
        comm = self.comm(group)
        if not tensor.is_contiguous():
            return self._torch("send", tensor, dst, group=group, tag=tag, group_dst=group_dst)
        comm.send(tensor, dst=_peer(comm, dst, group_dst))

    def recv(self, tensor, src=None, group=None, tag=0, group_src=None):
        if _compiling():
            return torch_own.c10d.recv(tensor, src=src, group=group, tag=tag, group_src=group_src)
        comm = self.comm(group)
        if (src is None and group_src is None) or not tensor.is_contiguous():  # any source: Comm names one
            return self._torch("recv", tensor, src, group=group, tag=tag, group_src=group_src)
        peer = _peer(comm, src, group_src)
        comm.recv(tensor, src=peer)
        return comm.members[peer]

    def isend(self, tensor, dst=None, group=None, tag=0, group_dst=None):
        if _compiling():
            return torch_own.c10d.isend(tensor, dst=dst, group=group, tag=tag, group_dst=group_dst)
        comm = self.comm(group)
        if not tensor.is_contiguous():
            return self._torch("isend", tensor, dst, group=group, tag=tag, group_dst=group_dst)
        return Work(comm.isend(tensor, dst=_peer(comm, dst, group_dst)))

    def irecv(self, tensor, src=None, group=None, tag=0, group_src=None):
        if _compiling():
            return torch_own.c10d.irecv(tensor, src=src, group=group, tag=tag, group_src=group_src)
        comm = self.comm(group)
        if (src is None and group_src is None) or not tensor.is_contiguous():
            return self._torch("irecv", tensor, src, group=group, tag=tag, group_src=group_src)
        return Work(comm.irecv(tensor, src=_peer(comm, src, group_src)))

    def batch_isend_irecv(self, p2p_op_list):
        if _compiling():
            return torch_own.c10d.batch_isend_irecv(p2p_op_list)
        if len(p2p_op_list) > 1 and c10d.get_backend(p2p_op_list[0].group) == "nccl":
            return self._torch("batch_isend_irecv", [_original(op) for op in p2p_op_list])
        works = []
        for op in p2p_op_list:  # gloo and MPI match each op on its own: issued one by one, in order
            comm, tensor = self.comm(op.group), op.tensor
            send = _ORIGINAL.get(op.op, op.op) is c10d.isend
            if not tensor.is_contiguous():  # isend's and irecv's own path, inlined: a pipeline sends many
                peer = {"group_dst" if send else "group_src": op.group_peer}
                works.append(self._torch("isend" if send else "irecv", tensor, group=op.group, tag=op.tag, **peer))
            elif send:
                works.append(Work(comm.isend(tensor, dst=op.group_peer)))
            else:
                works.append(Work(comm.irecv(tensor, src=op.group_peer)))
        return works


def _peer(comm, rank, group_rank) -> int:
    """The group rank of a p2p peer given as a global rank or as a group rank."""
    return group_rank if group_rank is not None else comm.members.index(rank)


class P2POp(c10d.P2POp):
    """torch's P2POp, taking the rebound isend/irecv as well as torch's own (its check knows only those)."""

    def __new__(cls, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        return super().__new__(cls, _ORIGINAL.get(op, op), tensor, peer, group, tag, group_peer)


def _original(op):
    """A torch P2POp of `op`, with torch's own isend/irecv (for torch's own batch_isend_irecv)."""
    return c10d.P2POp(_ORIGINAL.get(op.op, op.op), op.tensor, group=op.group, tag=op.tag, group_peer=op.group_peer)


_ORIGINAL: dict = {}
"""Rebound function -> torch's own, while installed. Module-level on purpose: held by the Interposer, the
wrappers (which hold its methods) would make a cycle, and its process groups would then wait for the cyclic
collector — which may run after destroy_process_group, and a gloo group freed then aborts the process."""
