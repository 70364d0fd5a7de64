"""DistributedDataParallel's traffic through Comm: its reducer's bucket all-reduces, its coalesced broadcasts
(the parameters and buffers at construction, the buffers before every forward) and its constructor's shape
check, which its C++ code would otherwise send where nothing sees them.

    ddp_reducer.install(interposer)   # every DDP built from now on: buckets and broadcasts through the
                                      # Comm of its process group

DDP's C++ reducer is handed a process group of its own whose backend is `Routed`: the reducer's
all-reduces (each bucket's, and the unused-parameter bitmap of `find_unused_parameters`) and the bucket order
it broadcasts from rank 0 once, at the second step's forward (two int32 tensors, a few hundred bytes: in the
warm-up, or in that iteration's volume where there is none), go through the Comm of DDP's process group,
timed, counted and NVTX-wrapped; whatever else it asks goes to the group's own backend, counted in `unseen`
("ddp <op>"). DDP keeps its own
arithmetic and schedule: with no comm hook, the reducer still divides each gradient by the world size while
copying it into its bucket (a comm hook gets the bucket undivided and must make one more pass over it: 3 %
of a ResNet-18 step on 2 CPU ranks) and starts each bucket's all-reduce from its autograd hook as before. A
comm hook the script registers replaces the reducer's all-reduce; its collectives, made through
`torch.distributed`, are interposed anyway. `torch.distributed._broadcast_coalesced`, which DDP (and FSDP's
sync_module_states) call from Python, is rebound: each run of tensors torch's would coalesce — one dtype, at
most the bucket's bytes — is one flat broadcast through Comm. The shape check of DDP's constructor
(`torch.distributed._verify_params_across_processes`: an all_gather of parameter counts, a broadcast of rank
0's sizes and strides) is made here as torch's C++ makes it, through Comm.

Exercised by: `pytest tests/test_profile_cli.py -k ddp`.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend, Work

from commprof.comm.torch_own import own
from commprof.intercept.opaque import opaque

_SAVED: dict = {}


class _Routing:
    """What DDP's reducer is handed instead of its group: SUM all-reduces and broadcasts of one contiguous
    tensor (what the reducer asks for: its buckets, the unused-parameter bitmap, the bucket order it
    broadcasts from rank 0 at the second forward) through `comm`; anything else to the group's own backend as
    it was asked, counted in `unseen`."""

    def __init__(self, comm, group, unseen) -> None:
        super().__init__(group.rank(), group.size())
        self._comm, self._group, self._unseen = comm, group, unseen

    def allreduce(self, tensors, opts):
        if len(tensors) == 1 and opts.reduceOp == dist.ReduceOp.SUM and tensors[0].is_contiguous():
            return Logged(self._comm.all_reduce(tensors[0], async_op=True))
        return self._torch("allreduce", tensors, opts)

    def broadcast(self, tensors, opts):
        if len(tensors) == 1 and opts.rootTensor == 0 and tensors[0].is_contiguous():
            return Logged(self._comm.broadcast(tensors[0], src=opts.rootRank, async_op=True))
        return self._torch("broadcast", tensors, opts)

    def allgather(self, outputs, inputs, opts):
        return self._torch("allgather", outputs, inputs, opts)

    def barrier(self, opts):
        return self._torch("barrier", opts)

    def _torch(self, name: str, *args):
        """The group's own op, as it was asked: counted here, and the group's backend (intercept/seen.py) lets
        it pass."""
        self._unseen[f"ddp {name}"] += 1
        with own():
            return getattr(self._group, name)(*args)

    def getBackendName(self) -> str:
        return self._group.name()


class Routed(_Routing, Backend):
    """A process group's backend (torch 2.12 and later let Python subclass Backend)."""


class RoutedGroup(_Routing, dist.ProcessGroup):
    """The same as a whole process group, for torch 2.11 and earlier, whose Backend has no Python constructor:
    the reducer calls a ProcessGroup's collectives through torch's Python trampoline for it."""


class Logged(Work):
    """What the reducer waits on: the op's future, chained so it completes only once Comm has logged the op
    (on CPU Handle.get_future completes after the op's logging) — a reducer woken by the backend's own
    future could end the step first. On CUDA the op is complete on a stream that waits on it, from a
    callback chained at issue (Handle.complete_on_stream): run on an H100 (tests/test_gpu.py), the bucket
    all-reduce is logged."""

    def __init__(self, handle) -> None:
        super().__init__()
        self._future = handle.get_future().then(partial(_logged, handle))

    def get_future(self):
        return self._future

    def wait(self, timeout=None) -> bool:
        self._future.wait()
        return True


@opaque
def _logged(handle, done):
    """The reducer's future's value, once Comm has logged the op (on CUDA: complete on the reducer's stream)."""
    try:
        if handle._comm.clock.kind == "cuda":
            handle.complete_on_stream()
        return done.value()
    except Exception as exc:  # named as every Comm failure is; the reducer re-raises it as its own
        raise handle._comm.failure(handle._name, exc) from exc


opaque(Routed)
opaque(RoutedGroup)
opaque(Logged)


