"""Interposition: a script's torch.distributed collectives routed through Comm, the script unchanged.

    interposer = interpose.install()      # before the script runs
    ...                                   # the script: dist.init_process_group(...); dist.all_reduce(t); …
    interposer.recorder.ops               # every call, timed and counted; NVTX-wrapped as it ran
    interpose.uninstall()

`install` rebinds the collectives of the `torch.distributed` namespace — the names scripts and most
libraries call (`dist.all_reduce`, …) — to wrappers with torch's signatures, and the same names in
`distributed_c10d`, the module that defines them: a call by that module's name is routed too, and so are
the collectives torch's object functions make there (`all_gather_object`: two all_gathers, the sizes then
the pickles; `broadcast_object_list`: two broadcasts). A wrapper finds the Comm of the call's process group
(made on first use, labelled "world" or by its ranks, e.g. "ranks0-1") and calls it, so the op is timed,
counted and NVTX-wrapped in Comm's one place; async calls return a Work whose `wait()` is Comm's. Comm's
torch backend calls torch's own functions (comm/torch_own.py), and whatever runs inside `torch_own.own()` —
Comm's own object exchanges, a call left to torch — finds torch's own behind every rebound name: an op is
never counted twice, and commprof's control traffic is never the script's.

Routed: all_reduce, all_gather_into_tensor, all_gather (list), reduce_scatter_tensor, reduce_scatter (list),
broadcast, reduce, all_to_all (equal shapes), all_to_all_single (equal splits), barrier, send, recv, isend,
irecv, batch_isend_irecv; sync and async, any process group; all_reduce_coalesced and all_gather_coalesced,
synchronous, as one op over the tensors laid end to end (what gloo sends for them). `P2POp` becomes a
subclass that accepts the rebound isend/irecv (torch's own check compares against its originals; pipelining
compares `op.op` with `dist.isend`, which stays true). Run as torch's own and counted in `unseen` (by
name): what Comm has no form for (a PREMUL_SUM reduction, unequal all_to_all splits, an async barrier, a
tensor that is not contiguous, recv from any source, a batch of more than one p2p op on NCCL — NCCL needs
them in one group call, an async or mixed-dtype coalesced call), and gather, scatter and monitored_barrier,
which Comm has no form for at all.
Functional collectives are not these functions' to see: intercept/functional.py routes them. What no wrapper
sees — calls made from C++, a group's own methods, isend, irecv and batch_isend_irecv by `distributed_c10d`'s
name (torch compares a P2POp's op with that module's own by identity, so those stay torch's there) — reaches
the group's gloo backend, where intercept/seen.py sees it.

Exercised by: `pytest tests/test_interpose.py`.
"""

from __future__ import annotations

from collections import Counter
from functools import partial, update_wrapper

import torch
import torch.distributed as dist
from torch.compiler import is_compiling
from torch.distributed import distributed_c10d as c10d

from commprof.comm import torch_own
from commprof.comm.gloo_comm import comm_class
from commprof.comm.torch_comm import TorchComm
from commprof.intercept import compiling
from commprof.intercept.opaque import opaque
from commprof.record import aligned
from commprof.record.clock import CpuClock, CudaClock
from commprof.record.recorder import OpRecorder

_OPS = {c10d.ReduceOp.SUM: "sum", c10d.ReduceOp.PRODUCT: "prod", c10d.ReduceOp.MIN: "min",
        c10d.ReduceOp.MAX: "max", c10d.ReduceOp.AVG: "avg"}

_SUM = c10d.ReduceOp.SUM
_WORLD = c10d._world
"""torch's record of its process groups; its `_default_pg` is the default group (an attribute: the property
and _get_default_group() are calls, and each Python call costs about 1 µs right after a gloo op)."""

