"""`commprof bench` against the floor: on MPI a minimal C loop and a bare mpi4py loop, on gloo a bare
torch.distributed loop.

For all_reduce, all_gather, reduce_scatter and broadcast (float32, sum; broadcast in place only, as MPI
and commprof's MPI backend have no out-of-place broadcast) at 8 B, 1 KiB, 64 KiB, 1 MiB and 16 MiB
(nccl-tests' sizes: all_gather/reduce_scatter move that much in total), out of place and in place, on 2
ranks, each round launches, per size and in an order that rotates every round:

  C          benchmarks/baseline/mpi_loop.c (built with the venv's mpicc into build/mpi_loop) under `mpiexec -n 2`;
  mpi4py     the bare mpi4py loop below (NumPy buffers);
  commprof   `commprof bench <all four> --backend mpi --nproc 2 -b S -e S -n N -w W -c 0 --json …`,
             its records' time_us;

all three at the MPI thread level commprof asks for (commprof.comm.MPI_THREAD_LEVEL, funneled). With
--multiple, two more columns run C and mpi4py at MPI_THREAD_MULTIPLE (mpi4py's own default), to show
what that level alone costs. On gloo (--backend gloo or both), two columns:

  torch      the bare torch.distributed loop below (dist.all_reduce, all_gather_into_tensor,
             reduce_scatter_tensor, broadcast on the tensors commprof's bench allocates);
  commprof   `commprof bench … --backend gloo`, in the modes gloo runs.

Each side is a launch of its own, and on 2 cores a gloo launch's latency moves ±20 % with where its
threads land: for commprof's own cost on gloo, benchmarks/gloo_paired.py compares call by call in one launch.

All three time alike, as commprof.bench.runner.measure() does: fresh buffers per collective and mode,
W warm-up calls, one barrier, then N calls back to back, each timed on its own with a monotonic clock
(perf_counter_ns / CLOCK_MONOTONIC) around just that call, no barrier between them; in-place
reduce_scatter includes the copy of the result into chunk `rank`, as MpiComm does. The first table is
time_us = mean over the 2 ranks of each rank's mean (bench's `-a avg`), the number bench reports; the
second, median_us = mean over ranks of each rank's median iteration, which a preempted iteration cannot
move. Both show the median over rounds. Ratios and differences are commprof against C (the floor: what
MPI itself costs) and against mpi4py (what Python and mpi4py cost, so commprof − mpi4py is commprof's
own path).

    python benchmarks/vs_c.py [--quick] [--backend mpi|gloo|both] [--rounds 7] [--multiple]
                              [--sizes 8,1K,64K,1M,16M] [--json benchmarks/results/vs-c-results.json]

~5 minutes at the defaults on 2 cores (commprof's own start-up is most of it); --quick: MPI's three
columns, one round at 8 B with a fifth of the iterations, seconds, to see that it runs. Needs a C compiler
for benchmarks/baseline/mpi_loop.c (through the venv's mpicc) when MPI is measured: without one it says so
in one line and exits 77.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from common import ROOT, job, parse, parser, run_all, skip

BUILD_SCRIPT = ROOT / "benchmarks" / "baseline" / "build_mpi_loop.sh"
SOURCE = ROOT / "benchmarks" / "baseline" / "mpi_loop.c"
BINARY = ROOT / "build" / "mpi_loop"
NPROC = 2
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
SPLIT = {"all_gather", "reduce_scatter"}
OUT_OF_PLACE = {"all_reduce", "all_gather", "reduce_scatter"}
SIZES = (8, 1 << 10, 64 << 10, 1 << 20, 16 << 20)
ITERS = {8: 2000, 1 << 10: 2000, 64 << 10: 500, 1 << 20: 100, 16 << 20: 20}
"""Timed iterations per size; other sizes get ITERS of the nearest size below."""
COLUMNS = {"mpi": ("c", "mpi4py", "commprof"), "gloo": ("torch", "commprof")}
MULTIPLE = ("c_multiple", "mpi4py_multiple")
FLOOR = {"mpi": "c", "gloo": "torch"}
HEADERS = {"c": "C", "mpi4py": "mpi4py", "torch": "torch.distributed", "commprof": "commprof",
           "c_multiple": "C multiple", "mpi4py_multiple": "mpi4py multiple"}
LAUNCH_TIMEOUT_S = 300
METRICS = {"time_us": "mean over ranks of per-rank means: what bench reports",
           "median_us": "mean over ranks of per-rank medians: robust to preemption"}
QUICK = {"backend": "mpi", "rounds": 1, "sizes": "8"}
"""--quick: MPI's three columns (C, mpi4py, commprof), one round at 8 B, a fifth of the iterations."""


