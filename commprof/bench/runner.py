"""The sweep: for each collective, dtype, op and size, check once, warm up, time each iteration on
every rank, gather the times on rank 0 and turn them into one record per mode (out-of-place, in-place).

Runs on every rank; only rank 0 gets records. Exercised by: `pytest tests/test_bench_cli.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

from commprof.bench.collectives import COLLECTIVES, Collective
from commprof.bench.config import BenchConfig
from commprof.comm import Comm, unsupported
from commprof.comm.dtypes import DTYPES
from commprof.profile.stats import bandwidths, summarize

MODES = (False, True)  # out-of-place, in-place: the order of nccl-tests' columns


@dataclass(frozen=True)
class Point:
    """One row of a table: a collective at one size, dtype and op."""

    collective: Collective
    dtype: str | None
    op: str | None
    requested: int
    """Bytes asked for (-b/-e/-f)."""
    count: int
    """Elements in the reported size after rounding."""
    modes: tuple[bool, ...]
    """Modes (in-place flags) the backend can run."""


@dataclass
class Plan:
    points: list[Point] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Rounding and skipped combinations, said once in the report."""


def plan(cfg: BenchConfig, world_size: int) -> Plan:
    """Every row the sweep will measure; UsageError-free (validation happens in the CLI)."""
    out, sizes = Plan(), cfg.sizes()
    for name in cfg.collectives:
        coll = COLLECTIVES[name]
        if name == "barrier":
            out.points.append(Point(coll, None, None, 0, 0, (False,)))
            continue
        for dtype in cfg.dtypes:
            for op in (cfg.ops if coll.reduces else (None,)):
                modes = tuple(m for m in MODES if not unsupported(cfg.backend, name, DTYPES[dtype], op, m))
                if not modes:
                    out.notes.append(f"{name} {dtype} {op or ''}: skipped, "
                                     f"{unsupported(cfg.backend, name, DTYPES[dtype], op, True)}".replace("  ", " "))
                    continue
                out.points.extend(_sized(coll, dtype, op, modes, sizes, world_size, out.notes))
    return out


def _sized(coll, dtype, op, modes, sizes, n, notes) -> Iterator[Point]:
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
        yield Point(coll, dtype, op, requested, count, modes)
    if rounded:
        shown = ", ".join(f"{a}→{b}" for a, b in rounded[:4]) + (" …" if len(rounded) > 4 else "")
        why = f"{n} ranks × {esize} B" if coll.split else f"{esize} B elements"
        notes.append(f"{coll.name} {dtype}: sizes rounded down to multiples of {why} "
                     f"({shown}; sizes that reach 0 B or repeat are dropped)")


def measure(comm: Comm, cfg: BenchConfig, point: Point, inplace: bool) -> tuple[list[int], int | None]:
    """This rank's per-iteration times (ns) and wrong-element count for one point and mode."""
    dtype = DTYPES[point.dtype] if point.dtype else None
    case = point.collective.prepare(comm, point.count, dtype, point.op or "sum", inplace, cfg.root)
    wrong = None
    if cfg.check:
        case.init()
        case.run()
        wrong = case.wrong()
    run = case.run
    for _ in range(cfg.warmup):
        run()
    recorder = comm.recorder
    comm.control_barrier()
    mark = recorder.mark()
    for _ in range(cfg.iters):
        run()
    times = recorder.durations_ns(mark)
    recorder.clear()
    return times, wrong


def sweep(comm: Comm, cfg: BenchConfig, the_plan: Plan,
          on_point: Callable[[Point, list[dict]], None]) -> None:
    """Measure every point; on rank 0 call `on_point(point, records)` as each completes."""
    for point in the_plan.points:
        results = {m: measure(comm, cfg, point, m) for m in point.modes}
        gathered = comm.gather_object(results, dst=0)
        if gathered is not None:
            on_point(point, [make_record(comm, cfg, point, m, [g[m] for g in gathered]) for m in point.modes])


def make_record(comm: Comm, cfg: BenchConfig, point: Point, inplace: bool, per_rank: list) -> dict:
    """One JSON record: nccl-tests' row plus per-rank statistics and the raw times."""
    coll, n = point.collective, comm.world_size
    esize = DTYPES[point.dtype].itemsize if point.dtype else 0
    nbytes = point.count * esize
    times = [t for t, _ in per_rank]
    wrongs = [w for _, w in per_rank]
    stats = summarize(times, cfg.agg)
    algbw, busbw = bandwidths(nbytes, stats["time_us"], coll.bus_factor(n))
    return {
        "collective": coll.name, "backend": cfg.backend, "world_size": n,
        "dtype": point.dtype, "redop": point.op, "root": cfg.root if coll.name in ("broadcast", "reduce") else None,
        "inplace": inplace, "nbytes": nbytes, "count": point.count, "requested_nbytes": point.requested,
        "time_us": stats.pop("time_us"), "algbw_GBps": algbw, "busbw_GBps": busbw,
        "bus_factor": coll.bus_factor(n),
        "wrong": None if wrongs[0] is None else int(sum(wrongs)),
        "agg": cfg.agg, "iters": cfg.iters, "warmup": cfg.warmup,
        **stats,
        "times_us": [[t / 1e3 for t in row] for row in times],
    }
