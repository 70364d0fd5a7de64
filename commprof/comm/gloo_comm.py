"""GlooComm: Comm over a gloo process group, its data plane calling the ProcessGroup's own methods.

torch.distributed's functions (`all_reduce`, `broadcast`, …) are a Python layer over the ProcessGroup's
methods of the same names: they dispatch tensor subclasses and TorchFunctionModes, view complex tensors as
real, queue the call inside `_coalescing_manager`, map global ranks to group ranks, build an options object,
then call the method and wait on its Work. Between two ops that layer runs with cold caches, and here it
costs 9-15 µs per op at 1 rank and ~30 µs at 2, where Comm's whole path takes 2-3 µs in a loop
(`python benchmarks/gloo_layers.py`, `benchmarks/interpose_overhead.py`). For gloo, whose ops run on this
host, GlooComm makes the same method call itself, with options built once and the group ranks it already
holds; a call that needs the layer — a complex tensor, a tensor subclass with `__torch_function__` or an
active TorchFunctionMode, a call inside `_coalescing_manager` — goes through torch's function as TorchComm's
does. NCCL keeps torch's functions (TorchComm): there the options choose the stream an op runs on.

Exercised by: `pytest tests/test_comm.py -k gloo`.
"""

from __future__ import annotations

from torch._C import _has_torch_function_unary
from torch.distributed import distributed_c10d as dist

from commprof.comm.torch_comm import _OPS, TorchComm

_PG = dist.ProcessGroup
_WORLD = dist._world
"""torch's record of its groups: `_default_pg` the default one (an attribute; the function is a call more)."""
# torch 2.10 renamed the single-tensor methods; the old names stay for older torch
_ALL_GATHER = "all_gather_single" if hasattr(_PG, "all_gather_single") else "_allgather_base"
_REDUCE_SCATTER = "reduce_scatter_single" if hasattr(_PG, "reduce_scatter_single") else "_reduce_scatter_base"
_ALL_TO_ALL = "all_to_all_single" if hasattr(_PG, "all_to_all_single") else "alltoall_base"
GLOO_BEHIND: dict = {}
"""id(process group) -> its gloo backend, for a group whose CPU backend comm/seen.py put itself in front of:
GlooComm calls gloo there itself (calling the group would pass through that Python backend:
+31 to +43 µs an op, `python benchmarks/seen_backend.py`)."""


def _options(kind, async_op: bool, **fields):
    opts = kind()
    opts.asyncOp = async_op
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


def _reduce_options(kind) -> dict:
    """(op name, async_op) -> options of `kind` with that reduction: built once, read by every call."""
    return {(name, a): _options(kind, a, reduceOp=op) for name, op in _OPS.items() for a in (False, True)}