def iters_for(size: int, scale: float) -> tuple[int, int]:
    """(timed iterations, warm-up iterations) for one size."""
    base = ITERS[max((s for s in ITERS if s <= size), default=8)]
    n = max(5, round(base * scale))
    return n, max(5, n // 10)


def parse_size(text: str) -> int:
    text = text.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if mult > 1 else text) * mult


# ---- the bare loops (one rank each; started by the parent with --worker) --------------------------
def mpi4py_case(world, coll: str, count: int, inplace: bool):
    """The call to time for one collective and mode, as benchmarks/baseline/mpi_loop.c and MpiComm make it."""
    import numpy as np
    from mpi4py import MPI

    n, rank = world.Get_size(), world.Get_rank()
    chunk = count // n
    a = np.zeros(count, np.float32)
    b = None if inplace else np.zeros(chunk if coll in SPLIT else count, np.float32)
    if coll == "all_reduce":
        return partial(world.Allreduce, *((MPI.IN_PLACE, a) if inplace else (a, b)))
    if coll == "all_gather":  # a: output; in place, this rank's input is chunk `rank` of it
        return partial(world.Allgather, *((MPI.IN_PLACE, a) if inplace else (b, a)))
    if coll == "broadcast":
        return partial(world.Bcast, a, root=0)
    if not inplace:
        return partial(world.Reduce_scatter_block, a, b)
    mine, first, reduce_scatter = a[rank * chunk:(rank + 1) * chunk], a[:chunk], world.Reduce_scatter_block

    def run():  # MPI leaves the result at the start; NCCL's in-place contract wants it in chunk `rank`
        reduce_scatter(MPI.IN_PLACE, a)
        if rank:
            mine[:] = first

    return run


def torch_case(coll: str, count: int, inplace: bool):
    """The torch.distributed call a user would time, on gloo."""
    import torch
    import torch.distributed as dist

    n, rank = dist.get_world_size(), dist.get_rank()
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    a = torch.zeros(count)
    chunk = count // n
    b = a[rank * chunk:(rank + 1) * chunk] if inplace else torch.zeros(chunk)
    return {"all_reduce": partial(dist.all_reduce, a), "broadcast": partial(dist.broadcast, a, 0),
            "all_gather": partial(gather, a, b), "reduce_scatter": partial(scatter, b, a)}[coll]


