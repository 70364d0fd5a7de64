"""`commprof bench [COLLECTIVE ...]`: flags with nccl-tests' names and meanings, validation before any
rank starts, then either the launcher (--nproc / the default of one rank per core or GPU) or the sweep.

    commprof bench                                  # every collective, one rank per core (or GPU)
    commprof bench all_reduce -b 8 -e 16M -f 2 --nproc 4 --json out.json
    mpiexec -n 2 commprof bench --backend mpi all_gather -d all
    torchrun --nproc-per-node 8 -m commprof bench all_reduce --group-sizes 2,4,8   # a rank-count sweep in one launch
    torchrun --nproc-per-node 8 -m commprof bench all_reduce --group-sizes 2 --concurrent   # 4 pairs at once
    commprof bench all_reduce --algo library,ring,rabenseifner -e 64M   # hand-written vs the library's
    commprof bench all_reduce -b 8 -e 128M -f 2 -a 1 -c 1 -m 2 -z 0 -F out.csv   # nccl-tests' spellings too
    commprof bench all_reduce -b 8 -e 128M -f 2 --format nccl-tests   # nccl-tests' own output, for its parsers

nccl-tests' numeric and refused forms: commprof/bench/nccl_flags.py; its output layout (--format nccl-tests):
commprof/report/nccl_text.py. Exercised by: `pytest tests/test_bench_cli.py tests/test_nccl_tests_flags.py` and
`pytest tests/unit/test_cli_grammar.py`.
"""

from __future__ import annotations

import argparse
import socket
import sys

from commprof import kernels
from commprof.base import backends, flags
from commprof.base.backends import (
    DTYPES,
    REDUCE_OPS,
    default_backend,
    parse_dtypes,
    parse_ops,
    require_cuda,
    unsupported,
)
from commprof.base.errors import UsageError
from commprof.base.measurement import COLLECTIVES
from commprof.base.units import parse_size
from commprof.base.world import World
from commprof.bench import nccl_flags
from commprof.bench.config import FORMATS, MODES, BenchConfig
from commprof.launcher import lifecycle
from commprof.launcher.lifecycle import Rank
from commprof.report import nccl_text


