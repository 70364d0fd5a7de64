"""commprof's own overhead: `commprof bench`'s measuring path against a minimal hand-written timing loop.

For all_reduce (in place, float32, sum) at 8 B, 64 KiB and 16 MiB on 2 ranks, over gloo
(torch.distributed) and MPI (mpi4py), each size alternates R rounds of

  minimal    `t0 = perf_counter_ns(); op; times.append(perf_counter_ns() - t0)`, N times, calling
             dist.all_reduce(tensor) or MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, ndarray) directly
             (the ndarray views torch-allocated memory, so both sides reduce the same kind of pages);
  commprof   commprof.bench.runner.measure() — the code `commprof bench` times a size with — for the
             reported times, then the same Case's `run()` N times under one wall clock, whose
             per-op times are read back from comm.recorder as measure() reads them;

each phase after a barrier, the order flipping every round. Per round, values are averaged over
ranks; the table shows medians over rounds.

    python benchmarks/overhead.py [--backend gloo|mpi|both] [--rounds 7] [--iters 2000] [--json PATH]

Reading the ratios (commprof / minimal; 1.00 = no overhead):
  (a) reported time   mean op time commprof records / the minimal loop's: what timing through Comm adds
                      inside the timed window (the Comm._call dispatch, MpiComm._buf's NumPy view, …).
  (b) wall per op     whole timed loop's wall clock / N: also counts what sits outside the window (NVTX
                      push/pop, label lookup, the log append), i.e. what a training step pays.
  extra µs            commprof − minimal per op, for (a) and (b): the absolute cost that matters at 8 B.
Targets: ratio ≤ 1.05× at ≥ 64 KiB, ≤ 3 µs extra at 8 B; verdicts say which of (a)/(b) misses.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = (8, 64 << 10, 16 << 20)
BASE_ITERS = {8: 2000, 64 << 10: 300, 16 << 20: 20}
"""Iterations per round at --iters 2000; --iters scales all of them alike."""
NPROC = 2
RATIO_TARGET = 1.05
EXTRA_TARGET_US = 3.0
LARGE = 64 << 10
"""From this size on, the target is a ratio; below it, extra µs."""
WORKER_TIMEOUT_S = 900


def iters_for(size: int, iters: int) -> int:
    return max(5, round(BASE_ITERS[size] * iters / BASE_ITERS[8]))


# ---- the two loops being compared ------------------------------------------------------------
def minimal_gloo(tensor, n: int) -> tuple[list[int], int]:
    import torch.distributed as dist

    now, times = time.perf_counter_ns, []
    start = now()
    for _ in range(n):
        t0 = now()
        dist.all_reduce(tensor)
        times.append(now() - t0)
    return times, now() - start


def minimal_mpi(array, n: int) -> tuple[list[int], int]:
    from mpi4py import MPI

    world, now, times = MPI.COMM_WORLD, time.perf_counter_ns, []
    start = now()
    for _ in range(n):
        t0 = now()
        world.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)
        times.append(now() - t0)
    return times, now() - start


def commprof_loop(comm, case, n: int) -> tuple[list[int], int]:
    """measure()'s timed loop, under one wall clock; per-op times read back as measure() does."""
    recorder, run, now = comm.recorder, case.run, time.perf_counter_ns
    mark = recorder.mark()
    start = now()
    for _ in range(n):
        run()
    wall = now() - start
    times = recorder.durations_ns(mark)
    recorder.clear()
    return times, wall


# ---- a worker: one rank of one backend ---------------------------------------------------------
def measure_size(comm, backend: str, size: int, n: int, rounds: int) -> list[dict]:
    """This rank's numbers (µs) for one size, one dict per round."""
    import torch

    from commprof.bench.config import BenchConfig
    from commprof.bench.runner import measure, plan

    cfg = BenchConfig(("all_reduce",), backend, min_bytes=size, max_bytes=size, iters=n, check=False)
    point = plan(cfg, comm.world_size).points[0]
    case = point.collective.prepare(comm, point.count, torch.float32, "sum", True, cfg.root)
    buf = torch.zeros(point.count, dtype=torch.float32)
    # MPI's minimal buffer is a plain ndarray over torch-allocated memory, like commprof's: np.zeros
    # would madvise huge pages (torch does not), which alone makes 16 MiB ~40% faster here.
    minimal, buf = (minimal_mpi, buf.numpy()) if backend == "mpi" else (minimal_gloo, buf)
    minimal(buf, min(n, 50))  # warm both paths up: first touch, connections, caches
    commprof_loop(comm, case, min(n, 50))

    def minimal_phase():
        times, wall = minimal(buf, n)
        return {"minimal_mean_us": statistics.fmean(times) / 1e3, "minimal_wall_us": wall / n / 1e3}

    def measure_phase():  # reported times, exactly as `commprof bench` gets them
        return {"commprof_mean_us": statistics.fmean(measure(comm, cfg, point, True)[0]) / 1e3}

    def loop_phase():
        times, wall = commprof_loop(comm, case, n)
        return {"commprof_wall_us": wall / n / 1e3, "commprof_loop_mean_us": statistics.fmean(times) / 1e3}

    out, phases = [], (minimal_phase, measure_phase, loop_phase)
    for i in range(rounds):  # order flips every round so neither side always goes first
        row = {}
        for phase in phases if i % 2 == 0 else phases[::-1]:
            comm.control_barrier()
            row.update(phase())
        out.append(row)
    return out


