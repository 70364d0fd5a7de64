"""Why the op log holds plain tuples: a NamedTuple entry against a plain tuple read through named index
constants (record/recorder.py's NAME … GROUP), side by side in one process.

Each round builds N entries shaped like `Comm._log`'s — (name, nbytes, group_size, start, end, host,
group), all atomic with CPU stamps — both ways, the order flipping every round, and times
  append   the loop `append((…))` / `append(Entry(…))`: what every op pays on the hot path, the
           automatic collections it triggers included
  build    the same loop with the collector disabled: the entry's construction alone
  gc       one `gc.collect()` with the log alive, after a first collection has run (CPython untracks a
           tuple of atomics when a collection visits it, but only an exact tuple: a NamedTuple entry
           stays tracked and is traversed by every full collection for as long as the log lives)
  read     one pass summing `end - start` over the log: the readers' cost, `op[END]` against `op.end`
A `gc` figure for an empty log is printed as the floor. Medians over rounds; ratios are NamedTuple / tuple.

    python benchmarks/oplog_gc.py [--quick] [--entries 1000000] [--rounds 7] [--json PATH]

--quick: 10,000 entries, 2 rounds. Prints one line per measure: tuple, NamedTuple, the ratio of their
medians, and the median of the per-round ratios with its 95 % CI (benchmarks/common.py's ratio_ci); --json
writes the same. Results: record/recorder.py's docstring.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from pathlib import Path
from typing import NamedTuple

from common import order, parse, parser, ratio_ci

NAME, NBYTES, GROUP_SIZE, START, END, HOST, GROUP = range(7)
QUICK = {"entries": 10_000, "rounds": 2}
"""--quick: 10,000 entries, 2 rounds."""


class Entry(NamedTuple):
    name: str
    nbytes: int
    group_size: int
    start: int
    end: int
    host: bool
    group: str


def fill_tuples(n: int, t0: int) -> tuple[list, float]:
    log: list = []
    append = log.append  # bound once, as Comm does
    start = time.perf_counter()
    for i in range(n):
        append(("all_reduce", 4096, 2, t0 + i, t0 + i + 500, True, "world"))
    return log, time.perf_counter() - start


def fill_named(n: int, t0: int) -> tuple[list, float]:
    log: list = []
    append = log.append
    start = time.perf_counter()
    for i in range(n):
        append(Entry("all_reduce", 4096, 2, t0 + i, t0 + i + 500, True, "world"))
    return log, time.perf_counter() - start


def without_gc(fill, n: int, t0: int) -> float:
    gc.disable()
    try:
        return fill(n, t0)[1]
    finally:
        gc.enable()


def timed_gc() -> float:
    gc.collect()  # the first collection untracks what it can
    start = time.perf_counter()
    gc.collect()
    return time.perf_counter() - start


def read_tuples(log: list) -> float:
    start = time.perf_counter()
    sum(op[END] - op[START] for op in log)
    return time.perf_counter() - start


def read_named(log: list) -> float:
    start = time.perf_counter()
    sum(op.end - op.start for op in log)
    return time.perf_counter() - start


def one_round(n: int, r: int) -> dict[str, tuple[float, float]]:
    """(tuple, NamedTuple) seconds per measure in round r; each log is measured alone, the other one freed."""
    t0 = time.perf_counter_ns()  # large ints, as stamps are: never the small-int cache
    out: dict[str, list] = {k: [0.0, 0.0] for k in ("append", "build", "gc", "read")}
    for named in order((False, True), r):
        fill = fill_named if named else fill_tuples
        out["build"][named] = without_gc(fill, n, t0)
        log, append_s = fill(n, t0)
        out["append"][named] = append_s
        out["gc"][named] = timed_gc()
        out["read"][named] = (read_named if named else read_tuples)(log)
        del log
    return {k: (v[0], v[1]) for k, v in out.items()}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=7)
    args = parse(p, QUICK)
    gc.collect()
    floor = statistics.median(timed_gc() for _ in range(args.rounds))
    rounds = [one_round(args.entries, r) for r in range(args.rounds)]
    n = args.entries
    print(f"{n:,} entries, {args.rounds} rounds, medians; gc.collect() with no log: {floor * 1e3:.1f} ms")
    print(f"{'':8} {'tuple':>12} {'NamedTuple':>12} {'ratio':>7}  {'per round, 95 % CI':>22}")
    per_op = 1e9 / n
    measures = {}
    for what, scale, unit in (("append", per_op, "ns/op"), ("build", per_op, "ns/op"), ("gc", 1e3, "ms"),
                              ("read", per_op, "ns/op")):
        plain = statistics.median(r[what][0] for r in rounds)
        named = statistics.median(r[what][1] for r in rounds)
        paired = ratio_ci([r[what][1] for r in rounds], [r[what][0] for r in rounds])
        measures[what] = {"unit": unit, "tuple": plain * scale, "namedtuple": named * scale, "ratio": named / plain,
                          "paired_ratio": paired["ratio"], "paired_ratio_ci95": paired["ci95"]}
        lo, hi = paired["ci95"]
        print(f"{what:8} {plain * scale:8.1f} {unit:<5} {named * scale:6.1f} {unit:<5} {named / plain:6.2f}×  "
              f"{paired['ratio']:6.2f}× [{lo:.2f}, {hi:.2f}]")
    if args.json:
        Path(args.json).write_text(json.dumps({"entries": n, "rounds": args.rounds, "gc_floor_ms": floor * 1e3,
                                               "measures": measures}, indent=1) + "\n")


if __name__ == "__main__":
    main()
