"""A live window combined host by host: each host's first local rank folds its own ranks' windows into one
bounded part (`summarize`), and rank 0 combines the hosts' parts into the job's window and its findings
(`combine_hosts`) — what live/combine.py's `combine` does from every rank's window, with rank 0 holding a part
a host instead of a window a rank.

A part holds, of its host's ranks: their count; per step the median own (busy) time, and the two longest
blocked with their ranks; the TOP ranks with the most own time (the straggler candidates) with their steps;
the PEERS_SHOWN longest-blocked and the two least-blocked ranks; each op name's least blocked time; the ops
summed. Its size is bounded by the op kinds and the window's steps, not by the host's ranks. Rank 0 then
finds a straggler as `combine` does, among the candidates: per step its excess over the others' median
(the median of the hosts' medians, weighted by their ranks, its own host's without it) as far as a peer was
blocked beyond its own blocked time.

    part = summarize(windows_of_this_host)         # a host's first local rank
    job = combine_hosts(parts)                     # rank 0

Exercised by: `pytest tests/unit/test_live_parts.py`.
"""

from __future__ import annotations

import heapq
import statistics

import numpy as np

from commprof.base.stats import median_ci
from commprof.findings.kinds import PEERS_SHOWN, THRESHOLD, per_peer
from commprof.live import combine as one

TOP = 2
"""Ranks of a host a part carries as straggler candidates: the ones with the most own time."""
MAX_CANDIDATES = 16
"""Candidates rank 0 weighs, the most own time first: a straggler is one of few ranks."""


def summarize(windows: list[dict]) -> dict:
    """One host's windows of one index (its ranks', its first local rank's own included) as its part."""
    ranks = sorted(windows, key=lambda w: w["rank"])
    steps = min(len(w["busy_by_step_ms"]) for w in ranks)
    busy = np.array([w["busy_by_step_ms"][:steps] for w in ranks], dtype=np.float64)
    blocked = np.array([w["blocked_by_step_ms"][:steps] for w in ranks], dtype=np.float64)
    order = np.argsort(-blocked, axis=0, kind="stable")
    top = [[[ranks[order[k, i]]["rank"], round(float(blocked[order[k, i], i]), 4)] for k in range(min(2, len(ranks)))]
           for i in range(steps)]
    ops: dict[str, list] = {}
    for w in ranks:
        for key, (count, nbytes, seconds, hist, size) in w["ops"].items():
            o = ops.setdefault(key, [0, 0, 0.0, [0] * len(hist), size, 0])
            o[0], o[1], o[2] = o[0] + count, o[1] + nbytes, o[2] + seconds
            o[3] = [a + b for a, b in zip(o[3], hist)]
            o[5] += 1  # ranks that issued it
    names = set().union(*(w["blocked_by_op_ms"] for w in ranks))
    by_busy = sorted(range(len(ranks)), key=lambda k: (-ranks[k]["busy_ms"], ranks[k]["rank"]))[:TOP]
    by_blocked = sorted(ranks, key=lambda w: (-w["blocked_ms"], w["rank"]))
    return {
        "host": ranks[0]["host"], "first": ranks[0]["rank"], "window": ranks[0]["window"], "ranks": len(ranks),
        "first_step": min(w["first_step"] for w in ranks), "last_step": max(w["last_step"] for w in ranks),
        "steps": min(w["steps"] for w in ranks), "time": max(w["time"] for w in ranks),
        "step_ms": max(w["step_ms"] for w in ranks), "busy_ms_median": statistics.median(w["busy_ms"] for w in ranks),
        "blocked_ms_median": statistics.median(w["blocked_ms"] for w in ranks),
        "busy_by_step_median": _us(np.median(busy, axis=0)), "blocked_by_step_top": top,
        "candidates": [{"rank": ranks[k]["rank"], "host": ranks[k]["host"], "busy_ms": ranks[k]["busy_ms"],
                        "blocked_ms": ranks[k]["blocked_ms"], "busy_by_step_ms": _us(busy[k]),
                        "blocked_by_step_ms": _us(blocked[k]),
                        # the host's others' median, step by step: what its own host weighs without it
                        "host_busy_without": (_us(np.median(np.delete(busy, k, axis=0), axis=0))
                                              if len(ranks) > 1 else None)} for k in by_busy],
        "most_blocked": [[w["rank"], w["blocked_ms"]] for w in by_blocked[:PEERS_SHOWN + 1]],
        "least_blocked": [[w["rank"], w["blocked_ms"]] for w in by_blocked[::-1][:2]],
        "blocked_by_op_min": {n: min(w["blocked_by_op_ms"].get(n, 0.0) for w in ranks) for n in sorted(names)},
        "ops": ops,
        "per_rank": {"step_ms": [min(w["step_ms"] for w in ranks), max(w["step_ms"] for w in ranks)],
                     "busy_ms": [min(w["busy_ms"] for w in ranks), max(w["busy_ms"] for w in ranks)]},
    }


def _us(values: np.ndarray) -> list[float]:
    """Milliseconds to a tenth of a microsecond: a part's bytes are mostly these numbers, and a clock's
    resolution, not 17 digits, is what they hold."""
    return np.round(values, 4).tolist()


