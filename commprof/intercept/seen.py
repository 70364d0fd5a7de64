"""Every process group's gloo backend, seen: what reaches a script's process group without passing through
commprof's wrappers — a library's collectives from C++, a call of the group's own methods (`pg.allreduce`),
isend and irecv by distributed_c10d's name — goes through the group's Comm all the same.

    seen.install(interposer)   # every process group made from now on (init_process_group, new_group,
                               # DeviceMesh's on the CPU): its CPU backend seen
    seen.uninstall()

Each group torch makes gets, for the CPU, a backend of commprof's own (`Seen`, a Python `Backend`, torch 2.12
and later) in front of its gloo backend. The wrappers of interpose.py, functional.py and ddp_reducer.py stay:
they see the Python call (its async semantics, its name, a form Comm lacks) before the backend does. What they
route, the group's Comm (comm/gloo_comm.py) hands to gloo itself, past `Seen` (through it, a Python backend
adds 31-43 µs an op: `python benchmarks/seen_backend.py`); what they leave to torch runs inside
`torch_own.own()`, and `Seen` hands it straight to gloo: an op is counted once. Anything else is issued
through the group's Comm (timed, counted and NVTX-wrapped there) where Comm has its form — all_reduce,
broadcast, reduce, all_gather_single, reduce_scatter_single and all_to_all_single of equal splits, send and
recv of tag 0 — and otherwise runs as gloo's, counted in `unseen` by torch's backend name (e.g. `gather`).
The group keeps its name ("gloo"); its barrier, which carries no tensor, goes to its default backend, gloo,
unseen; shutdown, abort and coalescing stay gloo's (the group holds gloo's backend still, and calls it for
them); splitting, sequence numbers and what the backend supports are gloo's, asked through `Seen`. A group
`split_group` makes (it needs a device bound to the default group: a GPU) keeps its own backend, unseen.

Exercised by: `pytest tests/test_profile_cli.py -k backend`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from commprof.comm import torch_own
from commprof.comm.gloo_comm import GLOO_BEHIND
from commprof.intercept.interposer import _OPS
from commprof.intercept.opaque import opaque
from commprof.intercept.work import Work

try:
    from torch._C._distributed_c10d import Backend
    Backend(0, 1)  # torch 2.11 and earlier: "No constructor defined"
except (ImportError, TypeError):
    Backend = None

FORWARDED = ("broadcast", "allreduce", "allreduce_sparse", "allreduce_coalesced", "reduce", "allgather",
             "all_gather_single", "all_gather_single_coalesced", "allgather_coalesced", "gather", "scatter",
             "reduce_scatter", "reduce_scatter_single", "reduce_scatter_single_coalesced", "all_to_all_single",
             "alltoall", "send", "recv", "recv_anysource", "barrier")
"""The backend's ops (torch's names for them): each handed to gloo as it came while commprof is issuing it,
and otherwise routed (`_route`) or counted. Not monitored_barrier: torch hands a barrier to the group's default
backend, gloo's, never to the CPU's (and its trampoline's arguments are not its binding's)."""

PROPERTIES = ("supports_splitting", "supports_coalescing", "supports_time_estimate", "supports_shrinking",
              "supports_reconfigure", "supports_window")
"""What torch asks a backend as properties: gloo's answers. Each must be defined here: torch's trampoline reads
the Python attribute of that name, which would otherwise be the C++ property asking the trampoline again."""

_SAVED: dict = {}
_KEPT: list = []
"""Every Seen made: C++ holds each, but its methods are Python's."""


def install(interposer) -> None:
    """From now on, every process group torch makes has its CPU backend seen through `interposer`."""
    if _SAVED or Backend is None:
        return
    _SAVED.update(helper=c10d._new_process_group_helper)

    def helper(*args, **kwargs):
        made = _SAVED["helper"](*args, **kwargs)
        see(interposer, made[0])
        return made

    c10d._new_process_group_helper = helper


def uninstall() -> None:
    if _SAVED:
        c10d._new_process_group_helper = _SAVED["helper"]
        _SAVED.clear()
        GLOO_BEHIND.clear()