def add_parser(subparsers, summary: str) -> None:
    p = subparsers.add_parser("bench", help=summary, description="""\
Sweep collectives one at a time over message sizes, dtypes and reduce ops, with the flags and figures of
nccl-tests (time, algorithm and bus bandwidth, per-rank statistics), each result checked against its closed
form. commprof starts one rank per core (per GPU on NCCL) unless --nproc says how many; under torchrun,
mpiexec or srun the ranks are theirs. --algo runs hand-written algorithms (ring, tree, ...) beside the
library's collective. A comma list in --nproc runs each rank count in turn.

examples:
  commprof bench                  # every collective, one rank per core or GPU
  commprof bench all_reduce -b 8 -e 16M -f 2 --nproc 4 --json out.json
  mpiexec -n 2 commprof bench --backend mpi all_gather -d all
  commprof bench all_reduce --algo library,ring,rabenseifner -e 64M
  torchrun --nproc-per-node 8 -m commprof bench all_reduce --group-sizes 2,4,8
  commprof bench all_reduce -b 8 -e 128M -f 2 --format nccl-tests
""")
    p.add_argument("collectives", nargs="*", metavar="COLLECTIVE",
                   help=f"any of {', '.join(COLLECTIVES)} (default: all)")
    p.add_argument("--algo", default=kernels.LIBRARY,
                   help=f"library (the backend's own, default), any of {', '.join(kernels.names())}, "
                        "a comma list, or all (library and every algorithm)")
    p.add_argument("--group-sizes", metavar="K,K,…",
                   help="run every collective on the first K ranks while the others wait, for each K in turn")
    p.add_argument("--concurrent", action="store_true",
                   help="with --group-sizes: every disjoint group of K ranks measures at once (contention)")
    p.add_argument("--groups", metavar="LEVELS",
                   help="intra, inter or intra,inter: measure within each host and across hosts apart")
    p.add_argument("-b", "--minbytes", default="8", help="smallest size, K/M/G suffixes (default 8)")
    p.add_argument("-e", "--maxbytes", default="16M", help="largest size (default 16M)")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0, help="multiply size by this (default 2)")
    p.add_argument("-i", "--stepbytes", default="0", help="add this many bytes instead of -f")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="untimed warm-up iterations (default 5)")
    p.add_argument("-c", "--check", type=int, default=1,
                   help="check runs per size and mode, each compared with the closed form; 0: none (default 1)")
    p.add_argument("-o", "--op", default="sum", help=f"{', '.join(REDUCE_OPS)}, a comma list, or all")
    p.add_argument("-d", "--datatype", default="float32", help=f"{', '.join(DTYPES)}, a comma list, or all")
    p.add_argument("-a", "--average", default="avg",
                   help="reported time across ranks: avg (1), min (2), max (3) or rank0 (0) (default avg)")
    p.add_argument("-r", "--root", default="0", help="root of broadcast and reduce, or all (default 0)")
    flags.add_job_flags(p, nproc="one per core, or per GPU", json="write env + results as JSON")
    flags.add_device_flag(p)
    p.add_argument("--csv", "-F", metavar="PATH", help="write results as CSV, a row per result")
    p.add_argument("--format", choices=FORMATS, default="table",
                   help="stdout: table (Rich tables and a summary, default) or nccl-tests (nccl-tests' own text, "
                        "a block per collective, for parsers of its logs; barrier, which it lacks, is left out)")
    nccl_flags.add_flags(p)
    flags.add_plot_flag(p, launcher=True)
    p.add_argument("--link-rate", metavar="RATE",
                   help="the link's rate, drawn on --plot's bus bandwidth panels: GB/s, or e.g. 200Gbit/s")
    p.set_defaults(func=main)


def parse_algos(spec: str) -> tuple[str, ...]:
    """'library,ring' or 'all' -> algorithm names, library first when present."""
    known = [kernels.LIBRARY, *kernels.names()]
    if spec == "all":
        return tuple(known)
    algos = [a.strip() for a in spec.split(",") if a.strip()]
    for algo in algos:
        if algo not in known:
            raise UsageError(f"unknown algorithm {algo!r}: choose from {', '.join(known)} or all")
    return tuple(dict.fromkeys(algos)) or (kernels.LIBRARY,)


NCCL_TESTS_NAMES = {"alltoall": "all_to_all"}
"""nccl-tests' names (its binaries' without `_perf`) where they differ from torch.distributed's."""


def _collectives(args: argparse.Namespace, algos: tuple[str, ...]) -> list[str]:
    """The collectives named, or every one the algorithms implement; an algorithm named alone must
    implement at least one of the collectives named. nccl-tests' names are taken: `alltoall`, and a binary's
    name (`all_reduce_perf`)."""
    names = []
    for raw in args.collectives:
        name = raw.removesuffix("_perf")
        name = NCCL_TESTS_NAMES.get(name, name)
        if name not in COLLECTIVES:
            raise UsageError(f"unknown collective {raw!r}: choose from {', '.join(COLLECTIVES)}")
        names.append(name)
    args.collectives = names
    if kernels.LIBRARY in algos:
        return args.collectives or list(COLLECTIVES)
    has = {c for c, by_name in kernels.CATALOG.items() for a in algos if a in by_name}
    if not args.collectives:
        return [c for c in COLLECTIVES if c in has]
    for algo in algos:
        own = [c for c, by_name in kernels.CATALOG.items() if algo in by_name]
        if not set(own) & set(args.collectives):
            raise UsageError(f"--algo {algo} implements {', '.join(own)}, not {', '.join(args.collectives)}")
    return args.collectives


