"""The measurement model: which ops commprof measures, how their bytes count, and the names every layer
checks against — one low-level module, so the profiler, the comm layer and the reports share it without
reaching into `commprof bench` or `commprof run`.

  COLLECTIVES   every collective by its torch.distributed name, in the order `commprof bench` sweeps and
                reports them, with nccl-tests' size convention (split) and bus factor
  wire_factor   bytes one rank sends per payload byte: the volume tables' wire bytes
  P2P           every point-to-point op name the op log holds (never a group's collective)
  BUBBLE_P2P    the point-to-point ops whose blocked time is pipeline bubble
  ALIGNED       what the aligned iteration's name carries after "iteration N" (record/aligned.py)
  SOURCES       the data source names `--data` takes
  Members       a group's global ranks as one shared tuple whose hash is computed once; `member_args` and
                `members_of` write and read them in a trace (`runs` of consecutive ranks for a large group)

Imports nothing from commprof. Exercised by: `pytest tests/unit/test_units_stats.py tests/unit/test_breakdown.py
-k "bus_factors or wire_factors"`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def _ring_all_reduce(n: int) -> float:
    return 2 * (n - 1) / n


def _ring(n: int) -> float:
    return (n - 1) / n


def _one(n: int) -> float:
    return 1.0


@dataclass(frozen=True)
class CollectiveModel:
    """How one collective's size and bandwidth are counted (nccl-tests' conventions)."""

    name: str
    split: bool
    """Size = world_size × per-rank count (rounded down to a multiple of world_size elements)."""
    reduces: bool
    """Takes a reduce op (-o)."""
    bus_factor: Callable[[int], float]
    """busbw = algbw × bus_factor(n) for a group of n ranks."""


COLLECTIVES: dict[str, CollectiveModel] = {c.name: c for c in (
    CollectiveModel("all_reduce", split=False, reduces=True, bus_factor=_ring_all_reduce),
    CollectiveModel("all_gather", split=True, reduces=False, bus_factor=_ring),
    CollectiveModel("reduce_scatter", split=True, reduces=True, bus_factor=_ring),
    CollectiveModel("broadcast", split=False, reduces=False, bus_factor=_one),
    CollectiveModel("reduce", split=False, reduces=True, bus_factor=_one),
    CollectiveModel("all_to_all", split=True, reduces=False, bus_factor=_ring),
    CollectiveModel("sendrecv", split=False, reduces=False, bus_factor=_one),
    CollectiveModel("barrier", split=False, reduces=False, bus_factor=_one),
)}
"""What `commprof bench` measures, in its order; sendrecv is its point-to-point row (one ring step)."""

P2P = ("send", "recv", "sendrecv")
"""Point-to-point op names as the op log and the flight ring hold them (isend/irecv log as send/recv).
They do not advance a group's collective seq and are never compared across ranks (comm/base.py,
comm/failure/flight.py): a stage sends what its neighbour receives. Every other logged op is a collective of
its group."""

BUBBLE_P2P = ("send", "recv")
"""The point-to-point ops a pipeline's stages exchange activations with: time blocked in them is bubble
(the stage idles on its neighbour), not exposed communication (record/phases.py), and their NVTX
category on a pipeline group is `bubble` (record/annotate.py). sendrecv is not among them: only bench's
sendrecv row and the exchange steps of hand-written algorithms use it, and that time is communication."""

ALIGNED = " (aligned)"
"""A warm-up iteration after the first, each collective's parties met before it (record/aligned.py): not
measured, its ops price the ones a straggler made late (findings/whatif.py)."""

SOURCES = ("synthetic", "mnist", "cifar10", "cifar100", "text")
"""Data source names: what `commprof.data.open_source` accepts and `commprof run --data` takes."""


def wire_factor(name: str, n: int) -> float:
    """Bytes one rank sends per payload byte under the ring algorithms, in a group of n ranks:
    nccl-tests' bus factor; send 1, recv 0 (the peer's send counts it); 0 in a group of one."""
    if name == "recv" or n <= 1:
        return 0.0
    if name == "send":
        return 1.0
    return COLLECTIVES[name].bus_factor(n)


class Members(tuple):
    """A group's global ranks, hashed once: an op's key holds its group's members, and a tuple of 16,384 ranks
    rehashed at every lookup made a job's analysis N^2. One instance is shared by every op of the group (a
    dict's lookup then finds it by identity, never comparing the ranks)."""

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = tuple.__hash__(self)
        return h


MEMBERS_LISTED = 64
"""Groups up to this size have their members listed in a trace's thread name; larger ones as runs."""


def member_args(members) -> dict:
    """A trace's thread_name args for a group: {"members": [...]}, or {"member_runs": [[first, last], ...]}
    above MEMBERS_LISTED ranks (the world group of 16,384 ranks is one pair, not 16,384 numbers per rank)."""
    members = list(members)
    return {"members": members} if len(members) <= MEMBERS_LISTED else {"member_runs": runs(members)}


def runs(ranks) -> list[list[int]]:
    """Sorted ranks as runs [first, last] of consecutive ones: the world group of 16,384 ranks is one pair, not
    16,384 numbers (a trace's group, a snapshot on the control plane, a line naming ranks)."""
    out: list[list[int]] = []
    for r in ranks:
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return out


def members_of(args: dict, known: dict | None = None) -> Members | None:
    """The members `member_args` wrote (None: neither key); `known` shares one Members per group across the
    ranks' files, looked up by the args' short form."""
    runs = args.get("member_runs")
    listed = args.get("members")
    if runs is None and listed is None:
        return None
    form = tuple(map(tuple, runs)) if runs is not None else tuple(listed)
    if known is not None and form in known:
        return known[form]
    got = Members(r for a, b in runs for r in range(a, b + 1)) if runs is not None else Members(listed)
    if known is not None:
        known[form] = got
    return got