def see(interposer, group) -> None:
    """Put a Seen in front of `group`'s gloo backend for the CPU (a rank outside the group has none)."""
    if not isinstance(group, dist.ProcessGroup) or "cpu" not in {t.type for t in group._device_types}:
        return
    cpu = torch.device("cpu")
    real = group._get_backend(cpu)
    if isinstance(real, Seen) or real.name() != "gloo":
        return
    seen = Seen(interposer, group, real)
    _KEPT.append(seen)  # the group with it: an id in GLOO_BEHIND is never another group's
    GLOO_BEHIND[id(group)] = real
    name, desc = group.group_name, group.group_desc
    # registered as CUSTOM for the CPU, the group's default stays gloo: its name and its barrier are gloo's
    group._register_backend(cpu, dist.ProcessGroup.BackendType.CUSTOM, seen)
    # the group's name is read from one of its backends (which one, torch's map decides): each backend carries it,
    # Seen too, or DeviceMesh and compiled code cannot resolve the group by name
    group._set_group_name(name)
    group._set_group_desc(desc)


class _Seen:
    def __init__(self, interposer, group, real) -> None:
        super().__init__(real.rank(), real.size())
        self._interposer, self._group, self._real = interposer, group, real
        self._comm = None
        """The group's Comm, once made: while it issues an op (its `busy`), what reaches here is that op."""

    def _busy(self) -> bool:
        if torch_own.active():
            return True
        comm = self._comm
        if comm is None:
            hit = self._interposer._comms.get(id(self._group))
            if hit is None:
                return False
            comm = self._comm = hit[1]
        return comm.busy is not None

    def _route(self, name: str, args: tuple):
        """Op `name` that nothing of commprof's issued: through the group's Comm where it has the form,
        else gloo's, counted."""
        issue = getattr(self, f"_{name}", None)
        handle = issue(*args) if issue is not None else None
        if handle is not None:
            return Work(handle)
        self._interposer.unseen[name] += 1
        with torch_own.own():
            return getattr(self._real, name)(*args)

    def _comm_of_group(self):
        return self._interposer.comm(self._group)

    # ---- the forms Comm has: a Handle, or None to leave the op to gloo -----------------------------
    def _allreduce(self, tensors, opts):
        op = _OPS.get(opts.reduceOp.op)
        if len(tensors) == 1 and op is not None and tensors[0].is_contiguous():
            return self._comm_of_group().all_reduce(tensors[0], op=op, async_op=True)
        return None

    def _broadcast(self, tensors, opts):
        if len(tensors) == 1 and opts.rootTensor == 0 and tensors[0].is_contiguous():
            return self._comm_of_group().broadcast(tensors[0], src=opts.rootRank, async_op=True)
        return None

    def _reduce(self, tensors, opts):
        op = _OPS.get(opts.reduceOp.op)
        if len(tensors) == 1 and op is not None and opts.rootTensor == 0 and tensors[0].is_contiguous():
            return self._comm_of_group().reduce(tensors[0], dst=opts.rootRank, op=op, async_op=True)
        return None

    def _all_gather_single(self, output, input, opts):
        if output.is_contiguous() and input.is_contiguous():
            return self._comm_of_group().all_gather(output, input, async_op=True)
        return None

    def _reduce_scatter_single(self, output, input, opts):
        op = _OPS.get(opts.reduceOp.op)
        if op is not None and output.is_contiguous() and input.is_contiguous():
            return self._comm_of_group().reduce_scatter(output, input, op=op, async_op=True)
        return None

    def _all_to_all_single(self, output, input, output_splits, input_splits, opts):
        if not output_splits and not input_splits and output.is_contiguous() and input.is_contiguous():
            return self._comm_of_group().all_to_all(output, input, async_op=True)
        return None

    def _send(self, tensors, dst, tag):
        if len(tensors) == 1 and tag == 0 and tensors[0].is_contiguous():
            return self._comm_of_group().isend(tensors[0], dst=dst)
        return None

    def _recv(self, tensors, src, tag):
        if len(tensors) == 1 and tag == 0 and tensors[0].is_contiguous():
            return self._comm_of_group().irecv(tensors[0], src=src)
        return None

    # ---- gloo's, asked through here ----------------------------------------------------------------
    def getBackendName(self) -> str:
        return self._real.name()

    def split(self, *args):
        return self._real.split(*args)

    def _get_sequence_number_for_group(self):
        return self._real._get_sequence_number_for_group()

    def _set_sequence_number_for_group(self):
        return self._real._set_sequence_number_for_group()


def _forward(name: str):
    def op(self, *args):
        if self._busy():
            return getattr(self._real, name)(*args)
        return self._route(name, args)
    op.__name__ = name
    return op


def _property(name: str):
    return property(lambda self: getattr(self._real, name))


for _name in FORWARDED:
    setattr(_Seen, _name, _forward(_name))
for _name in PROPERTIES:
    setattr(_Seen, _name, _property(_name))

Seen = opaque(type("Seen", (_Seen, Backend), {"__doc__": "A group's CPU backend: gloo's, seen."}) if Backend
              else _Seen)