def routed_group(comm, group, unseen) -> tuple[dist.ProcessGroup, Routed]:
    """A process group of `group`'s rank and size whose backend, on every device type `group` has, is
    Routed; and that backend, which its holder keeps alive (C++ holds it, but its methods are Python's)."""
    try:
        backend = Routed(comm, group, unseen)
    except TypeError:  # "No constructor defined": torch 2.11 or earlier
        routed = RoutedGroup(comm, group, unseen)
        for device_type in group._device_types:  # what DDP's logger looks up; the collectives stay routed's
            device = torch.device(device_type)
            real = group._get_backend(device)
            kind = getattr(dist.ProcessGroup.BackendType, real.name().upper(), dist.ProcessGroup.BackendType.CUSTOM)
            routed._register_backend(device, kind, real)
            routed._set_default_backend(kind)
        return routed, routed
    out = dist.ProcessGroup(group.rank(), group.size())
    custom = dist.ProcessGroup.BackendType.CUSTOM
    for device_type in group._device_types:
        out._register_backend(torch.device(device_type), custom, backend)
    out._set_default_backend(custom)
    return out, backend


def install(interposer) -> None:
    """Patch DDP so each instance routes its traffic through `interposer`'s Comms."""
    if _SAVED:
        return
    _SAVED.update(reducer=dist.Reducer, broadcast=dist._broadcast_coalesced,
                  verify=dist._verify_params_across_processes)

    class Reducer(_SAVED["reducer"]):
        def __init__(self, params, buckets, limits, process_group, *rest, **kwargs):
            self._commprof_routed = routed_group(interposer.comm(process_group), process_group,
                                                   interposer.unseen)
            super().__init__(params, buckets, limits, self._commprof_routed[0], *rest, **kwargs)

    def broadcast_coalesced(process_group, tensors, buffer_size, src=0):
        comm = interposer.comm(process_group)
        for chunk in _chunks(list(tensors), buffer_size):
            flat = torch.cat([t.detach().reshape(-1) for t in chunk])
            comm.broadcast(flat, src=src)
            for t, piece in zip(chunk, flat.split([t.numel() for t in chunk])):
                t.detach().copy_(piece.view(t.shape))

    def verify_params(process_group, tensors, logger=None):
        if not tensors:
            return _SAVED["verify"](process_group, tensors, logger)
        return _verify_params(interposer.comm(process_group), list(tensors))

    dist.Reducer = Reducer
    dist._broadcast_coalesced = broadcast_coalesced
    dist._verify_params_across_processes = verify_params


def _verify_params(comm, params: list) -> None:
    """DDP's check that every rank holds rank 0's model, as torch's C++ makes it, through `comm`: an
    all_gather of each rank's parameter count, then a broadcast of rank 0's sizes and strides (one int64 each),
    which every rank compares with its own; a mismatch raises torch's RuntimeError, in torch's words."""
    device = params[0].device
    counts = torch.empty(comm.world_size, dtype=torch.long, device=device)
    comm.all_gather(counts, torch.tensor([len(params)], dtype=torch.long, device=device))
    for rank, count in enumerate(counts.tolist()):
        if count != len(params):
            raise RuntimeError(f"DDP expects same model across all ranks, but Rank {comm.rank} has {len(params)} "
                               f"params, while rank {rank} has inconsistent {count} params.")
    mine = [v for t in params for v in (*t.shape, *t.stride())]
    # broadcast even when empty (every parameter a scalar), as torch's is: a rank whose model differs then
    # fails at this broadcast on every rank, not one op later on some
    theirs = torch.tensor(mine, dtype=torch.long, device=device)
    comm.broadcast(theirs, src=0)
    theirs, at = theirs.tolist(), 0
    for p, t in enumerate(params):
        n = t.dim()
        for what, start in (("sizes", at), ("strides", at + n)):
            if theirs[start:start + n] != mine[start:start + n]:
                raise RuntimeError(f"[{comm.rank}]: params[{p}] in this process with sizes {list(t.shape)} appears "
                                   f"not to match {what} of the same param in process 0.")
        at += 2 * n


def _chunks(tensors: list, limit: int) -> list[list]:
    """`tensors` as torch's coalesced broadcast cuts them: by dtype and device, in order, each run at most
    `limit` bytes (a larger tensor alone)."""
    runs: dict[tuple, list[list]] = {}
    held: dict[tuple, int] = {}  # bytes in each kind's last run
    for t in tensors:
        key, nbytes = (t.dtype, t.device), t.nbytes
        kind = runs.setdefault(key, [[]])
        if kind[-1] and held[key] + nbytes > limit:
            kind.append([])
            held[key] = 0
        kind[-1].append(t)
        held[key] = held.get(key, 0) + nbytes
    return [run for kind in runs.values() for run in kind if run]


def uninstall() -> None:
    if _SAVED:
        dist.Reducer = _SAVED["reducer"]
        dist._broadcast_coalesced = _SAVED["broadcast"]
        dist._verify_params_across_processes = _SAVED["verify"]
        _SAVED.clear()
