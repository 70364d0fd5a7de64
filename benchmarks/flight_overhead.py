"""What the flight recorder and the fault hook cost per op: `Comm._call` as shipped against the same
method without them, on the MPI path, side by side in one process.

The flight recorder (comm/failure/flight.py) appends one tuple per op to a ring and advances the group's seq; the
fault hook (comm/failure/faults.py) is one attribute test. Both stay on by default, so their cost is paid by
every op of every run. `without` below is a Comm whose `_call` is the shipped one minus those lines
(kept here as the reference); both run the same in-place 8-byte all_reduce N times per round through
the real MpiComm, rounds alternating which goes first. A 1-rank MPI world isolates the per-op cost from
network noise (the op is a local copy, ~0.3 µs); 2 ranks show it beside a real exchange.

    python benchmarks/flight_overhead.py [--quick] [--rounds 15] [--iters 20000] [--nproc 1,2] [--json PATH]

extra = the median over rounds of (with − without), with its 95 % CI (benchmarks/common.py's median_ci).
--quick: 1 rank, 2 rounds of 200 ops; seconds, to see that it runs.

A third arm, `file`, is the shipped Comm with its ring also kept in a job folder, as under commprof's
launcher (comm/failure/ring_file.py: what a rank killed by its backend last called): its cost is file − with.

Target: ≤ 0.3 µs per op; the ring file ≤ 0.5 µs more. Results: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time

from common import job, median_ci, order, parse, parser

TARGET_US = 0.3
FILE_TARGET_US = 0.5
"""The ring kept in the job folder too (comm/failure/ring_file.py, under commprof's launcher): one struct write into
shared memory per op, ≤ 0.5 µs beside an op that costs tens of µs on gloo."""
QUICK = {"rounds": 2, "iters": 200, "nproc": "1"}
"""--quick: 1 rank, 2 rounds of 200 ops."""


def worker(rounds: int, iters: int) -> None:
    import torch
    from mpi4py import MPI

    from commprof.base.errors import CommprofError
    from commprof.base.measurement import P2P
    from commprof.comm.failure import ring_file
    from commprof.comm.mpi_comm import MpiComm
    from commprof.record.annotate import ANNOTATOR
    from commprof.record.clock import CpuClock

    class Without(MpiComm):
        """The shipped `_call` without the fault hook, the seq and the ring append."""

        def _call(self, name, nbytes, dtype, async_op, fn, *args):
            hit = self._labels.get((name, nbytes, dtype))
            if hit is None:
                hit = self._label(name, nbytes, dtype)
            label = hit[0]
            ANNOTATOR.push(label)
            self.busy_seq += 1
            self.busy = name
            try:
                start = self._now()
                work = fn(*args)
                if async_op:
                    return work
                end = self._now()
            except CommprofError:
                raise
            except Exception as exc:
                raise self.failure(name, exc) from exc
            finally:
                self.busy = None
                ANNOTATOR.pop()
            self._log((name, nbytes, self.world_size, start, end, False, self.label))
            return None

    assert "all_reduce" not in P2P
    world = MPI.COMM_WORLD
    comms = {"with": MpiComm(comm=world, clock=CpuClock()), "without": Without(comm=world, clock=CpuClock()),
             "file": MpiComm(comm=world, clock=CpuClock())}
    folder = tempfile.mkdtemp(prefix="flight-overhead-")
    ring_file.keep(comms["file"].recorder, folder, world.rank)  # as under commprof's launcher
    tensor = torch.zeros(2)
    per_round = {k: [] for k in comms}
    for r in range(rounds):
        for key in order(comms, r):
            comm = comms[key]
            world.Barrier()
            start = time.perf_counter_ns()
            for _ in range(iters):
                comm.all_reduce(tensor)
            per_round[key].append((time.perf_counter_ns() - start) / iters / 1e3)
            comm.recorder.clear()
    shutil.rmtree(folder)
    mine = {k: v for k, v in per_round.items()}
    everyone = world.gather(mine, root=0)
    if world.rank == 0:
        print(json.dumps(everyone))


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--nproc", default="1,2")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parse(p, QUICK)
    if args.worker:
        worker(args.rounds, args.iters)
        return 0
    from commprof.launcher.launch import find_mpiexec

    rows = []
    for n in (int(v) for v in args.nproc.split(",")):
        out = job([find_mpiexec(), "-n", str(n), sys.executable, __file__, "--worker", "--rounds", str(args.rounds),
                   "--iters", str(args.iters)], timeout_s=900, what=f"flight_overhead: {n} rank(s)")
        per_rank = json.loads(out.strip().splitlines()[-1])
        # per round: mean over ranks of the difference; median over rounds
        diffs = [statistics.fmean(r["with"][i] - r["without"][i] for r in per_rank) for i in range(args.rounds)]
        files = [statistics.fmean(r["file"][i] - r["with"][i] for r in per_rank) for i in range(args.rounds)]
        median = {k: statistics.median(statistics.fmean(r[k][i] for r in per_rank) for i in range(args.rounds))
                  for k in ("with", "without", "file")}
        rows.append({"nproc": n, "with_us": median["with"], "without_us": median["without"],
                     "extra_us": statistics.median(diffs), "extra_ci95_us": median_ci(diffs),
                     "file_us": median["file"], "file_extra_us": statistics.median(files),
                     "file_extra_ci95_us": median_ci(files), "rounds": args.rounds, "iters": args.iters})
    print(f"{'ranks':>5} {'without (µs/op)':>16} {'with (µs/op)':>13} {'extra (µs/op)':>14} {'95 % CI':>17}  "
          f"target ≤ {TARGET_US} µs")
    for row in rows:
        verdict = "ok" if row["extra_us"] <= TARGET_US else "OVER"
        lo, hi = row["extra_ci95_us"]
        print(f"{row['nproc']:>5} {row['without_us']:>16.3f} {row['with_us']:>13.3f} {row['extra_us']:>14.3f} "
              f"{f'{lo:.3f} … {hi:.3f}':>17}  {verdict}")
    print(f"\n{'ranks':>5} {'with (µs/op)':>13} {'+ ring file':>12} {'its cost (µs/op)':>17} {'95 % CI':>17}  "
          f"target ≤ {FILE_TARGET_US} µs")
    for row in rows:
        verdict = "ok" if row["file_extra_us"] <= FILE_TARGET_US else "OVER"
        lo, hi = row["file_extra_ci95_us"]
        print(f"{row['nproc']:>5} {row['with_us']:>13.3f} {row['file_us']:>12.3f} {row['file_extra_us']:>17.3f} "
              f"{f'{lo:.3f} … {hi:.3f}':>17}  {verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
