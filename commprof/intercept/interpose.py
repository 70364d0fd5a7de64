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

Routed (intercept/interposer.py says what runs as torch's own instead, counted in `unseen`): all_reduce,
all_gather_into_tensor, all_gather (list), reduce_scatter_tensor, reduce_scatter (list), broadcast, reduce,
all_to_all, all_to_all_single, barrier, send, recv, isend, irecv, batch_isend_irecv, all_reduce_coalesced and
all_gather_coalesced; sync and async, any process group. `P2POp` becomes a subclass that accepts the rebound
isend/irecv (torch's own check compares against its originals; pipelining compares `op.op` with `dist.isend`,
which stays true). gather, scatter and monitored_barrier, which Comm has no form for, are counted in `unseen`.
Functional collectives are not these functions' to see: intercept/functional.py routes them. What no wrapper
sees — calls made from C++, a group's own methods, isend, irecv and batch_isend_irecv by `distributed_c10d`'s
name (torch compares a P2POp's op with that module's own by identity, so those stay torch's there) — reaches
the group's gloo backend, where intercept/seen.py sees it.

Exercised by: `pytest tests/test_interpose.py`.
"""

from __future__ import annotations

from functools import partial, update_wrapper

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from commprof.comm import torch_own
from commprof.comm.torch_comm import TorchComm
from commprof.intercept import compiling
from commprof.intercept.interposer import Interposer
from commprof.intercept.p2p import _ORIGINAL, P2POp
from commprof.record.recorder import OpRecorder

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
    # torch.compile rewrites a traced call into a functional collective (see interposer._compiling); loaded later, it
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
