"""The Interposer: wrappers with torch.distributed's signatures that call the Comm of the call's process group.

A wrapper finds the Comm of the call's group (made on first use, labelled "world" or by its ranks, e.g.
"ranks0-1") and calls it, so the op is timed, counted and NVTX-wrapped in Comm's one place; an async call
returns a Work (intercept/work.py) whose `wait()` is Comm's. What Comm has no form for runs as torch's own
and is counted in `unseen` by name: a PREMUL_SUM reduction, unequal all_to_all splits, an async barrier, a
tensor that is not contiguous, recv from any source, a batch of more than one p2p op on NCCL (NCCL needs them
in one group call), an async or mixed-dtype coalesced call. all_reduce_coalesced and all_gather_coalesced
(synchronous) are one op over the tensors laid end to end: what gloo sends for them. intercept/interpose.py
binds these wrappers to torch.distributed's names.

Exercised by: `pytest tests/test_interpose.py`.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.compiler import is_compiling
from torch.distributed import distributed_c10d as c10d

from commprof.comm import torch_own
from commprof.comm.gloo_comm import comm_class
from commprof.comm.torch_comm import TorchComm
from commprof.intercept.p2p import PointToPoint
from commprof.intercept.work import work as _work
from commprof.record import aligned
from commprof.record.clock import CpuClock, CudaClock
from commprof.record.recorder import OpRecorder

_OPS = {c10d.ReduceOp.SUM: "sum", c10d.ReduceOp.PRODUCT: "prod", c10d.ReduceOp.MIN: "min",
        c10d.ReduceOp.MAX: "max", c10d.ReduceOp.AVG: "avg"}

_SUM = c10d.ReduceOp.SUM
_WORLD = c10d._world
"""torch's record of its process groups; its `_default_pg` is the default group (an attribute: the property
and _get_default_group() are calls, and each Python call costs about 1 µs right after a gloo op)."""


class Interposer(PointToPoint):
    """The Comms of a script's process groups, sharing one op log."""

    def __init__(self, recorder: OpRecorder | None = None) -> None:
        self.recorder = recorder
        """The op log every group's Comm shares; made with the first Comm when not given."""
        self.unseen: Counter = Counter()
        """Calls run as torch's own, by name: what Comm has no form for."""
        self._comms: dict[int, tuple] = {}
        """id(process group) -> (the group, its Comm): the group is kept so its id is never reused."""
        self.fault = None
        """This rank's injected faults (COMMPROF_FAULT, comm/failure/faults.py), given to every group's Comm."""

    def comm(self, group) -> TorchComm:
        """The Comm of `group` (None: the default group), made on its first call."""
        hit = self._comms.get(id(group if group is not None else _WORLD._default_pg))
        if hit is not None:
            return hit[1]
        pg = group if group is not None else c10d._get_default_group()
        backend = c10d.get_backend(pg)
        cuda = backend == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        if self.recorder is None:  # one clock and one op log for every group of the script
            self.recorder = OpRecorder(CudaClock() if cuda else CpuClock())
        ranks = c10d.get_process_group_ranks(pg)
        world = pg is c10d._get_default_group()
        comm = comm_class(backend)(backend=backend, group=None if world else pg, ranks=ranks, control_group=None,
                                   device=device, clock=self.recorder.clock, recorder=self.recorder)
        comm.label = "world" if world else _label(ranks)
        comm.fault = self.fault
        aligned.join(comm)  # a group first used inside an aligned iteration
        self._comms[id(pg)] = (pg, comm)
        return comm

    def group_names(self) -> dict[str, tuple[str, int]]:
        """torch's name of each of the script's live process groups (what its flight record names them by) ->
        (the label its ops are counted under, its size)."""
        default, out = _WORLD._default_pg, {}
        for pg in list(_WORLD.pg_map):
            try:
                ranks = c10d.get_process_group_ranks(pg)
            except (RuntimeError, ValueError, KeyError):
                continue
            out[pg.group_name] = ("world" if pg is default else _label(ranks), len(ranks))
        for pg, comm in list(self._comms.values()):
            out[pg.group_name] = (comm.label, comm.world_size)
        return out

    def adopt(self, comm: TorchComm, group=None) -> None:
        """Use `comm`, a strategy's own Comm over process group `group` (None: the default group), for
        that group's calls: its label and op log."""
        pg = group if group is not None else c10d._get_default_group()
        self._comms[id(pg)] = (pg, comm)
        self.recorder = comm.recorder

    # ---- the wrappers: torch's signatures, Comm's calls ---------------------------------------------
    def all_reduce(self, tensor, op=c10d.ReduceOp.SUM, group=None, async_op=False):
        if _compiling():
            return torch_own.c10d.all_reduce(tensor, op=op, group=group, async_op=async_op)
        name = "sum" if op is _SUM else _OPS.get(op)  # hashing a ReduceOp costs µs: SUM by identity first
        if name is None or not tensor.is_contiguous():
            return self._torch("all_reduce", tensor, op=op, group=group, async_op=async_op)
        return _work(self.comm(group).all_reduce(tensor, op=name, async_op=async_op))

    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False):
        if _compiling():
            return torch_own.c10d.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
        if not (output_tensor.is_contiguous() and input_tensor.is_contiguous()):
            return self._torch("all_gather_into_tensor", output_tensor, input_tensor, group=group,
                               async_op=async_op)
        return _work(self.comm(group).all_gather(output_tensor, input_tensor, async_op=async_op))

    def all_gather_single(self, output_tensor, input_tensor, group=None, async_op=False):
        if _compiling():
            return torch_own.c10d.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)
        return self.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)

    def reduce_scatter_single(self, output, input, op=c10d.ReduceOp.SUM, group=None, async_op=False):
        if _compiling():
            return torch_own.c10d.reduce_scatter_single(output, input, op=op, group=group, async_op=async_op)
        return self.reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)

    def all_gather(self, tensor_list, tensor, group=None, async_op=False):
        if _compiling():
            return torch_own.c10d.all_gather(tensor_list, tensor, group=group, async_op=async_op)
        comm = self.comm(group)
        flat = torch.empty(comm.world_size * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
        handle = comm.all_gather(flat, tensor.contiguous().view(-1), async_op=async_op)

        def scatter_out() -> None:  # torch's list form: each rank's piece in its own tensor
            for out, piece in zip(tensor_list, flat.view(comm.world_size, *tensor.shape)):
                out.copy_(piece)

        return _work(handle, scatter_out)

    def reduce_scatter_tensor(self, output, input, op=c10d.ReduceOp.SUM, group=None, async_op=False):
        if _compiling():
            return torch_own.c10d.reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)
        name = _OPS.get(op)
        if name is None or not (output.is_contiguous() and input.is_contiguous()):
            return self._torch("reduce_scatter_tensor", output, input, op=op, group=group, async_op=async_op)
        return _work(self.comm(group).reduce_scatter(output, input, op=name, async_op=async_op))

    def reduce_scatter(self, output, input_list, op=c10d.ReduceOp.SUM, group=None, async_op=False):
        if _compiling():
            return torch_own.c10d.reduce_scatter(output, input_list, op=op, group=group, async_op=async_op)
        name = _OPS.get(op)
        if name is None or not output.is_contiguous():
            return self._torch("reduce_scatter", output, input_list, op=op, group=group, async_op=async_op)
        flat = torch.cat([t.reshape(-1) for t in input_list])
        return _work(self.comm(group).reduce_scatter(output, flat, op=name, async_op=async_op))

    def broadcast(self, tensor, src=None, group=None, async_op=False, group_src=None):
        if _compiling():
            return torch_own.c10d.broadcast(tensor, src=src, group=group, async_op=async_op, group_src=group_src)
        comm = self.comm(group)
        root = group_src if group_src is not None else comm.members.index(src)
        if not tensor.is_contiguous():
            return self._torch("broadcast", tensor, src=src, group=group, async_op=async_op, group_src=group_src)
        return _work(comm.broadcast(tensor, src=root, async_op=async_op))

    def reduce(self, tensor, dst=None, op=c10d.ReduceOp.SUM, group=None, async_op=False, group_dst=None):
        if _compiling():
            return torch_own.c10d.reduce(tensor, dst=dst, op=op, group=group, async_op=async_op, group_dst=group_dst)
        comm, name = self.comm(group), _OPS.get(op)
        if name is None or not tensor.is_contiguous():
            return self._torch("reduce", tensor, dst=dst, op=op, group=group, async_op=async_op,
                               group_dst=group_dst)
        root = group_dst if group_dst is not None else comm.members.index(dst)
        return _work(comm.reduce(tensor, dst=root, op=name, async_op=async_op))

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op=False):
        if _compiling():
            return torch_own.c10d.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group=group,
                                                    async_op=async_op)
        if output_split_sizes or input_split_sizes:  # Comm's all_to_all has equal chunks only
            return self._torch("all_to_all_single", output, input, output_split_sizes, input_split_sizes,
                               group=group, async_op=async_op)
        return _work(self.comm(group).all_to_all(output, input, async_op=async_op))

    def all_to_all(self, output_tensor_list, input_tensor_list, group=None, async_op=False):
        if _compiling():
            return torch_own.c10d.all_to_all(output_tensor_list, input_tensor_list, group=group, async_op=async_op)
        shapes = {t.shape for t in (*output_tensor_list, *input_tensor_list)}
        if len(shapes) != 1:  # Comm's all_to_all has equal chunks only
            return self._torch("all_to_all", output_tensor_list, input_tensor_list, group=group, async_op=async_op)
        comm = self.comm(group)
        flat_in = torch.cat([t.reshape(-1) for t in input_tensor_list])
        flat_out = torch.empty_like(flat_in)
        handle = comm.all_to_all(flat_out, flat_in, async_op=async_op)

        def scatter_out() -> None:
            for out, piece in zip(output_tensor_list, flat_out.view(len(output_tensor_list), -1)):
                out.copy_(piece.view(out.shape))

        return _work(handle, scatter_out)

    def barrier(self, group=None, async_op=False, device_ids=None, timeout=None):
        if _compiling():
            return torch_own.c10d.barrier(group=group, async_op=async_op, device_ids=device_ids, timeout=timeout)
        if async_op or timeout is not None:
            return self._torch("barrier", group=group, async_op=async_op, device_ids=device_ids, timeout=timeout)
        self.comm(group).barrier()
        return None

    def all_reduce_coalesced(self, tensors, op=c10d.ReduceOp.SUM, group=None, async_op=False):
        """One all_reduce over the tensors laid end to end, as gloo sends them (synchronous calls; torch's
        async form returns a bare Future, which nothing here could fill the tensors from)."""
        if _compiling():
            return torch_own.c10d.all_reduce_coalesced(tensors, op=op, group=group, async_op=async_op)
        name = _OPS.get(op)
        if async_op or name is None or not one_dtype(tensors) or tensors[0].is_complex():
            return self._torch("all_reduce_coalesced", tensors, op=op, group=group, async_op=async_op)
        flat = torch.cat([t.reshape(-1) for t in tensors])
        self.comm(group).all_reduce(flat, op=name)
        for t, piece in zip(tensors, flat.split([t.numel() for t in tensors])):
            t.copy_(piece.view(t.shape))

    def all_gather_coalesced(self, output_tensor_lists, input_tensor_list, group=None, async_op=False):
        """One all_gather of the tensors laid end to end (synchronous calls, as all_reduce_coalesced)."""
        if _compiling():
            return torch_own.c10d.all_gather_coalesced(output_tensor_lists, input_tensor_list, group=group,
                                                       async_op=async_op)
        if async_op or not one_dtype(input_tensor_list) or input_tensor_list[0].is_complex():
            return self._torch("all_gather_coalesced", output_tensor_lists, input_tensor_list, group=group,
                               async_op=async_op)
        comm = self.comm(group)
        flat = torch.cat([t.reshape(-1) for t in input_tensor_list])
        gathered = flat.new_empty(comm.world_size * flat.numel())
        comm.all_gather(gathered, flat)
        for outs, row in zip(output_tensor_lists, gathered.view(comm.world_size, -1)):
            for out, piece in zip(outs, row.split([t.numel() for t in input_tensor_list])):
                out.copy_(piece.view(out.shape))

    def _torch(self, name: str, *args, **kwargs):
        """torch's own `name`, counted as unseen; whatever it calls by distributed_c10d's names is torch's too
        (all_gather_into_tensor calls all_gather_single: not a second op)."""
        if _compiling():
            return getattr(torch_own.c10d, name)(*args, **kwargs)
        self.unseen[name] += 1
        with torch_own.own():
            return getattr(torch_own.c10d, name)(*args, **kwargs)


_compiling = is_compiling
"""Whether torch.compile is tracing the call (True only then, constant-folded in the graph; ~0.1 µs a call
eagerly). A traced wrapper hands the call to torch's own function, which dynamo rewrites into a functional
collective — counted when the compiled graph runs it (intercept/functional.py) — or breaks the graph at, as
it would without commprof, the call then running eagerly through the wrapper. Without it dynamo would trace
commprof's own code and break the script's graph inside it."""


def one_dtype(tensors) -> bool:
    """Whether the tensors of a coalesced call can be laid end to end in one: at least one, all of one dtype."""
    return bool(tensors) and len({t.dtype for t in tensors}) == 1


def _label(ranks: list[int]) -> str:
    if ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"ranks{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else f"rank{ranks[0]}"
    return "ranks" + ",".join(map(str, ranks))
