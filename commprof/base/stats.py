"""Statistics over per-rank, per-iteration op times, and nccl-tests' bandwidths.

time_us (the reported time) = agg over ranks of each rank's mean over iterations, agg = avg|min|max (-a),
or rank0: the first rank's own (nccl-tests' -a 0).
p50/p99/min/max are over iterations of the per-iteration agg across ranks.
algbw = size / time; busbw = algbw × the collective's factor (2(n−1)/n for all_reduce, …). GB = 1e9 B.
median_ci: the 95 % confidence interval of a median (benchmarks' rounds, findings' iterations).
others_median, others_max: every rank's peers' median and most, step by step, from each step's sorted column.
gc_paused: the cyclic collector off while every rank's records are read or searched (they hold no cycle).
Exercised by: `pytest tests/unit/test_units_stats.py -k summarize`.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np

AGGS = {"avg": np.mean, "min": np.min, "max": np.max, "rank0": lambda a, axis=None: a[0]}


def summarize(times_ns: list[list[int]], agg: str = "avg") -> dict:
    """times_ns[rank][iteration] -> the record's timing fields (µs)."""
    arr = np.asarray(times_ns, dtype=np.float64) / 1e3
    fn = AGGS[agg]
    rank_mean = arr.mean(axis=1)
    per_iter = fn(arr, axis=0)
    return {
        "time_us": float(fn(rank_mean)),
        "time_us_min_rank": float(rank_mean.min()),
        "time_us_max_rank": float(rank_mean.max()),
        "slowest_rank": int(rank_mean.argmax()),
        "skew_us": float(rank_mean.max() - rank_mean.min()),
        "mean_us": float(per_iter.mean()),
        "p50_us": float(np.percentile(per_iter, 50)),
        "p99_us": float(np.percentile(per_iter, 99)),
        "min_us": float(per_iter.min()),
        "max_us": float(per_iter.max()),
        "per_rank": [
            {"rank": r, "mean_us": float(row.mean()), "p50_us": float(np.percentile(row, 50)),
             "p99_us": float(np.percentile(row, 99)), "min_us": float(row.min()), "max_us": float(row.max())}
            for r, row in enumerate(arr)
        ],
    }


def bandwidths(nbytes: int, time_us: float, bus_factor: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes per second)."""
    if nbytes == 0 or time_us <= 0:
        return 0.0, 0.0
    algbw = nbytes / (time_us * 1e3)
    return algbw, algbw * bus_factor


def median_ci(values: Sequence[float]) -> list[float]:
    """95 % confidence interval of the median (sign-test order statistics, normal approximation)."""
    v, n = sorted(values), len(values)
    half = 1.96 * n ** 0.5 / 2
    return [v[max(0, int(n / 2 - half))], v[min(n - 1, int(n / 2 + half))]]


def others_median(values: np.ndarray) -> np.ndarray:
    """values[rank, step] -> the median of the other ranks' values at each rank and step (statistics.median's:
    the mean of the two middle ones of an even count), from each step's sorted column."""
    n = values.shape[0]
    order = np.argsort(values, axis=0, kind="stable")
    column = np.take_along_axis(values, order, axis=0)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(n)[:, None].repeat(values.shape[1], axis=1), axis=0)

    def without(j):  # the j-th smallest once each rank's own value is left out
        return np.take_along_axis(column, np.where(j < pos, j, j + 1), axis=0)

    m = n - 1
    if m % 2:
        return without(np.full_like(pos, m // 2))
    return (without(np.full_like(pos, m // 2 - 1)) + without(np.full_like(pos, m // 2))) / 2


def others_max(values: np.ndarray) -> np.ndarray:
    """values[rank, step] -> the largest of the other ranks' values at each rank and step."""
    top = np.argmax(values, axis=0)
    first = values.max(axis=0)
    rest = values.copy()
    rest[top, np.arange(values.shape[1])] = -np.inf
    second = rest.max(axis=0)
    out = np.broadcast_to(first, values.shape).copy()
    out[top, np.arange(values.shape[1])] = second
    return out


@contextmanager
def gc_paused():
    """The cyclic collector off meanwhile: reading or searching every rank's record makes many containers and
    no cycle, and each collection they set off walks the whole process (N^1.3 at 16,384 ranks)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()
