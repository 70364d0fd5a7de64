"""Functional collectives through Comm: the ops `torch.distributed._functional_collectives` dispatches
(`torch.ops._c10d_functional.*`), which DTensor redistribution, tensor-parallel layers, FSDP2's
`clip_grad_norm_` and `full_tensor()`, and `torch.compile`d graphs all reach, whether called from Python or
from compiled code.

    functional.install(interposer)   # CPU tensors: each op through the Comm of its process group
    functional.uninstall()

`install` gives these ops CPU kernels of commprof's own (torch.library, over torch's
CompositeExplicitAutograd kernel): each issues the op on its group's Comm — timed, counted and NVTX-wrapped
there like every other op — and hands torch the Work to wait on (`wait_tensor`, which the result's first use
or the compiled graph calls), so the result completes as torch's would. Routed: all_reduce (and in place),
all_gather_into_tensor (and _out), reduce_scatter_tensor, broadcast (and in place), all_to_all_single with
equal splits, and the coalesced forms (all_reduce_coalesced and in place, all_gather_into_tensor_coalesced,
reduce_scatter_tensor_coalesced), each as one op over its tensors laid end to end — what gloo itself sends
for them. Run by torch's own kernel and counted in `unseen` as "functional <op>": a reduction Comm has no
form for, unequal splits, tensors of several dtypes in one coalesced call, and every op on a device other
than the CPU (NCCL's stream order is torch's to keep).

Exercised by: `pytest tests/test_profile_cli.py -k "functional or compiled or native"`.
"""

from __future__ import annotations

from functools import partial

import torch
from torch.distributed import distributed_c10d as c10d

from commprof.comm.torch_own import own
from commprof.intercept.interposer import one_dtype
from commprof.intercept.opaque import opaque
from commprof.intercept.work import Work

_REDUCE = {"sum": "sum", "avg": "avg", "product": "prod", "min": "min", "max": "max"}
"""Functional reduce-op names → Comm's."""

COALESCED = ("all_reduce_coalesced", "all_reduce_coalesced_", "all_gather_into_tensor_coalesced",
             "reduce_scatter_tensor_coalesced")
"""The coalesced forms: each one flat op on CPU tensors."""

_LIB: list = []
_TORCH = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


def install(interposer) -> None:
    """Route the functional collectives of CPU tensors through `interposer`'s Comms; count the rest in
    `interposer.unseen`."""
    if _LIB:
        return
    ops = torch.ops._c10d_functional
    lib = torch.library.Library("_c10d_functional", "IMPL")
    _LIB.append(lib)
    kernels = _Kernels(interposer)
    for name in ("all_reduce", "all_reduce_", "all_gather_into_tensor", "all_gather_into_tensor_out",
                 "reduce_scatter_tensor", "broadcast", "broadcast_", "all_to_all_single", *COALESCED):
        if hasattr(ops, name):
            lib.impl(name, getattr(kernels, name), "CPU")
            lib.impl(name, kernels.counted(name), "CUDA")


def uninstall() -> None:
    while _LIB:
        _LIB.pop()._destroy()


