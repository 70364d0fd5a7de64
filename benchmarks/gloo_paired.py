"""commprof bench's own cost per op on gloo, with the launch taken out: inside commprof's own ranks, the
calls of bench's Case through Comm interleaved call by call with the bare torch.distributed call.

Why: on 2 cores, 2 gloo ranks run 3-4 busy threads each (main, gloo's TCP loop, ProcessGroupGloo's
workers), and where the scheduler puts them sets the latency for a while: the same bare loop launched ten
times in a row gave 64 KiB all_reduce medians from 430 to 660 µs, and blocks of 100 calls inside one launch
still move ±20-60 %. A 2 % target can be read neither from separate launches (benchmarks/vs_c.py) nor from
alternating blocks; here the arms take turns call by call, in one launch, one process:

  commprof     bench's own Case (prepare() on the rank's Comm, as bench's measure() makes it), every call
               through Comm (timestamps, NVTX, op log), timed from the op log as bench times it;
  torch        the same prepare() on a stand-in whose methods call torch.distributed's functions, as a
               script does, each call timed with perf_counter_ns as vs_c.py's bare loop does (Comm on
               gloo calls the ProcessGroup's methods under them: commprof/comm/gloo_comm.py);
  torch+path   the bare call followed by a busy wait as long as Comm's own path measured on this rank
               (path_ns: Comm's _call around a backend call that does nothing), the wait not counted: the
               control — it differs from torch by that much Python time per call and nothing else;
  torch again  the bare call once more, on buffers of its own: what buffer placement alone moves.

The ranks are commprof bench's own: commprof's launcher starts them (COMMPROF_RANK_WRAPPER puts this file in
front of `python -m commprof bench …`, which it then runs with measure() wrapped), the watchdog and the
control plane run, so whatever a commprof rank costs besides its per-op path is in every arm alike. Each
block: every arm's warm-up, the barrier bench passes, then N turns, each turn every arm once in one of the
24 orders (in sequence, the same on every rank). Per collective, size and mode: each arm's median over
blocks of the per-block median call; `paired` = the median over blocks of arm ÷ torch (with its 95 % CI,
benchmarks/common.py's median_ci, and its quartiles);
`pooled` = the median of every call of an arm ÷ that of every torch call.

    python benchmarks/gloo_paired.py [--quick] [--sizes 64K,1M,16M] [--blocks 12] [--iters N] [--json PATH]

--quick: 64 KiB, 4 blocks of 10 turns; seconds, to see that it runs.

Target (issue: fast where it counts): commprof ÷ torch ≤ 1.02 at ≥ 64 KiB. ~5 minutes at the defaults.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import job, median_ci, parse, parser, with_root

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
ITERS = {64 << 10: 100, 1 << 20: 30, 16 << 20: 5}
"""Calls per block at each size (other sizes get the nearest size below's)."""
OUT_ENV = "GLOO_PAIRED_OUT"
BLOCKS_ENV = "GLOO_PAIRED_BLOCKS"
TARGET = 1.02
ORDERS = tuple(itertools.permutations(("commprof", "torch", "torch+path", "torch again")))
"""Call by call, the arms take turns in every order in sequence, the same on every rank: each call shares
its neighbours' moment of the machine, and each arm follows each arm equally often."""
COMPARED = ("commprof", "torch+path", "torch again")
"""The arms set against torch."""
QUICK = {"sizes": "64K", "blocks": 4, "iters": 10}
"""--quick: 64 KiB, 4 blocks of 10 turns."""


# ---- inside a rank: bench with measure() wrapped ----------------------------------------------------
class BareTorch:
    """What bench's prepare() needs of a Comm, each op a call of torch.distributed's function."""

    def __init__(self, comm) -> None:
        from commprof.comm import torch_comm

        self.rank, self.world_size, self.device = comm.rank, comm.world_size, comm.device
        self._ops, self._dist = torch_comm._OPS, torch_comm.dist
        self._gather, self._scatter = torch_comm._ALL_GATHER, torch_comm._REDUCE_SCATTER

    def all_reduce(self, tensor, *, op="sum", output=None):
        self._dist.all_reduce(tensor, op=self._ops[op])

    def all_gather(self, output, input):
        self._gather(output, input)

    def reduce_scatter(self, output, input, *, op="sum"):
        self._scatter(output, input, op=self._ops[op])

    def broadcast(self, tensor, *, src):
        self._dist.broadcast(tensor, src=src)


def path_ns(comm, nbytes: int, dtype, calls: int = 2000) -> float:
    """Comm's own per-op path on this rank (stamps, NVTX range, op log entry) around a backend call that does
    nothing: the time commprof adds between two calls of a timed loop."""
    now, noop = time.perf_counter_ns, (lambda: None)
    mark = comm.recorder.mark()
    t0 = now()
    for _ in range(calls):
        comm._call("all_reduce", nbytes, dtype, False, noop)
    spent = (now() - t0) / calls
    del comm.recorder.ops[mark:]
    return spent


def shim() -> None:
    """Run the commprof command after `commprof` in argv, each point measured in paired blocks."""
    from commprof.bench import runner
    from commprof.cli.main import entry

    measure, blocks, out = runner.measure, int(os.environ[BLOCKS_ENV]), Path(os.environ[OUT_ENV])
    now = time.perf_counter_ns

    def paired(comm, cfg, point, inplace, start):
        dtype = runner.DTYPES[point.dtype]
        bare = point.collective.prepare(BareTorch(comm), point.count, dtype, point.op or "sum", inplace,
                                        cfg.root).run
        case = point.collective.prepare(comm, point.count, dtype, point.op or "sum", inplace, cfg.root)
        again = point.collective.prepare(BareTorch(comm), point.count, dtype, point.op or "sum", inplace,
                                         cfg.root).run
        spin_ns = path_ns(comm, point.count * dtype.itemsize, dtype)

        def bare_and_spin():  # the bare call, then as long as Comm's path takes, spent in Python
            bare()
            end = now() + spin_ns
            while now() < end:
                pass

        loops = {"commprof": case.run, "torch": bare, "torch+path": bare_and_spin, "torch again": again}
        arms: dict[str, list[list[int]]] = {arm: [] for arm in loops}
        recorder = comm.recorder
        for b in range(blocks):
            for run in loops.values():
                for _ in range(cfg.warmup):
                    run()
            recorder.clear()
            start()
            times: dict[str, list[int]] = {arm: [] for arm in loops if arm != "commprof"}
            for i in range(cfg.iters):
                for arm in ORDERS[(b * cfg.iters + i) % len(ORDERS)]:
                    if arm == "commprof":  # timed by Comm, as bench times it
                        case.run()
                    else:
                        t0 = now()
                        loops[arm]()
                        times[arm].append(now() - t0)
            arms["commprof"].append(recorder.durations_ns())
            arms["torch"].append(times["torch"])
            arms["torch again"].append(times["torch again"])
            # the spin stands in for time between calls, not in the call
            arms["torch+path"].append([t - spin_ns for t in times["torch+path"]])
        recorder.clear()
        line = {"rank": comm.rank, "collective": point.collective.name, "nbytes": point.count * 4,
                "inplace": inplace, "iters": cfg.iters, "path_us": spin_ns / 1e3, "blocks": arms}
        with open(out / f"rank{comm.rank}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        return measure(comm, cfg, point, inplace, start)  # bench's own record, as it would be

    runner.measure = paired
    sys.argv = ["commprof", *sys.argv[sys.argv.index("commprof") + 1:]]
    entry()


# ---- the parent: one commprof bench launch per size ------------------------------------------------
def launch(size: int, blocks: int, iters: int | None = None) -> list[dict]:
    iters = iters or ITERS[max((s for s in ITERS if s <= size), default=min(ITERS))]
    with tempfile.TemporaryDirectory(prefix="gloo-paired-") as tmp:
        env = {**with_root(), OUT_ENV: tmp, BLOCKS_ENV: str(blocks),
               "COMMPROF_RANK_WRAPPER": f"{sys.executable} {Path(__file__).resolve()} --shim"}
        job([sys.executable, "-m", "commprof", "bench", *COLLECTIVES, "--backend", "gloo", "--nproc", "2",
             "-b", str(size), "-e", str(size), "-n", str(iters), "-w", str(max(2, iters // 10)), "-c", "0",
             "--timeout", "600"], env=env, timeout_s=1800, what=f"gloo_paired: bench at {size} B")
        return [json.loads(line) for f in sorted(Path(tmp).glob("rank*.jsonl")) for line in f.open()]


def summarise(lines: list[dict]) -> list[dict]:
    """One row per (collective, size, mode): each rank's blocks, then the mean over ranks."""
    rows: dict[tuple, dict] = {}
    for line in lines:
        key = (COLLECTIVES.index(line["collective"]), line["nbytes"], line["inplace"])
        med = {arm: [statistics.median(b) / 1e3 for b in blocks] for arm, blocks in line["blocks"].items()}
        pooled = {arm: statistics.median(v for b in blocks for v in b) / 1e3
                  for arm, blocks in line["blocks"].items()}
        rank = {"rank": line["rank"], "path_us": line["path_us"], "blocks_us": med}
        for arm in COMPARED:
            ratios = [x / y for x, y in zip(med[arm], med["torch"])]
            rank[f"{arm}_paired"] = statistics.median(ratios)
            rank[f"{arm}_paired_ci95"] = median_ci(ratios)
            rank[f"{arm}_quartiles"] = statistics.quantiles(ratios, n=4)[::2]
            rank[f"{arm}_pooled"] = pooled[arm] / pooled["torch"]
            # turn by turn: the arm's call minus the torch call of the same turn
            diffs = sorted((a - b) / 1e3 for x, y in zip(line["blocks"][arm], line["blocks"]["torch"])
                           for a, b in zip(x, y))
            rank[f"{arm}_turn_us"] = statistics.median(diffs)
            rank[f"{arm}_turn_ci_us"] = median_ci(diffs)
        for arm in med:
            rank[f"{arm}_us"] = statistics.median(med[arm])
        row = rows.setdefault(key, {"collective": line["collective"], "nbytes": line["nbytes"],
                                    "inplace": line["inplace"], "iters": line["iters"],
                                    "blocks": len(med["torch"]), "per_rank": []})
        row["per_rank"].append(rank)
    out = []
    for key in sorted(rows):
        row = rows[key]
        for field in row["per_rank"][0]:
            if field not in ("rank", "blocks_us") and not field.endswith(("quartiles", "ci_us", "ci95")):
                row[field] = statistics.fmean(r[field] for r in row["per_rank"])
        out.append(row)
    return out


def print_table(rows: list[dict], blocks: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from commprof.base.units import format_bytes

    table = Table(title=f"commprof bench vs the bare torch.distributed call, gloo, 2 ranks, in commprof's own "
                        f"ranks: {blocks} blocks of interleaved calls, mean over ranks",
                  caption="paired: median over blocks of (arm ÷ torch) block medians; Δ/turn: median over turns "
                          "of (arm − torch) call, with rank 0's 95 % CI; control: the bare call followed by "
                          "Comm's measured path time spent in Python; again: the bare call on buffers of its own")
    for name in ("collective", "size", "mode", "N", "torch µs", "commprof µs", "paired", "Δ/turn µs [CI]",
                 "path µs", "control paired", "control Δ/turn µs [CI]", "again paired", "again Δ/turn µs [CI]"):
        table.add_column(name, justify="left" if name in ("collective", "mode") else "right")

    def turn(r, arm):
        lo, hi = r["per_rank"][0][f"{arm}_turn_ci_us"]
        return f"{r[arm + '_turn_us']:+.1f} [{lo:+.1f}, {hi:+.1f}]"

    for r in rows:
        table.add_row(r["collective"], format_bytes(r["nbytes"]), "in" if r["inplace"] else "out", str(r["iters"]),
                      f"{r['torch_us']:.1f}", f"{r['commprof_us']:.1f}", f"{r['commprof_paired']:.3f}",
                      turn(r, "commprof"), f"{r['path_us']:.2f}", f"{r['torch+path_paired']:.3f}",
                      turn(r, "torch+path"), f"{r['torch again_paired']:.3f}", turn(r, "torch again"))
    Console(width=None if sys.stdout.isatty() else 220).print(table)


def main() -> None:
    if "--shim" in sys.argv[1:2]:
        return shim()
    p = parser(__doc__, json="gloo-paired-results.json")
    p.add_argument("--sizes", default="64K,1M,16M", help="comma list, K/M suffixes")
    p.add_argument("--blocks", type=int, default=12, help="blocks of N interleaved turns (default 12)")
    p.add_argument("--iters", type=int, help="N, turns per block (default 100 at 64 KiB, 30 at 1 MiB, 5 at 16 MiB)")
    args = parse(p, QUICK)
    mult = {"K": 1 << 10, "M": 1 << 20}
    sizes = [int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)
             for s in args.sizes.split(",") if s.strip()]
    if args.blocks < 4 or not sizes or (args.iters is not None and args.iters < 1):
        p.error("--blocks must be at least 4, --iters at least 1 and --sizes name a size")
    started, lines = time.monotonic(), []
    for size in sizes:
        lines += launch(size, args.blocks, args.iters)
        print(f"{size} B done, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    rows = summarise(lines)
    print_table(rows, args.blocks)
    if args.json:
        import torch

        Path(args.json).write_text(json.dumps({
            "world_size": 2, "backend": "gloo", "dtype": "float32", "op": "sum", "blocks": args.blocks,
            "target": TARGET, "torch": torch.__version__, "cpus": os.cpu_count(), "results": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