def worker(kind: str, sizes: list[int], iters: int, warmup: int) -> None:
    """Every collective, size and mode of this backend, timed as bench times; JSON lines on rank 0."""
    if kind == "mpi4py":
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        n, barrier, gather = world.Get_size(), world.Barrier, partial(world.gather, root=0)
        provided = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
                    MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}[MPI.Query_thread()]
        case, modes = partial(mpi4py_case, world), {c: (False, True) for c in OUT_OF_PLACE}
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        n, barrier, provided, case = dist.get_world_size(), dist.barrier, None, torch_case
        modes = {"all_gather": (False, True), "reduce_scatter": (False, True)}  # gloo's out-of-place ops

        def gather(obj):
            out = [None] * n if dist.get_rank() == 0 else None
            dist.gather_object(obj, out, dst=0)
            return out
    now = time.perf_counter_ns
    for coll in COLLECTIVES:
        unit, seen = (4 * n if coll in SPLIT else 4), {0}
        for size in sizes:
            count = size // unit * (unit // 4)
            if count in seen:  # bench drops sizes that round to 0 B or repeat
                continue
            seen.add(count)
            for inplace in modes.get(coll, (True,)):
                run = case(coll, count, inplace)
                for _ in range(warmup):
                    run()
                barrier()
                times = []
                for _ in range(iters):
                    t0 = now()
                    run()
                    times.append(now() - t0)
                per_rank = gather((statistics.fmean(times) / 1e3, statistics.median(times) / 1e3))
                if per_rank is not None:
                    print(json.dumps({
                        "collective": coll, "nbytes": count * 4, "inplace": inplace, "iters": iters,
                        "warmup": warmup, "thread_provided": provided,
                        "time_us": statistics.fmean(m for m, _ in per_rank),
                        "median_us": statistics.fmean(m for _, m in per_rank)}), flush=True)
    if kind == "torch":  # gloo's threads must not outlive the interpreter (see commprof.comm.end_process)
        dist.destroy_process_group()
        sys.stdout.flush()
        os._exit(0)


# ---- the parent: build, launch, interleave, tabulate -----------------------------------------------
def mpicc() -> Path:
    return Path(sys.executable).parent / "mpicc"


def build() -> Path:
    """build/mpi_loop, rebuilt with the venv's mpicc when older than benchmarks/baseline/mpi_loop.c. Without
    mpicc, or the C compiler it calls, this benchmark cannot run here: it says so in one line and exits SKIP."""
    if BINARY.exists() and BINARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return BINARY
    if not mpicc().exists():
        skip("vs_c", f"no mpicc next to this Python ({mpicc()}): the mpich wheel is not installed")
    shown = subprocess.run([str(mpicc()), "-show"], capture_output=True, text=True).stdout.split()
    if not shown or shutil.which(shown[0]) is None:
        skip("vs_c", f"mpicc calls {shown[0] if shown else 'a C compiler'}, which is not on PATH: "
                     "benchmarks/baseline/mpi_loop.c cannot be built")
    job(["bash", str(BUILD_SCRIPT), str(BINARY)], env={**os.environ, "MPICC": str(mpicc())}, timeout_s=300,
        what="vs_c: benchmarks/baseline/build_mpi_loop.sh")
    return BINARY


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def launch(command: list[str], env: dict) -> str:
    return job(command, env=env, timeout_s=LAUNCH_TIMEOUT_S, what=f"vs_c: {' '.join(command[:6])} …")


def launch_torch(command: list[str], env: dict) -> str:
    """NPROC processes of `command` joined by torch.distributed's env:// rendezvous; rank 0's stdout."""
    from commprof.base.backends import free_port

    base = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(NPROC)}
    return run_all([(command, {**base, "RANK": str(r)}) for r in range(NPROC)], timeout_s=LAUNCH_TIMEOUT_S,
                   what=f"vs_c: {' '.join(command[:4])} …", labels=[f"rank {r}" for r in range(NPROC)])[0]