class _Kernels:
    """The CPU kernels: torch's signatures, Comm's calls."""

    def __init__(self, interposer) -> None:
        self._interposer = interposer

    def _comm(self, group_name):
        group = c10d._resolve_process_group(group_name) if isinstance(group_name, str) else group_name
        return self._interposer.comm(group)

    def _torch(self, name: str, *args, **kwargs):
        """torch's own kernel for op `name`, counted as unseen."""
        self._interposer.unseen[f"functional {name}"] += 1
        with own():  # counted here: the group's backend (intercept/seen.py) must not count it again
            return getattr(torch.ops._c10d_functional, name).default.redispatch(_TORCH, *args, **kwargs)

    def counted(self, name: str):
        return partial(self._torch, name)

    @staticmethod
    def _pending(out, handle, after=None):
        """`out` (a tensor or a list of them), completed when torch's wait_tensor waits on the op (interpose's
        Work: Comm's wait, then `after`, which fills the outputs of a coalesced op, once)."""
        work = Work(handle, after)
        for tensor in out if isinstance(out, list) else (out,):
            torch._C._distributed_c10d._register_work(tensor, work)
        return out

    def all_reduce_(self, input, reduce_op, group_name):
        op = _REDUCE.get(reduce_op.lower())
        if op is None or not input.is_contiguous():
            return self._torch("all_reduce_", input, reduce_op, group_name)
        return self._pending(input, self._comm(group_name).all_reduce(input, op=op, async_op=True))

    def all_reduce(self, input, reduce_op, group_name):
        if _REDUCE.get(reduce_op.lower()) is None:
            return self._torch("all_reduce", input, reduce_op, group_name)
        return self.all_reduce_(input.clone(memory_format=torch.contiguous_format), reduce_op, group_name)

    def all_gather_into_tensor_out(self, input, group_size, group_name, *, out):
        if not out.is_contiguous():
            return self._torch("all_gather_into_tensor_out", input, group_size, group_name, out=out)
        comm = self._comm(group_name)
        return self._pending(out, comm.all_gather(out, input.contiguous(), async_op=True))

    def all_gather_into_tensor(self, input, group_size, group_name):
        out = input.new_empty((input.shape[0] * group_size, *input.shape[1:]) if input.dim() else (group_size,))
        return self.all_gather_into_tensor_out(input, group_size, group_name, out=out)

    def reduce_scatter_tensor(self, input, reduce_op, group_size, group_name):
        op = _REDUCE.get(reduce_op.lower())
        if op is None or input.dim() == 0 or input.shape[0] % group_size:
            return self._torch("reduce_scatter_tensor", input, reduce_op, group_size, group_name)
        out = input.new_empty((input.shape[0] // group_size, *input.shape[1:]))
        comm = self._comm(group_name)
        return self._pending(out, comm.reduce_scatter(out, input.contiguous(), op=op, async_op=True))

    def broadcast_(self, input, src, group_name):
        if not input.is_contiguous():
            return self._torch("broadcast_", input, src, group_name)
        # src is a rank of the group, as torch's kernel passes it to the group's broadcast
        return self._pending(input, self._comm(group_name).broadcast(input, src=src, async_op=True))

    def broadcast(self, input, src, group_name):
        return self.broadcast_(input.clone(memory_format=torch.contiguous_format), src, group_name)

    def all_to_all_single(self, input, output_split_sizes, input_split_sizes, group_name):
        comm = self._comm(group_name)
        rows = input.shape[0] if input.dim() else 0
        equal = rows % comm.world_size == 0 and all(
            list(splits) in ([], [rows // comm.world_size] * comm.world_size)
            for splits in (output_split_sizes, input_split_sizes))
        if not equal:  # Comm's all_to_all has equal chunks only
            return self._torch("all_to_all_single", input, output_split_sizes, input_split_sizes, group_name)
        out = torch.empty_like(input, memory_format=torch.contiguous_format)
        return self._pending(out, comm.all_to_all(out, input.contiguous(), async_op=True))

    # ---- the coalesced forms: one op over the tensors laid end to end ----------------------------------
    def all_reduce_coalesced_(self, inputs, reduce_op, group_name):
        op = _REDUCE.get(reduce_op.lower())
        if op is None or not one_dtype(inputs):
            return self._torch("all_reduce_coalesced_", inputs, reduce_op, group_name)
        flat = torch.cat([t.reshape(-1) for t in inputs])
        handle = self._comm(group_name).all_reduce(flat, op=op, async_op=True)

        def unflatten() -> None:
            for t, piece in zip(inputs, flat.split([t.numel() for t in inputs])):
                t.copy_(piece.view(t.shape))

        return self._pending(list(inputs), handle, unflatten)

    def all_reduce_coalesced(self, inputs, reduce_op, group_name):
        if _REDUCE.get(reduce_op.lower()) is None:
            return self._torch("all_reduce_coalesced", inputs, reduce_op, group_name)
        return self.all_reduce_coalesced_([t.clone(memory_format=torch.contiguous_format) for t in inputs],
                                          reduce_op, group_name)

    def all_gather_into_tensor_coalesced(self, inputs, group_size, group_name):
        if not one_dtype(inputs):
            return self._torch("all_gather_into_tensor_coalesced", inputs, group_size, group_name)
        flat = torch.cat([t.reshape(-1) for t in inputs])
        gathered = flat.new_empty(group_size * flat.numel())
        handle = self._comm(group_name).all_gather(gathered, flat, async_op=True)
        outs = [t.new_empty((t.shape[0] * group_size, *t.shape[1:]) if t.dim() else (group_size,)) for t in inputs]

        def unflatten() -> None:  # rank r's piece of tensor i lies at [r, offset_i : offset_i + numel_i]
            by_rank = gathered.view(group_size, -1).split([t.numel() for t in inputs], dim=1)
            for out, piece in zip(outs, by_rank):
                out.view(group_size, -1).copy_(piece)

        return self._pending(outs, handle, unflatten)

    def reduce_scatter_tensor_coalesced(self, inputs, reduce_op, group_size, group_name):
        op = _REDUCE.get(reduce_op.lower())
        if op is None or not one_dtype(inputs) or any(t.dim() == 0 or t.shape[0] % group_size for t in inputs):
            return self._torch("reduce_scatter_tensor_coalesced", inputs, reduce_op, group_size, group_name)
        # rank-major: chunk r of every tensor, then chunk r + 1 of every tensor
        flat = torch.cat([t.reshape(group_size, -1) for t in inputs], dim=1).reshape(-1)
        reduced = flat.new_empty(flat.numel() // group_size)
        handle = self._comm(group_name).reduce_scatter(reduced, flat, op=op, async_op=True)
        outs = [t.new_empty((t.shape[0] // group_size, *t.shape[1:])) for t in inputs]

        def unflatten() -> None:
            for out, piece in zip(outs, reduced.split([o.numel() for o in outs])):
                out.copy_(piece.view(out.shape))

        return self._pending(outs, handle, unflatten)


opaque(_Kernels)