class GlooComm(TorchComm):
    """TorchComm on gloo whose collectives and point-to-point calls go straight to the ProcessGroup."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._coalescing = _WORLD._pg_coalesce_state
        """torch's calls queued by `_coalescing_manager`, per group (the dict itself: its property is a call)."""
        self._allreduce_opts = _reduce_options(dist.AllreduceOptions)
        self._reduce_scatter_opts = _reduce_options(dist.ReduceScatterOptions)
        self._all_gather_opts = (_options(dist.AllgatherOptions, False), _options(dist.AllgatherOptions, True))
        self._all_to_all_opts = (_options(dist.AllToAllOptions, False), _options(dist.AllToAllOptions, True))

    def _process_group(self, *tensors):
        """The ProcessGroup to call (its gloo backend, where comm/seen.py stands in front of it), or None where
        torch's Python layer has work to do for this call (see the module docstring) or the default group is gone
        (torch's function then says so)."""
        if self._coalescing:
            return None
        for t in tensors:  # a loop, not any() over a generator: two calls less on every op
            if t.is_complex() or _has_torch_function_unary(t):
                return None
        # looked up per call, never held: a Comm sits in a reference cycle with its op log, and a gloo group
        # that only the cyclic collector frees may be freed at interpreter exit, while gloo's threads still
        # run — the process then aborts ("terminate called without an active exception")
        pg = self._group if self._group is not None else _WORLD._default_pg
        return GLOO_BEHIND.get(id(pg), pg)

    def _all_reduce(self, tensor, op, output, async_op):  # _process_group inlined: the op most calls are
        pg = self._group if self._group is not None else _WORLD._default_pg
        if output is not None or pg is None or self._coalescing or tensor.is_complex() \
                or _has_torch_function_unary(tensor):
            return super()._all_reduce(tensor, op, output, async_op)
        work = GLOO_BEHIND.get(id(pg), pg).allreduce([tensor], self._allreduce_opts[op, async_op])
        if async_op:
            return work
        work.wait()

    def _all_gather(self, output, input, async_op):
        pg = self._process_group(output, input)
        if pg is None:
            return super()._all_gather(output, input, async_op)
        work = getattr(pg, _ALL_GATHER)(output, input, self._all_gather_opts[async_op])
        if async_op:
            return work
        work.wait()

    def _reduce_scatter(self, output, input, op, async_op):
        pg = self._process_group(output, input)
        if pg is None:
            return super()._reduce_scatter(output, input, op, async_op)
        work = getattr(pg, _REDUCE_SCATTER)(output, input, self._reduce_scatter_opts[op, async_op])
        if async_op:
            return work
        work.wait()

    def _broadcast(self, tensor, src, async_op):
        pg = self._process_group(tensor)
        if pg is None:
            return super()._broadcast(tensor, src, async_op)
        work = pg.broadcast([tensor], _options(dist.BroadcastOptions, async_op, rootRank=src, rootTensor=0))
        if async_op:
            return work
        work.wait()

    def _reduce(self, tensor, dst, op, output, async_op):
        pg = self._process_group(tensor)
        if output is not None or pg is None:
            return super()._reduce(tensor, dst, op, output, async_op)
        work = pg.reduce([tensor], _options(dist.ReduceOptions, async_op, reduceOp=_OPS[op], rootRank=dst))
        if async_op:
            return work
        work.wait()

    def _all_to_all(self, output, input, async_op):
        pg = self._process_group(output, input)
        if pg is None:
            return super()._all_to_all(output, input, async_op)
        work = getattr(pg, _ALL_TO_ALL)(output, input, [], [], self._all_to_all_opts[async_op])
        if async_op:
            return work
        work.wait()

    def _send(self, tensor, dst, async_op):  # _process_group inlined: a pipeline's many messages
        pg = self._group if self._group is not None else _WORLD._default_pg
        if pg is None or self._coalescing or tensor.is_complex() or _has_torch_function_unary(tensor):
            return super()._send(tensor, dst, async_op)
        work = GLOO_BEHIND.get(id(pg), pg).send([tensor], dst, 0)
        if async_op:
            return work
        work.wait()

    def _recv(self, tensor, src, async_op):  # _process_group inlined: a pipeline's many messages
        pg = self._group if self._group is not None else _WORLD._default_pg
        if pg is None or self._coalescing or tensor.is_complex() or _has_torch_function_unary(tensor):
            return super()._recv(tensor, src, async_op)
        work = GLOO_BEHIND.get(id(pg), pg).recv([tensor], src, 0)
        if async_op:
            return work
        work.wait()

    def _sendrecv(self, send_tensor, recv_tensor, dst, src, async_op):
        pg = self._process_group(send_tensor, recv_tensor)
        if (dst == self.rank and src == self.rank) or pg is None:
            return super()._sendrecv(send_tensor, recv_tensor, dst, src, async_op)
        # the receive posted first, as TorchComm's does (gloo's order for one pair)
        works = [pg.recv([recv_tensor], src, 0), pg.send([send_tensor], dst, 0)]
        if async_op:
            return works
        for work in works:
            work.wait()


def comm_class(backend: str) -> type[TorchComm]:
    """The Comm for a torch.distributed backend: GlooComm for gloo, TorchComm for the others."""
    return GlooComm if backend == "gloo" else TorchComm