def build_config(args: argparse.Namespace) -> BenchConfig:
    """Validate the flags; raise UsageError with one line naming the problem."""
    nccl_flags.refuse(args)
    flags.refuse_plot(args)
    if args.link_rate is not None:
        raise UsageError("--link-rate is drawn on the --plot figures: give --plot DIR too")
    agg = nccl_flags.average(args.average)
    root, all_roots = nccl_flags.root(args.root)
    algos = parse_algos(args.algo)
    names = _collectives(args, algos)
    if args.format == nccl_text.FORMAT:
        names = _nccl_tests_collectives(args, algos, names)
    backend = args.backend or default_backend()
    if backend == "nccl":
        require_cuda()
    device = backends.device(backend, args.device)
    job = flags.job_config(args, backend)
    for flag, value, low in (("-n", args.iters, 1), ("-w", args.warmup_iters, 0), ("-c", args.check, 0),
                             ("-m", args.agg_iters, 1)):
        flags.at_least(flag, value, low)
    flags.finite("-f", args.stepfactor)
    group_sizes = flags.int_list("--group-sizes", args.group_sizes)
    if args.concurrent and not group_sizes:
        raise UsageError("--concurrent runs groups of --group-sizes ranks at once: give --group-sizes")
    levels = tuple(dict.fromkeys(w.strip() for w in (args.groups or "").split(",") if w.strip()))
    if args.groups is not None and (not levels or set(levels) - {"intra", "inter"}):
        raise UsageError(f"--groups {args.groups!r}: give intra, inter or intra,inter")
    if levels and group_sizes:
        raise UsageError("--groups and --group-sizes each lay out the ranks: give one of them")
    if args.format == nccl_text.FORMAT and (group_sizes or levels):
        flag = "--group-sizes" if group_sizes else "--groups"
        raise UsageError(f"--format nccl-tests prints one communicator of every rank, as nccl-tests runs: drop {flag}")
    cfg = BenchConfig(
        collectives=tuple(dict.fromkeys(names)), device=device, algos=algos,
        dtypes=tuple(parse_dtypes(args.datatype)),
        ops=tuple(parse_ops(args.op)), explicit=args.datatype != "all" and args.op != "all",
        min_bytes=parse_size(args.minbytes, "-b"), max_bytes=parse_size(args.maxbytes, "-e"),
        step_factor=args.stepfactor, step_bytes=parse_size(args.stepbytes, "-i"), iters=args.iters,
        warmup=args.warmup_iters, check=args.check, agg=agg, root=root, all_roots=all_roots,
        agg_iters=args.agg_iters, blocking=bool(args.blocking),
        group_sizes=group_sizes, concurrent=args.concurrent, levels=levels, format=args.format, **job)
    cfg.sizes()  # raises on -b > -e and a factor that never grows
    if cfg.explicit:
        _require_supported(cfg)
    return cfg


def _nccl_tests_collectives(args: argparse.Namespace, algos: tuple[str, ...], names: list[str]) -> list[str]:
    """--format nccl-tests: the library's collectives only, as nccl-tests measures NCCL's own, and no barrier,
    which nccl-tests has no test of (left out of the default sweep, an error when named)."""
    if any(a != kernels.LIBRARY for a in algos):
        raise UsageError(f"--format nccl-tests prints the library's collectives, as nccl-tests measures NCCL's: "
                         f"drop --algo {args.algo}")
    if "barrier" in args.collectives:
        raise UsageError("--format nccl-tests: nccl-tests has no barrier test: drop barrier, or use --format table")
    return [n for n in names if n != "barrier"]


def _require_supported(cfg: BenchConfig) -> None:
    """An op or dtype asked for by name that none of the chosen algorithms can run is an error."""
    for name in cfg.collectives:
        coll = COLLECTIVES[name]
        if name == "barrier":
            continue
        for dtype in cfg.dtypes:
            for op in cfg.ops if coll.reduces else (None,):
                reasons = []
                if kernels.LIBRARY in cfg.algos:
                    reasons += [unsupported(cfg.backend, name, dtype, op, m) for m in MODES]
                if any(kernels.implements(name, a) for a in cfg.algos):
                    reasons.append(kernels.unsupported(dtype, op))
                if reasons and all(reasons):
                    raise UsageError(f"{name} with {dtype}{' ' + op if op else ''} on {cfg.backend}: {reasons[-1]}")