ROUTED = ("all_reduce", "all_gather_into_tensor", "all_gather", "reduce_scatter_tensor", "reduce_scatter",
          "broadcast", "reduce", "all_to_all", "all_to_all_single", "barrier", "send", "recv", "isend", "irecv",
          "batch_isend_irecv", "all_gather_single", "reduce_scatter_single", "all_reduce_coalesced",
          "all_gather_coalesced")
"""The `torch.distributed` names install() rebinds (those this torch has: the `_single` names, FSDP2's,
are new in 2.10)."""
UNSEEN = ("gather", "scatter", "monitored_barrier")
"""Collectives Comm has no form for, rebound only to be counted in `unseen` as they run as torch's own."""
P2P_BY_NAME = ("isend", "irecv", "batch_isend_irecv")
"""Names rebound in the `torch.distributed` namespace only, never in distributed_c10d: torch's P2POp and
batch_isend_irecv compare an op with that module's own isend and irecv by identity."""


class Work(c10d.Work):
    """What an async call returns: a torch Work (libraries test `isinstance(w, dist.Work)` before waiting;
    FSDP2 does) over Comm's Handle, so the wait is Comm's, timed."""

    def __init__(self, handle, after=None) -> None:
        super().__init__()
        self._handle, self._after = handle, after
        self._future = handle.backend_future()  # taken now: the handle lets its backend work go once waited on

    def wait(self, timeout=None) -> bool:
        self._handle.wait()
        # torch's work goes with the wait, as Handle's does: one kept past destroy_process_group keeps
        # gloo's threads alive and the process aborts at exit
        if self._future is not None and not self._future.done():
            self._future.wait()
        self._future = None
        if self._after is not None:
            after, self._after = self._after, None
            after()
        return True

    def is_completed(self) -> bool:
        return self._handle.is_completed()

    def get_future(self):
        if self._future is None:
            if self._handle.is_completed():  # waited on: an already completed future
                done = torch.futures.Future()
                done.set_result(None)
                return done
            raise RuntimeError("this backend's work has no future")
        return self._handle.logged(self._future)  # on CPU, what chains on it runs once the op is in the log


opaque(Work)  # waited on from C++ (torch's wait_tensor) while compiled code runs


class Interposer:
    """The Comms of a script's process groups, sharing one op log."""

    def __init__(self, recorder: OpRecorder | None = None) -> None:
        self.recorder = recorder
        """The op log every group's Comm shares; made with the first Comm when not given."""
        self.unseen: Counter = Counter()
        """Calls run as torch's own, by name: what Comm has no form for."""
        self._comms: dict[int, tuple] = {}
        """id(process group) -> (the group, its Comm): the group is kept so its id is never reused."""
        self.fault = None
        """This rank's injected faults (COMMPROF_FAULT, comm/faults.py), given to every group's Comm."""

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
            send = _ORIGINAL.get(op.op, op.op) is c10d.isend
            call = self.isend if send else self.irecv
            peer = {"group_dst" if send else "group_src": op.group_peer}
            works.append(call(op.tensor, group=op.group, tag=op.tag, **peer))
        return works

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
        if _compiling():
            return getattr(torch_own.c10d, name)(*args, **kwargs)
        """torch's own `name`, counted as unseen; whatever it calls by distributed_c10d's names is torch's too
        (all_gather_into_tensor calls all_gather_single: not a second op)."""
        self.unseen[name] += 1
        with torch_own.own():
            return getattr(torch_own.c10d, name)(*args, **kwargs)


_compiling = is_compiling
"""Whether torch.compile is tracing the call (True only then, constant-folded in the graph; ~0.1 µs a call
eagerly). A traced wrapper hands the call to torch's own function, which dynamo rewrites into a functional
collective — counted when the compiled graph runs it (intercept/functional.py) — or breaks the graph at, as
it would without commprof, the call then running eagerly through the wrapper. Without it dynamo would trace
commprof's own code and break the script's graph inside it."""


def _work(handle, after=None):
    """None for a synchronous call (after has run); a Work for an async one."""
    if handle is None:
        if after is not None:
            after()
        return None
    return Work(handle, after)