def run_column(backend: str, column: str, size: int, iters: int,
               warmup: int) -> dict[tuple[str, bool], tuple[float, float]]:
    """One launch of one column at one size: (collective, inplace) -> (time_us, median_us)."""
    from commprof.comm import MPI_THREAD_LEVEL
    from commprof.launcher.launch import find_mpiexec

    level = "multiple" if column.endswith("_multiple") else MPI_THREAD_LEVEL
    # commprof's launcher gives its ranks huge pages for torch's large buffers (NumPy's and the C loop's
    # have them too): the bare torch loop gets the same.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "THP_MEM_ALLOC_ENABLE": "1", "MPI4PY_RC_THREAD_LEVEL": level,
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    common = ["-n", str(iters), "-w", str(warmup)]
    me = [sys.executable, str(Path(__file__).resolve()), "--sizes", str(size), *common, "--worker"]
    if column in ("c", "c_multiple"):
        out = json_lines(launch([find_mpiexec(), "-n", str(NPROC), str(BINARY), "-s", str(size), *common,
                                 "--thread", level], env))
    elif column.startswith("mpi4py"):
        out = json_lines(launch([find_mpiexec(), "-n", str(NPROC), *me, "mpi4py"], env))
    elif column == "torch":
        out = json_lines(launch_torch([*me, "torch"], env))
    else:
        with tempfile.TemporaryDirectory(prefix="vs-c-") as tmp:
            path = Path(tmp) / "bench.json"
            launch([sys.executable, "-m", "commprof", "bench", *COLLECTIVES, "--backend", backend,
                    "--nproc", str(NPROC), "-b", str(size), "-e", str(size), *common, "-c", "0",
                    "--json", str(path)], env)
            out = [{"collective": r["collective"], "inplace": r["inplace"], "time_us": r["time_us"],
                    "median_us": statistics.fmean(p["p50_us"] for p in r["per_rank"])}
                   for r in json.loads(path.read_text())["results"]]
    wrong = {r["thread_provided"] for r in out if r.get("thread_provided") not in (None, level)}
    if wrong:
        sys.exit(f"vs_c: {column} asked MPI for thread level {level} and got {', '.join(wrong)}")
    return {(r["collective"], r["inplace"]): (r["time_us"], r["median_us"]) for r in out}