class _Bench(lifecycle.Command):
    """bench's part of the job's life cycle (commprof/launcher/lifecycle.py)."""

    build_config = staticmethod(build_config)

    @staticmethod
    def local_ranks(cfg: BenchConfig, slots: int) -> int:
        return cfg.nproc if cfg.nproc is not None else max(1, slots)

    @staticmethod
    def check_world(cfg: BenchConfig, world_size: int) -> None:
        for k in cfg.group_sizes:
            if k > world_size:
                raise UsageError(f"--group-sizes {k} is more than the {world_size} rank(s) of the job")
        smallest = min(cfg.group_sizes or (world_size,))
        if not cfg.all_roots and not 0 <= cfg.root < smallest:
            within = "" if smallest == world_size else f" of the smallest group ({smallest} ranks)"
            raise UsageError(f"--root {cfg.root} is outside 0..{smallest - 1}{within}")

    @staticmethod
    def rank_bytes(cfg: BenchConfig) -> int:
        """Host memory one rank's buffers take at the largest size: the input, the output and the check's
        expected values, each at most -e bytes (nccl-tests' size is the larger buffer's); none on a GPU."""
        return 0 if cfg.device == "cuda" else 3 * cfg.max_bytes

    @staticmethod
    def without_comm(cfg: BenchConfig, world: World) -> bool:
        return False

    @staticmethod
    def work(cfg: BenchConfig, rank: Rank) -> int:
        """The sweep of each layout of the ranks (commprof/bench/runner.py); rank 0 prints a table per
        collective, rewrites the files as points arrive and returns how many values were wrong (every
        rank's, as the sweep gathers them)."""
        from commprof.bench.runner import join, layouts, plan, sweep  # torch: loaded by the ranks only
        from commprof.bench.sweep_report import SweepReport, rank_line
        from commprof.record.annotate import ANNOTATOR, MEASURED

        world = rank.comm
        hosts = None
        if cfg.levels:  # every rank lays out the same groups: rank 0's gathered list, broadcast
            hosts = world.broadcast_object(world.gather_object(socket.gethostname(), dst=0), src=0)
        shapes = layouts(cfg, world.world_size, hosts)
        plans = [plan(cfg, layout.size) for layout in shapes]
        ranks = None
        if cfg.format == nccl_text.FORMAT:  # every rank's line of nccl-tests' `# Using devices` block
            ranks = world.gather_object(rank_line(world.rank, rank.device), dst=0)
        ANNOTATOR.push(ANNOTATOR.label(MEASURED, "iteration"))
        sink = SweepReport(cfg, rank.env, plans, shapes, rank.contention, ranks) if rank.world.rank == 0 else None
        if sink is not None:
            rank.on_failure(sink.abandon)
        for layout, the_plan in zip(shapes, plans):
            if sink is not None:
                sink.begin(layout, the_plan)
            sweep(world, join(world, layout), layout, cfg, the_plan, sink.add if sink else lambda *_: None)
        if sink is not None:
            sink.close()
        ANNOTATOR.pop()
        return sink.wrong if sink is not None else 0

    @staticmethod
    def report(cfg: BenchConfig, rank: Rank, results: list) -> int:
        """Exit 1 if any value was wrong: the tables are out already."""
        wrong = results[0]
        if wrong:
            sys.stderr.write(f"commprof: error: {wrong} wrong value(s) in the results (#wrong column)\n")
            return 1
        return 0


COMMAND = _Bench()


def main(args: argparse.Namespace) -> int:
    return lifecycle.main(COMMAND, args)