def one_dtype(tensors) -> bool:
    """Whether the tensors of a coalesced call can be laid end to end in one: at least one, all of one dtype."""
    return bool(tensors) and len({t.dtype for t in tensors}) == 1


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


def _label(ranks: list[int]) -> str:
    if ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"ranks{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else f"rank{ranks[0]}"
    return "ranks" + ",".join(map(str, ranks))


_ACTIVE: Interposer | None = None


def install(recorder: OpRecorder | None = None) -> Interposer:
    """Rebind torch.distributed's collectives to a new Interposer's wrappers (logging into `recorder`);
    returns it. The names are rebound in the `torch.distributed` namespace, where scripts and libraries
    call them, and in distributed_c10d, for calls by that module's name and for torch's helpers that call
    them there (all_gather_object's all_gathers, broadcast_object_list's broadcasts)."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("torch.distributed is already interposed")
    # loaded first: it keeps distributed_c10d's functions, as it finds them, as the keys of the table by which
    # torch.compile rewrites a traced call into a functional collective (see _compiling); loaded later, it
    # would keep the rebound names
    import torch.distributed._functional_collectives  # noqa: F401
    _ACTIVE = Interposer(recorder)
    for name in _routed():
        original = getattr(torch_own.c10d, name)
        rebound = _wrapper(original, getattr(_ACTIVE, name))
        _ORIGINAL[rebound] = original
        _BOUND[name] = (rebound, _by_name(original, rebound) if name not in P2P_BY_NAME else original)
    for name in _unseen():
        original = getattr(torch_own.c10d, name)
        counted = update_wrapper(partial(_ACTIVE._torch, name), original)
        _BOUND[name] = (counted, _by_name(original, counted))
    _show()
    compiling.install(_hide, _show)
    return _ACTIVE


_BOUND: dict = {}
"""name -> (what `torch.distributed` holds for it, what distributed_c10d holds), while installed."""


def _show(*_) -> None:
    """commprof's wrappers behind torch.distributed's names."""
    for name, (by_dist, by_c10d) in _BOUND.items():
        setattr(dist, name, by_dist)
        setattr(c10d, name, by_c10d)
    dist.P2POp = P2POp


def _hide(*_) -> None:
    """torch's own functions behind the names (while torch.compile traces: intercept/compiling.py)."""
    for name in _BOUND:
        original = getattr(torch_own.c10d, name)
        setattr(dist, name, original)
        setattr(c10d, name, original)
    dist.P2POp = c10d.P2POp


def _routed() -> list[str]:
    return [name for name in ROUTED if hasattr(c10d, name)]


def _unseen() -> list[str]:
    return [name for name in UNSEEN if hasattr(c10d, name)]


def _wrapper(original, route):
    """A callable that looks like torch's (name, docstring, signature) and is `route`: a partial of the
    Interposer's method, called without a Python frame of its own (a wrapping function's frame cost about
    2 µs per op right after a gloo op)."""
    return update_wrapper(partial(route.__func__, route.__self__), original)


def _by_name(original, route):
    """distributed_c10d's `original` rebound: `route`, except inside torch_own.own() — Comm's own calls into
    torch, whose bodies call these names too — where it is torch's own. A frame of its own: this path is
    the less travelled one (scripts call the `torch.distributed` names)."""
    def call(*args, **kwargs):
        if torch_own.active():
            return original(*args, **kwargs)
        return route(*args, **kwargs)
    return update_wrapper(call, original)


def ensure(comm: TorchComm) -> Interposer:
    """The process's Interposer — installed now if it is not yet — with `comm` as the default group's."""
    interposer = _ACTIVE if _ACTIVE is not None else install(comm.recorder)
    interposer.adopt(comm)
    return interposer


def uninstall() -> None:
    """torch.distributed's own functions back."""
    global _ACTIVE
    compiling.uninstall()
    _hide()
    _BOUND.clear()
    _ORIGINAL.clear()
    _ACTIVE = None
