"""The sweep: for each collective, dtype, op, root and size, check (-c), warm up, time each iteration on
every rank, gather the times on rank 0 and turn them into one record per mode (out-of-place, in-place).
An iteration is -m ops issued back to back and timed together, its time divided by -m; under -z 1 each op
is waited on before the next and the group meets at a barrier, untimed, after each iteration. The check,
the warm-up and the timed iterations of each mode are NVTX/trace ranges of their own ("timed all_reduce
in-place"), around the ops' own ranges.

A sweep runs on one layout of the job's ranks: all of them (the default), the first k while the others
wait (--group-sizes k), every disjoint group of k at once (--concurrent), or the levels of the hosts
(--groups intra,inter: each host's ranks, all hosts at once; then one rank of each host per group).
Ranks outside every group pass each point's world barriers with the members (one before each timed loop,
one after the last), idle ones that sleep rather than spin, so nobody waits longer than one point, the
waiting ranks leave their cores to the measuring ones, and concurrent groups start each timed loop
together.

Runs on every rank; only rank 0 gets records. Exercised by: `pytest tests/test_bench_cli.py
tests/test_bench_groups.py tests/unit/test_host_levels.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from types import ModuleType
from typing import Callable, Iterator

from commprof import kernels
from commprof.base.backends import unsupported
from commprof.base.errors import UsageError
from commprof.base.stats import bandwidths, summarize
from commprof.bench.collectives import COLLECTIVES, Collective
from commprof.bench.config import MODES, BenchConfig
from commprof.comm import Comm
from commprof.comm.dtypes import DTYPES
from commprof.perfmodel import alphabeta
from commprof.record.annotate import ANNOTATOR
from commprof.record.recorder import END, NAME, NBYTES, START

LIBRARY = kernels.LIBRARY
SENDS = ("send", "sendrecv")  # op-log names of what a rank sends (isend logs as send)
ROOTED = ("broadcast", "reduce")
"""Collectives with a root (-r)."""


@dataclass(frozen=True)
class Point:
    """One row of a table: a collective (the library's, or one hand-written algorithm) at one size,
    dtype and op."""

    collective: Collective
    dtype: str | None
    op: str | None
    requested: int
    """Bytes asked for (-b/-e/-f)."""
    count: int
    """Elements in the reported size after rounding."""
    modes: tuple[bool, ...]
    """Modes (in-place flags) the backend can run."""
    algo: str = LIBRARY
    """`library`, or the name of a commprof.kernels algorithm."""
    module: ModuleType | None = None
    """That algorithm's module (None for the library)."""
    root: int | None = None
    """The root rank of a rooted collective (broadcast, reduce); None for the others."""


@dataclass(frozen=True)
class Layout:
    """Which ranks run the collectives of one sweep."""

    size: int
    """Ranks per group: the n of every bus factor and size rounding."""
    groups: tuple[tuple[int, ...], ...]
    """Global ranks of each group; the groups measure at the same time."""
    world_size: int
    """Ranks in the job."""
    concurrent: bool = False
    """Made by --concurrent (even where one group fills the job)."""
    level: str = ""
    """"intra" (within each host) or "inter" (across hosts) under --groups; else empty."""

    @property
    def whole(self) -> bool:
        """One group of every rank: the world Comm itself runs the sweep."""
        return self.size == self.world_size and not self.concurrent

    def label(self, i: int = 0) -> str:
        """Name of group i in the op log, NVTX messages and the trace."""
        if self.level:
            return f"{self.level}{i}"
        ranks = self.groups[i]
        return f"ranks{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else f"rank{ranks[0]}"


def layouts(cfg: BenchConfig, world_size: int, hosts: list[str] | None = None) -> list[Layout]:
    """The sweeps a job runs, in order: one per level of the hosts (`hosts`: each rank's), one per group
    size (checked by the CLI), or one of every rank."""
    if cfg.levels:
        out = [level_layout(level, hosts) for level in cfg.levels]
        for layout in out:
            if not cfg.all_roots and cfg.root >= layout.size:
                raise UsageError(f"--root {cfg.root} is outside 0..{layout.size - 1} "
                                 f"of the {layout.level}-host groups")
        return out
    if not cfg.group_sizes:
        return [Layout(world_size, (tuple(range(world_size)),), world_size)]
    out = []
    for k in cfg.group_sizes:
        count = world_size // k if cfg.concurrent else 1
        out.append(Layout(k, tuple(tuple(range(g * k, (g + 1) * k)) for g in range(count)), world_size,
                          cfg.concurrent))
    return out


def level_layout(level: str, hosts: list[str]) -> Layout:
    """"intra": one group per host, of its ranks; "inter": group j of every host's j-th rank. Every host
    must run the same number of ranks, and the level must have two ranks per group to measure."""
    by_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    per_host = {len(ranks) for ranks in by_host.values()}
    if len(per_host) > 1:
        raise UsageError("--groups needs the same number of ranks on every host: "
                         + ", ".join(f"{h} {len(r)}" for h, r in by_host.items()))
    local = per_host.pop()
    if level == "intra":
        if local < 2:
            raise UsageError("--groups intra needs at least 2 ranks per host, this job runs 1")
        groups = tuple(tuple(ranks) for ranks in by_host.values())
    else:
        if len(by_host) < 2:
            raise UsageError(f"--groups inter needs at least 2 hosts, this job runs on 1 ({hosts[0]})")
        groups = tuple(tuple(ranks[j] for ranks in by_host.values()) for j in range(local))
    return Layout(len(groups[0]), groups, len(hosts), concurrent=len(groups) > 1, level=level)


def join(world: Comm, layout: Layout) -> Comm | None:
    """This rank's Comm for `layout` (the world's own when it is the whole job); None outside every group.
    Every rank calls it, as new_group requires."""
    if layout.whole:
        return world
    mine = None
    for i, ranks in enumerate(layout.groups):
        sub = world.new_group(list(ranks), label=layout.label(i))
        mine = sub if sub is not None else mine
    return mine


@dataclass
class Plan:
    points: list[Point] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Rounding and skipped combinations, said once in the report."""


def collectives_to_sweep(cfg: BenchConfig) -> list[str]:
    """cfg.collectives, with the sendrecv sweep first when a hand-written algorithm needs its α–β fit."""
    names = list(cfg.collectives)
    if any(a != LIBRARY for a in cfg.algos):
        names = ["sendrecv"] + [n for n in names if n != "sendrecv"]
    return names


def plan(cfg: BenchConfig, world_size: int) -> Plan:
    """Every row the sweep will measure; UsageError-free (validation happens in the CLI)."""
    out, sizes = Plan(), cfg.sizes()
    for name in collectives_to_sweep(cfg):
        coll = COLLECTIVES[name]
        if name == "barrier":
            out.points.append(Point(coll, None, None, 0, 0, (False,)))
            continue
        for algo in (cfg.algos if name != "sendrecv" else (LIBRARY,)):
            module = None if algo == LIBRARY else kernels.find(name, algo)
            if algo != LIBRARY and module is None:
                continue  # `--algo all`: this collective has no algorithm of that name
            for root in roots(cfg, name, world_size):
                for dtype in cfg.dtypes:
                    for op in (cfg.ops if coll.reduces else (None,)):
                        modes, why = _modes(cfg.backend, name, module, dtype, op)
                        if not modes:
                            label = name if module is None else f"{name}/{algo}"
                            note = f"{label} {dtype} {op or ''}: skipped, {why}".replace("  ", " ")
                            if note not in out.notes:  # said once, not once per root
                                out.notes.append(note)
                            continue
                        out.points.extend(replace(p, root=root) for p in
                                          _sized(coll, dtype, op, modes, sizes, world_size, out.notes, algo, module))
    return out


def roots(cfg: BenchConfig, name: str, n: int) -> tuple[int | None, ...]:
    """The roots collective `name` runs with on `n` ranks: every rank in turn under -r all, else -r's."""
    if name not in ROOTED:
        return (None,)
    return tuple(range(n)) if cfg.all_roots else (cfg.root,)


def _modes(backend: str, name: str, module, dtype, op) -> tuple[tuple[bool, ...], str | None]:
    """The modes a point runs in, and why none when none."""
    if module is None:
        modes = tuple(m for m in MODES if not unsupported(backend, name, dtype, op, m))
        return modes, None if modes else unsupported(backend, name, dtype, op, True)
    why = kernels.unsupported(dtype, op)
    return (() if why else kernels.modes(module)), why


def _sized(coll, dtype, op, modes, sizes, n, notes, algo, module) -> Iterator[Point]:
    esize = DTYPES[dtype].itemsize
    unit = esize * n if coll.split else esize
    seen, rounded = set(), []
    for requested in sizes:
        count = (requested // unit) * (unit // esize)
        if count * esize != requested:
            rounded.append((requested, count * esize))
        if count == 0 or count in seen:
            continue
        seen.add(count)
        yield Point(coll, dtype, op, requested, count, modes, algo, module)
    if rounded:
        shown = ", ".join(f"{a}→{b}" for a, b in rounded[:4]) + (" …" if len(rounded) > 4 else "")
        why = f"{n} ranks × {esize} B" if coll.split else f"{esize} B elements"
        note = (f"{coll.name} {dtype}: sizes rounded down to multiples of {why} "
                f"({shown}; sizes that reach 0 B or repeat are dropped)")
        if note not in notes:  # said once for the library and every algorithm
            notes.append(note)


def measure(comm: Comm, cfg: BenchConfig, point: Point, inplace: bool,
            start: Callable[[], None]) -> tuple[list[int], int | None, int | None]:
    """This rank's per-iteration times (ns, an iteration's -m ops together divided by -m), wrong-element
    count over the -c checks, and (for a hand-written algorithm) bytes it sent per call, for one point and
    mode. `start` is the barrier the timed loop begins after."""
    dtype = DTYPES[point.dtype] if point.dtype else None
    target = comm if point.module is None else kernels.bind(comm, point.module)
    root = point.root or 0
    case = point.collective.prepare(target, point.count, dtype, point.op or "sum", inplace, root)
    name = phase_name(point, inplace)
    wrong = None
    if cfg.check:
        wrong = 0
        with _phase("check", name):
            for _ in range(cfg.check):
                case.init()
                case.run()
                wrong += case.wrong()
    run, m = case.run, cfg.agg_iters
    wait = _waiter(comm, cfg.blocking)
    with _phase("warm-up", name):
        for _ in range(cfg.warmup * m):
            run()
            wait()
    recorder, clock = comm.recorder, comm.clock
    start()
    mark = recorder.mark()
    spans = []
    with _phase("timed", name):
        for _ in range(cfg.iters):
            begin = clock.now() if point.module is not None else None
            for _ in range(m):
                run()
                wait()
            if begin is not None:
                spans.append((begin, clock.now()))
            if cfg.blocking:
                comm.control_barrier()  # untimed: the next iteration starts with the ranks aligned
    if point.module is None:  # one logged op per call: an iteration spans its first op's start to its last's end
        ops = recorder.ops[mark:]
        spans = [(ops[i][START], ops[i + m - 1][END]) for i in range(0, len(ops), m)]
        sent = None
    else:  # many point-to-point ops per call: time the calls as a whole
        sent = sum(op[NBYTES] for op in recorder.ops[mark:] if op[NAME] in SENDS) // (cfg.iters * m)
    times = [int(clock.elapsed_ns(a, b)) // m for a, b in spans]
    recorder.clear()
    return times, wrong, sent


def phase_name(point: Point, inplace: bool) -> str:
    """What a phase range says besides its phase: 'all_reduce/ring root 1 in-place'."""
    name = point.collective.name if point.module is None else f"{point.collective.name}/{point.algo}"
    root = "" if point.root is None else f" root {point.root}"
    return f"{name}{root} {'in-place' if inplace else 'out-of-place'}"


class _phase:
    """One NVTX/trace range (category iteration) around a phase of a point: 'check …', 'warm-up …',
    'timed …'. Its name leaves out the size and dtype, which the ops' ranges inside it carry, so that the
    labels cached stay few."""

    __slots__ = ("_label",)

    def __init__(self, phase: str, name: str) -> None:
        self._label = ANNOTATOR.label(f"{phase} {name}", "iteration") if ANNOTATOR.active else None

    def __enter__(self) -> None:
        if self._label is not None:
            ANNOTATOR.push(self._label)

    def __exit__(self, *exc) -> None:
        if self._label is not None:
            ANNOTATOR.pop()


def _waiter(comm: Comm, blocking: bool) -> Callable[[], None]:
    """-z 1: what waits for an op before the next is issued. A gloo or MPI op has completed when its call
    returns; an NCCL op has only been queued on the stream, so the CPU waits for the device."""
    if not blocking or comm.device.type != "cuda":
        return _nothing
    import torch

    return partial(torch.cuda.synchronize, comm.device)


def _nothing() -> None:
    pass


def sweep(world: Comm, group: Comm | None, layout: Layout, cfg: BenchConfig, the_plan: Plan,
          on_point: Callable[[Point, list[dict]], None]) -> None:
    """Measure every point on `group` (None: this rank waits with the others); on rank 0 call
    `on_point(point, records)` as each completes. The library sendrecv rows (first in the plan when
    algorithms run) give the α–β fit the algorithms' rows carry."""
    p2p: list[tuple[int, float]] = []
    fit: alphabeta.AlphaBeta | None = None
    # a member's end of the barriers the waiting ranks pass idle; the whole job's plain barrier otherwise
    start = world.control_barrier if layout.whole else partial(world.control_barrier, idle=False)
    for point in the_plan.points:
        if group is None:
            results = None
            for _ in point.modes:
                world.control_barrier(idle=True)  # the one each member passes before its timed loop
            world.control_barrier(idle=True)  # wait out the timed loops here: a gather would spin
        else:
            results = {m: measure(group, cfg, point, m, start) for m in point.modes}
            if not layout.whole:
                start()
        gathered = world.gather_object(results, dst=0)
        if gathered is None:
            continue
        records = [layout_record(cfg, point, m, layout, gathered) for m in point.modes]
        if point.module is None and point.collective.name == "sendrecv":
            p2p.extend((r["nbytes"], r["time_us"] * 1e-6) for r in records)
        elif point.module is not None:
            fit = fit or alphabeta.fit(p2p)
            for rec in records:
                add_model(rec, point, layout.size, fit)
        on_point(point, records)


def layout_record(cfg: BenchConfig, point: Point, inplace: bool, layout: Layout, gathered: list) -> dict:
    """The record of one point and mode over every group of the layout: times combine over all their
    ranks, and concurrent groups each keep their own time and bus bandwidth as well."""
    per_group = [[gathered[r][inplace] for r in ranks] for ranks in layout.groups]
    record = make_record(cfg, point, inplace, [row for rows in per_group for row in rows], layout.size)
    record.update(world_size=layout.world_size, group_size=layout.size, groups=len(layout.groups),
                  concurrent=layout.concurrent, level=layout.level)
    if len(per_group) > 1:
        own = [make_record(cfg, point, inplace, rows, layout.size) for rows in per_group]
        record["group_time_us"] = [r["time_us"] for r in own]
        record["group_busbw_GBps"] = [r["busbw_GBps"] for r in own]
    return record


def make_record(cfg: BenchConfig, point: Point, inplace: bool, per_rank: list, n: int) -> dict:
    """One JSON record of `n`-rank collectives: nccl-tests' row plus per-rank statistics and the raw
    times (of every rank in `per_rank`)."""
    coll = point.collective
    esize = DTYPES[point.dtype].itemsize if point.dtype else 0
    nbytes = point.count * esize
    times = [t for t, _, _ in per_rank]
    wrongs = [w for _, w, _ in per_rank]
    stats = summarize(times, cfg.agg)
    algbw, busbw = bandwidths(nbytes, stats["time_us"], coll.bus_factor(n))
    record = {
        "collective": coll.name, "algo": point.algo, "backend": cfg.backend, "world_size": n,
        "dtype": point.dtype, "redop": point.op, "root": point.root,
        "inplace": inplace, "nbytes": nbytes, "count": point.count, "requested_nbytes": point.requested,
        "time_us": stats.pop("time_us"), "algbw_GBps": algbw, "busbw_GBps": busbw,
        "bus_factor": coll.bus_factor(n),
        "wrong": None if wrongs[0] is None else int(sum(wrongs)),
        "agg": cfg.agg, "iters": cfg.iters, "warmup": cfg.warmup, "agg_iters": cfg.agg_iters,
        "blocking": cfg.blocking, "check_iters": cfg.check,
        **stats,
        "times_us": [[t / 1e3 for t in row] for row in times],
    }
    if point.module is not None:
        record["sent_bytes"] = [s for _, _, s in per_rank]
        record["sent_bytes_model"] = [point.module.sent_bytes(n, r % n, point.count, esize, point.root or 0)
                                      for r in range(len(per_rank))]
    return record


def add_model(record: dict, point: Point, n: int, fit: alphabeta.AlphaBeta | None) -> None:
    """The algorithm's step count and α–β prediction, next to what was measured."""
    module = point.module
    record["steps"] = module.steps(n, record["nbytes"])
    record["alpha_beta"] = None if fit is None else fit.as_record()
    model = None if fit is None else module.cost(n, record["nbytes"], fit.alpha_s, fit.beta_s_per_byte) * 1e6
    record["model_us"] = model
    record["time_over_model"] = record["time_us"] / model if model else None