def combine_hosts(parts: list[dict], *, threshold: float = THRESHOLD) -> dict:
    """The job's window from every host's part of one index: its step (the slowest rank's median), its hosts'
    figures and its findings above `threshold` of the step, costliest first (straggler, exposed_comm and
    latency_bound, as `combine` finds them)."""
    parts = sorted(parts, key=lambda p: p["host"])
    step_ms = max(p["step_ms"] for p in parts)
    ranks = sum(p["ranks"] for p in parts)
    found = _straggler(parts, step_ms, threshold) + _from_ops(parts, step_ms, ranks)
    found = sorted((f for f in found if f["ms_per_step"] >= threshold * step_ms), key=lambda f: -f["ms_per_step"])
    transfer = min(p["least_blocked"][0][1] for p in parts)  # the least any rank was blocked: the transfer
    hosts = [{"host": p["host"], "first_rank": p["first"], "ranks": p["ranks"], "step_ms": p["step_ms"],
              "busy_ms_median": p["busy_ms_median"], "blocked_ms_median": p["blocked_ms_median"],
              "step_ms_range": p["per_rank"]["step_ms"], "busy_ms_range": p["per_rank"]["busy_ms"],
              "waiting_ms_max": p["most_blocked"][0][1] - transfer, "ops": sum(o[0] for o in p["ops"].values())}
             for p in parts]
    return {"window": parts[0]["window"], "first_step": min(p["first_step"] for p in parts),
            "last_step": max(p["last_step"] for p in parts), "steps": min(p["steps"] for p in parts),
            "time": max(p["time"] for p in parts), "step_ms": step_ms, "world_size": ranks, "transfer_ms": transfer,
            "hosts": hosts, "ranks": [], "findings": found}


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """values[host, step], weights[host] -> per step the median of the hosts' values, each counted weight times
    (the middle two's mean for an even total)."""
    order = np.argsort(values, axis=0, kind="stable")
    v = np.take_along_axis(values, order, axis=0)
    w = weights[order]
    cum = np.cumsum(w, axis=0)
    total = cum[-1]
    lo = np.argmax(cum >= (total + 1) // 2, axis=0)  # the (total+1)//2-th value, 1-based
    hi = np.argmax(cum >= total // 2 + 1, axis=0)
    cols = np.arange(values.shape[1])
    return np.where(total % 2 == 1, v[lo, cols], (v[lo, cols] + v[hi, cols]) / 2)


def _straggler(parts: list[dict], step_ms: float, threshold: float) -> list[dict]:
    if sum(p["ranks"] for p in parts) < 2:
        return []
    steps = min(len(p["busy_by_step_median"]) for p in parts)
    medians = np.array([p["busy_by_step_median"][:steps] for p in parts])
    counts = np.array([p["ranks"] for p in parts])
    # every step's two longest-blocked ranks of the job, from each host's two
    tops = [heapq.nlargest(2, (t for p in parts for t in p["blocked_by_step_top"][i]), key=lambda t: t[1])
            for i in range(steps)]
    candidates = sorted(((c, h) for h, p in enumerate(parts) for c in p["candidates"]),
                        key=lambda ch: (-ch[0]["busy_ms"], ch[0]["rank"]))[:MAX_CANDIDATES]
    most = sorted((tuple(m) for p in parts for m in p["most_blocked"]), key=lambda m: (-m[1], m[0]))
    least = sorted((tuple(m) for p in parts for m in p["least_blocked"]), key=lambda m: (m[1], m[0]))
    blocked_median = _weighted_median(np.array([[p["blocked_ms_median"]] for p in parts]), counts)[0]
    busy_median = _weighted_median(np.array([[p["busy_ms_median"]] for p in parts]), counts)[0]
    out = []
    for c, h in candidates:
        own = np.array(c["busy_by_step_ms"][:steps])
        if c["host_busy_without"] is None:  # alone on its host: the other hosts alone
            keep = np.arange(len(parts)) != h
            others = _weighted_median(medians[keep], counts[keep]) if keep.any() else np.zeros(steps)
        else:
            mine = medians.copy()
            mine[h] = c["host_busy_without"][:steps]
            weights = counts.copy()
            weights[h] -= 1
            others = _weighted_median(mine, weights)
        waited = np.array([next((v for r, v in tops[i] if r != c["rank"]), 0.0) for i in range(steps)])
        costs = np.maximum(0.0, np.minimum(own - others, waited - np.array(c["blocked_by_step_ms"][:steps])))
        ms = float(np.median(costs))
        if ms <= 0 or ms < threshold * step_ms or median_ci(costs.tolist())[0] < threshold * step_ms:
            continue
        peers = [(r, v) for r, v in most if r != c["rank"]][:PEERS_SHOWN]
        lowest = next(v for r, v in least if r != c["rank"]) if len(least) > 1 else c["blocked_ms"]
        out.append(one._finding("straggler", ms, step_ms, rank=c["rank"], host=c["host"], evidence={
            "peers_wait_ms": per_peer({r: max(0.0, v - c["blocked_ms"]) for r, v in peers}),
            "peers": {"count": sum(p["ranks"] for p in parts) - 1,
                      "median_wait_ms": max(0.0, blocked_median - c["blocked_ms"]),
                      "least_wait_ms": max(0.0, lowest - c["blocked_ms"])},
            "busy_ms": c["busy_ms"], "others_busy_ms": busy_median, "ms_per_step_ci95": median_ci(costs.tolist())}))
    return out


def _from_ops(parts: list[dict], step_ms: float, ranks: int) -> list[dict]:
    """exposed_comm and latency_bound, as `combine` finds them, from the hosts' least blocked time per op name
    and their ops summed: `combine`'s own code, each host's part standing as one rank whose ops are its
    ranks' (their count kept, so the means over ranks stay means over ranks)."""
    as_ranks = [{"rank": k, "host": p["host"], "steps": p["steps"], "blocked_by_op_ms": p["blocked_by_op_min"],
                 "ops": {key: o[:5] for key, o in p["ops"].items()}} for k, p in enumerate(parts)]
    exposed = one._exposed(as_ranks, step_ms)
    for f in exposed:  # its per-step count is over ranks, not hosts
        f["evidence"]["per_step"] *= len(parts) / ranks
    return exposed + one._latency_bound(as_ranks, step_ms, count=ranks)