def summarize(backend: str, size: int, n: int, per_rank: list[list[dict]]) -> dict:
    """Average over ranks per round, median over rounds, ratios and verdict."""
    keys = per_rank[0][0].keys()
    rounds = [{k: statistics.fmean(r[i][k] for r in per_rank) for k in keys} for i in range(len(per_rank[0]))]
    row = {"backend": backend, "nbytes": size, "iters": n, "rounds": len(rounds)}
    row.update({k: statistics.median(r[k] for r in rounds) for k in keys})
    row["ratio_a"] = row["commprof_mean_us"] / row["minimal_mean_us"]
    row["ratio_b"] = row["commprof_wall_us"] / row["minimal_wall_us"]
    row["extra_a_us"] = row["commprof_mean_us"] - row["minimal_mean_us"]
    row["extra_b_us"] = row["commprof_wall_us"] - row["minimal_wall_us"]
    if size >= LARGE:
        missed = [k for k in "ab" if row[f"ratio_{k}"] > RATIO_TARGET]
        row["target"] = f"≤ {RATIO_TARGET:g}×"
    else:
        missed = [k for k in "ab" if row[f"extra_{k}_us"] > EXTRA_TARGET_US]
        row["target"] = f"≤ {EXTRA_TARGET_US:g} µs extra"
    row["verdict"] = "PASS" if not missed else "FAIL " + "".join(f"({k})" for k in missed)
    row["per_round"] = rounds
    return row


def worker(backend: str, rounds: int, iters: int, out: str) -> None:
    import torch

    from commprof.comm import end_process, init_comm
    from commprof.world import discover

    torch.set_num_threads(1)
    comm = init_comm(discover(), backend=backend, timeout_s=120)
    rows = []
    for size in SIZES:
        n = iters_for(size, iters)
        gathered = comm.gather_object(measure_size(comm, backend, size, n, rounds), dst=0)
        if gathered is not None:
            rows.append(summarize(backend, size, n, gathered))
    if comm.rank == 0:
        Path(out).write_text(json.dumps(rows))
    comm.close()
    end_process(0)  # not the interpreter's exit: see commprof.comm.end_process


# ---- the parent: start the ranks, print the table ----------------------------------------------
def run_backend(backend: str, rounds: int, iters: int) -> list[dict]:
    from commprof.comm import free_port
    from commprof.launch import find_mpiexec

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", backend,
               "--rounds", str(rounds), "--iters", str(iters), "--out", str(out)]
        # The same environment `commprof bench --nproc` gives its ranks (huge pages for big buffers).
        env = {**os.environ, "OMP_NUM_THREADS": "1", "THP_MEM_ALLOC_ENABLE": "1"}
        if backend == "mpi":
            procs = [subprocess.Popen([find_mpiexec(), "-n", str(NPROC), *cmd], env=env)]
        else:
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(NPROC),
                       LOCAL_WORLD_SIZE=str(NPROC))
            procs = [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
                     for r in range(NPROC)]
        if not wait_all(procs) or not out.exists():
            sys.exit(f"overhead: the {backend} ranks failed")
        return json.loads(out.read_text())


def wait_all(procs: list[subprocess.Popen], timeout_s: float = WORKER_TIMEOUT_S) -> bool:
    """Wait for every process; once one fails (or time runs out), kill the rest."""
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs):
        if any(p.returncode for p in procs) or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            return False
        time.sleep(0.1)
    return all(p.returncode == 0 for p in procs)


def print_table(rows: list[dict], rounds: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from commprof.report.units import format_bytes

    table = Table(title=f"commprof overhead: all_reduce float32 sum in place, {NPROC} ranks, "
                        f"median of {rounds} interleaved rounds",
                  caption="ratio = commprof / minimal; (a) recorded op time, (b) wall clock of the loop / N")
    for name in ("backend", "size", "N", "minimal mean µs", "commprof mean µs", "ratio (a)",
                 "minimal wall/op µs", "commprof wall/op µs", "ratio (b)", "extra µs (a)", "extra µs (b)",
                 "verdict"):
        table.add_column(name, justify="left" if name in ("backend", "verdict") else "right")
    for r in rows:
        table.add_row(r["backend"], format_bytes(r["nbytes"]), str(r["iters"]),
                      f"{r['minimal_mean_us']:.2f}", f"{r['commprof_mean_us']:.2f}", f"{r['ratio_a']:.3f}",
                      f"{r['minimal_wall_us']:.2f}", f"{r['commprof_wall_us']:.2f}", f"{r['ratio_b']:.3f}",
                      f"{r['extra_a_us']:+.2f}", f"{r['extra_b_us']:+.2f}",
                      f"{r['verdict']} ({r['target']})")
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "mpi", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per size (default 7)")
    parser.add_argument("--iters", type=int, default=BASE_ITERS[8],
                        help=f"iterations per round at 8 B (default {BASE_ITERS[8]}); larger sizes scale "
                             f"alike from {BASE_ITERS[LARGE]} at 64 KiB and {BASE_ITERS[16 << 20]} at 16 MiB")
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    parser.add_argument("--worker", choices=("gloo", "mpi"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1 or args.iters < 1:
        parser.error("--rounds and --iters must be at least 1")
    if args.worker:
        return worker(args.worker, args.rounds, args.iters, args.out)
    backends = ("gloo", "mpi") if args.backend == "both" else (args.backend,)
    rows = [row for b in backends for row in run_backend(b, args.rounds, args.iters)]
    print_table(rows, args.rounds)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "collective": "all_reduce", "dtype": "float32", "op": "sum", "inplace": True, "world_size": NPROC,
            "rounds": args.rounds, "targets": {"ratio_from_bytes": LARGE, "ratio": RATIO_TARGET,
                                               "extra_us_below": EXTRA_TARGET_US},
            "results": rows}, indent=2))


if __name__ == "__main__":
    main()
