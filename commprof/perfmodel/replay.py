"""A measured iteration replayed at N ranks: every rank's busy time is kept, every op is re-timed by its
algorithm's α–β cost on the fabric, and the measured dependencies stay — an op starts once every member
has issued it and the previous op of its group has finished, a wait blocks until its op completes, so
what overlapped compute still can and what was exposed still is.

Scaling adds data-parallel replicas: groups labelled "world" or "dp" (or holding every rank) grow by
N / world_size; model-parallel groups (tp, pp links) keep their size. Placement is by rank: rank r sits
on host r // ranks_per_host. A group that spans hosts runs each step at the pace of its slowest level
(a ring's steps all cross a host boundary somewhere); an all_to_all across hosts shares each host's link
among that host's members. Links are not shared between concurrent groups.

Exercised by: `pytest tests/unit/test_predict.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from commprof import kernels
from commprof.base.errors import UsageError
from commprof.perfmodel.fabric import Fabric, Level
from commprof.perfmodel.timeline import RECVS, SENDS, Measured, Op, Program

ALGORITHMS = {"all_reduce": ("all_reduce", "ring"), "all_gather": ("all_gather", "ring"),
              "reduce_scatter": ("reduce_scatter", "ring"), "broadcast": ("broadcast", "binomial_tree"),
              "reduce": ("broadcast", "binomial_tree"), "all_to_all": ("all_to_all", "pairwise")}
"""The kernels module each collective is costed as (reduce: a broadcast's tree run backwards): the ring that
NCCL, gloo and MPICH run for large messages, a tree for one root."""
BACKEND_ALGORITHMS = {"gloo": {"reduce_scatter": ("all_reduce", "ring")}}
"""Where a backend departs from ALGORITHMS. gloo reduces the whole input and keeps its chunk: its
reduce_scatter takes as long as an all_reduce of the same size (measured on two hosts at 50 Mbit/s:
178 ms each for 1 MiB, where a ring reduce_scatter would move half the bytes)."""
SCALED = ("world", "dp")
"""Group labels that are the data-parallel dimension, grown with N."""


@dataclass(frozen=True)
class Predicted:
    """One strategy at one rank count."""

    ranks: int
    hosts: int
    step_ms: float
    """Median over the measured iterations of the slowest rank's replayed iteration."""
    busy_ms: float
    """Compute, data, optimizer and the rest of the training thread's own time (as measured; the most of any
    rank, the median over the iterations)."""
    comm_ms: float
    """Time with at least one op in flight, issue to completion (the most of any rank, the median over the
    iterations)."""
    exposed_comm_ms: float
    """Time the training thread blocked on ops (the most of any rank, the median over the iterations)."""
    throughput: float | None
    """Samples a second (the global batch grows with the replicas); None when the batch is unknown."""
    efficiency: float
    """The replay with every op free, over this step time: 1.0 is perfect scaling."""

    def as_record(self) -> dict:
        return dict(vars(self))


def rank_counts(measured: Measured, wanted: list[int]) -> list[int]:
    """The N of `wanted` that hold whole replicas (multiples of the model-parallel size)."""
    size = _model_size(measured)
    return [n for n in wanted if n >= size and n % size == 0]


def _model_size(m: Measured) -> int:
    scaled = {op.members for it in m.iterations for p in it for s in p.steps if s[0] == "issue"
              for op in (s[1],) if _scales(op, m.world_size)}
    if not scaled:
        raise UsageError(f"{m.source}: no op of a data-parallel group (world or dp) to scale: "
                         "measure the strategy with data parallelism (e.g. --dp 2)")
    return m.world_size // min(len(members) for members in scaled)


def _scales(op: Op, world_size: int) -> bool:
    return op.label in SCALED or len(op.members) == world_size


def algorithms(backend: str | None) -> dict[str, tuple[str, str]]:
    """Collective -> (kernels collective, algorithm) that costs it on `backend`."""
    return {**ALGORITHMS, **BACKEND_ALGORITHMS.get(backend or "", {})}


def predict(m: Measured, n: int, fabric: Fabric, ranks_per_host: int, flag: str = "--fabric") -> Predicted:
    algos = algorithms(m.backend)

    @lru_cache(maxsize=None)
    def cost_ms(op: Op) -> float:
        members = _members_at(op, m.world_size, n)
        return _cost_s(op, members, fabric, ranks_per_host, algos, flag) * 1e3

    rows = [replay(it, cost_ms) for it in m.iterations]
    # each figure its own median over the iterations: the iteration of the median step changes with N, and
    # its comm and exposed time (another iteration's overlap) with it — they were not monotone in N
    step = _median([r[0] for r in rows])
    busy, comm, exposed = (_median([r[1][k] for r in rows]) for k in range(3))
    batch = None if m.global_batch is None else m.global_batch * n / m.world_size
    return Predicted(ranks=n, hosts=math.ceil(n / ranks_per_host), step_ms=step, busy_ms=busy, comm_ms=comm,
                     exposed_comm_ms=exposed, throughput=None if batch is None else batch / (step / 1e3),
                     efficiency=_free_step_ms(m) / step if step else 1.0)


@lru_cache(maxsize=16)
def _free_step_ms(m: Measured) -> float:
    """The step with every op free: the same at every N, so replayed once per measured run."""
    return _median([replay(it, lambda op: 0.0)[0] for it in m.iterations])


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _members_at(op: Op, world_size: int, n: int) -> tuple[int, ...]:
    """The op's group at n ranks: a data-parallel group grown by n / world_size with its stride kept."""
    if not _scales(op, world_size) or n == world_size:
        return op.members
    if len(op.members) == 1:
        return tuple(range(op.members[0], n, world_size))
    stride = op.members[1] - op.members[0]
    grow = n * len(op.members) // world_size
    return tuple(op.members[0] + i * stride for i in range(grow))


def _cost_s(op: Op, members: tuple[int, ...], fabric: Fabric, per_host: int, algos: dict, flag: str) -> float:
    size = len(members)
    if size < 2:
        return 0.0
    by_host: dict[int, int] = {}
    for r in members:
        by_host[r // per_host] = by_host.get(r // per_host, 0) + 1
    levels = [fabric.level("inter", flag)] if len(by_host) > 1 else []
    if max(by_host.values()) > 1:
        levels.append(fabric.level("intra", flag))
    share = max(by_host.values()) if op.name == "all_to_all" and len(by_host) > 1 else 1
    return max(_one_level(op, size, lv, share if lv is levels[0] and len(by_host) > 1 else 1, algos)
               for lv in levels)


def _one_level(op: Op, size: int, level: Level, share: int, algos: dict) -> float:
    alpha, beta = level.alpha_s, level.beta_s_per_byte * share
    if op.name in (SENDS, RECVS, "sendrecv"):
        return alpha + beta * op.nbytes
    if op.name == "barrier":
        return (size - 1).bit_length() * alpha
    algo = algos.get(op.name)
    if algo is None:
        raise UsageError(f"no cost model for op {op.name!r}")
    return kernels.find(*algo).cost(size, op.nbytes, alpha, beta)


def replay(programs: tuple[Program, ...], cost_ms) -> tuple[float, tuple[float, float, float]]:
    """(the slowest rank's iteration ms, (the most busy, comm and exposed ms of any rank)) with each op taking
    cost_ms(op)."""
    ranks = len(programs)
    pc, t = [0] * ranks, [0.0] * ranks
    busy, exposed = [0.0] * ranks, [0.0] * ranks
    issued: dict[tuple, dict[int, float]] = {}
    ops: dict[tuple, Op] = {}
    streams: dict[tuple, list[tuple]] = {}  # group stream -> its ops' keys in issue order
    done: dict[tuple, float] = {}
    while True:
        moved = False
        for r, prog in enumerate(programs):
            while pc[r] < len(prog.steps):
                step = prog.steps[pc[r]]
                if step[0] == "busy":
                    t[r] += step[1]
                    busy[r] += step[1]
                elif step[0] == "issue":
                    op = step[1]
                    if op.key not in ops:
                        ops[op.key] = op
                        streams.setdefault(_stream(op), []).append(op.key)
                    issued.setdefault(op.key, {})[r] = t[r]
                else:
                    _, op, after = step
                    if op.key not in done:
                        break
                    resume = max(t[r], done[op.key])
                    exposed[r] += resume - t[r]
                    t[r] = resume + after
                    busy[r] += after
                pc[r] += 1
                moved = True
        moved |= _complete(ops, issued, streams, done, cost_ms)
        if all(pc[r] == len(p.steps) for r, p in enumerate(programs)):
            break
        if not moved:
            stuck = [f"rank {r}: {programs[r].steps[pc[r]][1].key}" for r in range(ranks)
                     if pc[r] < len(programs[r].steps)]
            raise UsageError(f"the trace's ops do not match across ranks ({'; '.join(stuck[:3])})")
    spans: list[list[tuple[float, float]]] = [[] for _ in range(ranks)]
    for key in ops:
        for r, at in issued[key].items():
            spans[r].append((at, done[key]))
    comm = [_union(s) for s in spans]
    # each figure the most any rank has: ranks that end together (one waits for the other) swap places as the
    # "slowest" from one N to the next, and its figures with them
    return max(t), (max(busy), max(comm), max(exposed))


def _union(spans: list[tuple[float, float]]) -> float:
    """Time with at least one op in flight (comm, as `run` counts it)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _stream(op: Op) -> tuple:
    """Ops of one stream run one after another: a group's collectives, or one direction of a link."""
    return op.key[:-1] if op.name in (SENDS, RECVS) else op.key[:2]  # (label, group)


def _parties(op: Op) -> tuple[int, ...]:
    return op.key[2:4] if op.name in (SENDS, RECVS) and len(op.members) == 2 else op.members


def _complete(ops, issued, streams, done, cost_ms) -> bool:
    """Complete every op whose parties have all issued it and whose stream predecessor is done."""
    moved = False
    for keys in streams.values():
        prev = None
        for key in keys:
            if key not in done:
                got = issued[key]
                if (prev is not None and prev not in done) or not all(r in got for r in _parties(ops[key])):
                    break
                start = max([*got.values(), done[prev] if prev is not None else 0.0])
                done[key] = start + cost_ms(ops[key])
                moved = True
            prev = key
    return moved