def measure(backends: dict[str, tuple[str, ...]], sizes: list[int], rounds: int, scale: float) -> list[dict]:
    """Every column at every size, rounds interleaved; one row per (backend, collective, size, mode)."""
    raw: dict[tuple, dict[str, list[tuple[float, float]]]] = {}
    started = time.monotonic()
    launches = [(b, c) for b, columns in backends.items() for c in columns]
    for r in range(rounds):
        for i, size in enumerate(sizes):
            iters, warmup = iters_for(size, scale)
            k = (r + i) % len(launches)  # rotate so no column always runs first or last
            for backend, column in launches[k:] + launches[:k]:
                for key, value in run_column(backend, column, size, iters, warmup).items():
                    cell = raw.setdefault((backend, key[0], size, key[1], iters, warmup), {})
                    cell.setdefault(column, []).append(value)
        print(f"round {r + 1}/{rounds} done, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    order = {c: i for i, c in enumerate(COLLECTIVES)}
    rows = []
    for (backend, coll, size, inplace, iters, warmup), cells in sorted(raw.items(), key=lambda kv: (
            kv[0][0], order[kv[0][1]], kv[0][2], kv[0][3])):
        row = {"backend": backend, "collective": coll, "nbytes": size, "inplace": inplace, "iters": iters,
               "warmup": warmup, "time_us": {c: statistics.median(t for t, _ in v) for c, v in cells.items()},
               "median_us": {c: statistics.median(m for _, m in v) for c, v in cells.items()},
               "per_round": {c: [list(tm) for tm in v] for c, v in cells.items()}}
        row["compare"] = {metric: compare(backend, row[metric]) for metric in METRICS}
        rows.append(row)
    return rows


def compare(backend: str, t: dict[str, float]) -> dict[str, float]:
    """commprof against the floor; on MPI also against mpi4py (commprof's own path), what the thread
    level MULTIPLE costs when it was measured."""
    floor = t[FLOOR[backend]]
    out = {"commprof_over_floor": t["commprof"] / floor, "commprof_minus_floor_us": t["commprof"] - floor}
    if backend == "mpi":
        out["mpi4py_minus_c_us"] = t["mpi4py"] - t["c"]
        out["commprof_minus_mpi4py_us"] = t["commprof"] - t["mpi4py"]
        for column in MULTIPLE:
            if column in t:
                out[f"{column}_minus_{column.split('_')[0]}_us"] = t[column] - t[column.split("_")[0]]
    return out


def print_table(backend: str, rows: list[dict], rounds: int, columns: tuple[str, ...], metric: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from commprof.base.units import format_bytes
    from commprof.comm import MPI_THREAD_LEVEL

    floor = HEADERS[FLOOR[backend]]
    caption = (f"all at MPI_THREAD_{MPI_THREAD_LEVEL.upper()} (commprof's level) unless named multiple; "
               "Δ mpi4py = commprof − mpi4py: commprof's own path" if backend == "mpi" else None)
    table = Table(title=f"commprof vs {floor}: {backend}, float32 sum, {NPROC} ranks, {metric} "
                        f"({METRICS[metric]}), median of {rounds} interleaved rounds", caption=caption)
    heads = ["collective", "size", "mode", "N", *(HEADERS[c] for c in columns), f"commprof / {floor}",
             f"Δ {floor} µs", *(["Δ mpi4py µs"] if backend == "mpi" else [])]
    for name in heads:
        table.add_column(name, justify="left" if name in ("collective", "mode") else "right")
    for r in (r for r in rows if r["backend"] == backend):
        t, vs = r[metric], r["compare"][metric]
        table.add_row(r["collective"], format_bytes(r["nbytes"]), "in" if r["inplace"] else "out",
                      str(r["iters"]), *(f"{t[c]:.2f}" for c in columns), f"{vs['commprof_over_floor']:.3f}",
                      f"{vs['commprof_minus_floor_us']:+.2f}",
                      *([f"{vs['commprof_minus_mpi4py_us']:+.2f}"] if backend == "mpi" else []))
    Console(width=None if sys.stdout.isatty() else 220).print(table)


def environment() -> dict:
    import mpi4py
    import torch
    from mpi4py import MPI

    from commprof.comm import MPI_THREAD_LEVEL

    return {"mpi_library": MPI.Get_library_version().splitlines()[0].strip(), "mpi4py": mpi4py.__version__,
            "torch": torch.__version__, "python": sys.version.split()[0], "cpus": os.cpu_count(),
            "mpicc": str(mpicc()), "mpi_thread_level": MPI_THREAD_LEVEL}


def main() -> None:
    p = parser(__doc__, json="vs-c-results.json")
    p.add_argument("--backend", choices=("mpi", "gloo", "both"), default="both")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma list of sizes, K/M suffixes")
    p.add_argument("--multiple", action="store_true",
                         help="two more MPI columns: C and mpi4py at MPI_THREAD_MULTIPLE")
    p.add_argument("--worker", choices=("mpi4py", "torch"), help=argparse.SUPPRESS)
    p.add_argument("-n", type=int, default=20, help=argparse.SUPPRESS)
    p.add_argument("-w", type=int, default=5, help=argparse.SUPPRESS)
    args = parse(p, QUICK)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if args.worker:
        return worker(args.worker, sizes, args.n, args.w)
    if args.rounds < 1 or not sizes:
        p.error("--rounds must be at least 1 and --sizes name a size")
    backends = {b: COLUMNS[b] + (MULTIPLE if b == "mpi" and args.multiple else ())
                for b in (("mpi", "gloo") if args.backend == "both" else (args.backend,))}
    if "mpi" in backends:
        build()
    rows = measure(backends, sizes, args.rounds, 0.2 if args.quick else 1.0)
    for backend, columns in backends.items():
        for metric in METRICS:
            print_table(backend, rows, args.rounds, columns, metric)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "world_size": NPROC, "dtype": "float32", "op": "sum", "rounds": args.rounds, "quick": args.quick,
            "columns": backends, "per_round": "[time_us, median_us] of each round, in order",
            "env": environment(), "results": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
