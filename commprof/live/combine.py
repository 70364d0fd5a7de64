"""The ranks' windows of one live window combined, and that window's findings, with the meaning and the
threshold (findings/kinds.py THRESHOLD of the step) of a job's end:

  straggler     a rank whose own time (busy: not blocked on comm) exceeds the others' median, as far as a
                peer's training thread was blocked beyond that rank's own blocked time: per step min(its
                excess, the most a peer waited more than it), the median over the window's steps, reported
                when its 95 % interval's lower end reaches the threshold. Without it: the step less that.
  exposed_comm  the op (by name) whose transfer the training threads blocked on longest: the least any rank
                was blocked on it a step (a rank no peer kept waiting blocks only for the transfer).
  link          given the link (--link-rate): the ops (name, group, size bucket) whose mean transfer reaches
                less than LINK_SHARE of the rate of the level they cross, among those whose bytes take at
                least LINK_MIN_US at it; a group crosses hosts when it has more ranks than any one host holds.
                Cost: their time beyond the link's a step (mean over ranks), overlapped or not.
  latency_bound collectives smaller than n½ of an α–β fit of the window's own collectives (one point per
                op, group and size bucket: its mean time against its mean bytes on the bus; MIN_SIZES sizes
                at least), at least two a step: what they take a step, less the fit's time for one op of all
                their bytes per group.

Per rank, what the job's end splits from the trace is split from the window's medians: its blocked time is
`waiting_ms` (beyond the least-blocked rank's: time its peers took to arrive) and `transfer_ms` (the least
any rank was blocked). Where the end of a job replays the trace, a window prices each finding by these
figures alone: a window holds no op's issue time, so the bounded aggregates stay bounded.

    job = combine(windows)        # one dict per rank, of the same window index
    held.update(job)              # since which step each finding holds

Exercised by: `pytest tests/unit/test_live.py`.
"""

from __future__ import annotations

import statistics

import numpy as np

from commprof.base.measurement import COLLECTIVES
from commprof.base.stats import median_ci, others_max, others_median
from commprof.findings.kinds import LINK_MIN_US, LINK_SHARE, PEERS_SHOWN, THRESHOLD, per_peer
from commprof.live.window import split_key
from commprof.perfmodel.alphabeta import fit
from commprof.perfmodel.fabric import Fabric
from commprof.report.live_log import finding_key

MIN_SIZES = 3
"""Sizes on the bus a window's collectives must span for its α–β fit: a DDP job's two buckets would give a line
through two points, and a β of about 0 made every op "latency-bound" (a balanced 2-bucket job, 30 % of its step)."""


def combine(windows: list[dict], *, threshold: float = THRESHOLD, link: Fabric | None = None) -> dict:
    """One job window from every rank's window of one index: per rank figures, the job's step (the slowest
    rank's median) and its findings above `threshold` of the step, costliest first; `link` (--link-rate) adds
    the ops below half of its rate."""
    ranks = sorted(windows, key=lambda w: w["rank"])
    step_ms = max(w["step_ms"] for w in ranks)
    transfer = min(w["blocked_ms"] for w in ranks)
    per_rank = [{"rank": w["rank"], "host": w["host"], "step_ms": w["step_ms"], "busy_ms": w["busy_ms"],
                 "blocked_ms": w["blocked_ms"], "waiting_ms": w["blocked_ms"] - transfer, "transfer_ms": transfer,
                 "ops": w["ops"]} for w in ranks]
    found = _straggler(ranks, step_ms, threshold) + _exposed(ranks, step_ms) + _latency_bound(ranks, step_ms)
    if link is not None:
        found += _link(ranks, step_ms, link)
    found = sorted((f for f in found if f["ms_per_step"] >= threshold * step_ms), key=lambda f: -f["ms_per_step"])
    return {"window": ranks[0]["window"], "first_step": min(w["first_step"] for w in ranks),
            "last_step": max(w["last_step"] for w in ranks), "steps": min(w["steps"] for w in ranks),
            "time": max(w["time"] for w in ranks), "step_ms": step_ms, "ranks": per_rank, "findings": found}


def _finding(kind: str, ms: float, step_ms: float, **fields) -> dict:
    return {"kind": kind, **fields, "ms_per_step": ms, "share_of_step": ms / step_ms if step_ms > 0 else 0.0,
            "step_ms_without": step_ms - ms}


def _straggler(ranks: list[dict], step_ms: float, threshold: float) -> list[dict]:
    """Per step, rank k's cost is the most a peer was blocked beyond k's own blocked time, as far as k's own time
    exceeds the others' median; reported, as at a job's end, when the lower end of the 95 % interval of the
    median over the window's steps reaches the threshold (a busy machine's scheduling noise does not). Each
    step's others' median and others' most come from that step's sorted column, not a pass over the others
    for every rank: O(N log N) a step."""
    if len(ranks) < 2:
        return []
    steps = min(len(w["busy_by_step_ms"]) for w in ranks)
    busy = np.array([w["busy_by_step_ms"][:steps] for w in ranks], dtype=np.float64)
    blocked = np.array([w["blocked_by_step_ms"][:steps] for w in ranks], dtype=np.float64)
    costs = np.maximum(0.0, np.minimum(busy - others_median(busy), others_max(blocked) - blocked))
    ms = np.median(costs, axis=1)
    out = []
    # the 95 % interval's lower end is at most the median: only a rank whose median reaches the threshold can
    late = [k for k in np.flatnonzero((ms > 0) & (ms >= threshold * step_ms))
            if median_ci(costs[k].tolist())[0] >= threshold * step_ms]
    if not late:
        return []
    own = np.array([[w["busy_ms"]] for w in ranks])
    others_busy = others_median(own)[:, 0]
    waited = np.array([w["blocked_ms"] for w in ranks])
    longest = np.argsort(-waited, kind="stable")[:PEERS_SHOWN + 1]  # the peers who waited longest, any straggler's
    others_blocked = others_median(waited[:, None])[:, 0]
    for k in late:
        w = ranks[k]
        shown = [j for j in longest if j != k][:PEERS_SHOWN]
        peers = {"peers_wait_ms": per_peer({ranks[j]["rank"]: max(0.0, waited[j] - waited[k]) for j in shown}),
                 "peers": {"count": len(ranks) - 1, "median_wait_ms": max(0.0, others_blocked[k] - waited[k]),
                           "least_wait_ms": max(0.0, float(np.min(np.delete(waited, k))) - waited[k])}}
        out.append(_finding("straggler", float(ms[k]), step_ms, rank=w["rank"], host=w["host"], evidence={
            **peers, "busy_ms": w["busy_ms"], "others_busy_ms": float(others_busy[k]),
            "ms_per_step_ci95": median_ci(costs[k].tolist())}))
    return out


def _exposed(ranks: list[dict], step_ms: float) -> list[dict]:
    names = set().union(*(w["blocked_by_op_ms"] for w in ranks))
    if not names:
        return []
    transfer = {name: min(w["blocked_by_op_ms"].get(name, 0.0) for w in ranks) for name in names}
    name = max(sorted(names), key=transfer.get)
    groups: dict[str, list] = {}  # group -> [ops, payload bytes] of that name, every rank's
    for w in ranks:
        for key, agg in w["ops"].items():
            op, group, _ = split_key(key)
            if op == name:
                g = groups.setdefault(group, [0, 0])
                g[0], g[1] = g[0] + agg[0], g[1] + agg[1]
    if not groups:
        return []
    group = max(sorted(groups), key=lambda g: groups[g][1])
    count, nbytes = groups[group]
    steps = min(w["steps"] for w in ranks) * len(ranks)
    return [_finding("exposed_comm", transfer[name], step_ms, op=name, group=group, bytes=nbytes // max(1, count),
                     evidence={"per_step": count / steps, "busbw_GBps": None})]


def _latency_bound(ranks: list[dict], step_ms: float, *, count: int | None = None) -> list[dict]:
    """`count`: the ranks whose ops `ranks` hold (live/hosts.py: a host's part holds its ranks' ops summed)."""
    steps = min(w["steps"] for w in ranks)
    points = {}  # (name, group, size) -> [count, payload bytes, seconds, group size] over the ranks
    for w in ranks:
        for key, agg in w["ops"].items():
            name, group, _ = split_key(key)
            if name in COLLECTIVES and name != "barrier" and agg[0] and agg[1]:
                p = points.setdefault(key, [0, 0, 0.0, agg[4]])
                p[0], p[1], p[2] = p[0] + agg[0], p[1] + agg[1], p[2] + agg[2]
    bus = {k: p[1] / p[0] * COLLECTIVES[split_key(k)[0]].bus_factor(p[3]) for k, p in points.items()}
    if len({round(b) for b in bus.values()}) < MIN_SIZES:  # a line through two points fits anything
        return []
    line = fit([(bus[k], p[2] / p[0]) for k, p in points.items()])
    if line is None or line.alpha_s <= 0:
        return []
    half = line.alpha_s / line.beta_s_per_byte if line.beta_s_per_byte > 0 else None
    small = [k for k in points if half is None or bus[k] < half]
    n = count or len(ranks)
    per_step = sum(points[k][0] for k in small) / n / steps
    if per_step < 2:
        return []
    in_them_ms = sum(points[k][2] for k in small) / n / steps * 1e3
    by_group: dict[str, float] = {}
    for k in small:
        group = split_key(k)[1]
        by_group[group] = by_group.get(group, 0.0) + bus[k] * points[k][0] / n / steps
    fused_ms = sum(line.alpha_s + line.beta_s_per_byte * b for b in by_group.values()) * 1e3
    ms = max(0.0, in_them_ms - fused_ms)
    return [_finding("latency_bound", ms, step_ms,
                     evidence={"ops_per_step": per_step, "n_half_bytes": half, "alpha_us": line.alpha_s * 1e6,
                               "bandwidth_GBps": line.as_record()["bandwidth_GBps"],
                               "ms_per_step_in_them": in_them_ms, "fused_ms": fused_ms, "fusing_saves_ms": ms})]


class Held:
    """Since which step each finding has held, window after window (a window without it ends its run)."""

    def __init__(self) -> None:
        self.since: dict[str, int] = {}

    def update(self, job: dict) -> None:
        """Mark each finding of `job` (a combined window, in window order) with `since_step`."""
        now = {finding_key(f): f for f in job["findings"]}
        self.since = {k: self.since.get(k, job["first_step"]) for k in now}
        for k, f in now.items():
            f["since_step"] = self.since[k]


def _link(ranks: list[dict], step_ms: float, link: Fabric) -> list[dict]:
    steps, per_host = min(w["steps"] for w in ranks), {}
    for w in ranks:
        per_host[w["host"]] = per_host.get(w["host"], 0) + 1
    slow: dict[str, dict] = {}
    for w in ranks:
        for key, (count, nbytes, seconds, _, size) in w["ops"].items():
            name, group, _ = split_key(key)
            rate = link.rate_GBps(len(per_host) > 1 and size > max(per_host.values()))
            if not count or not seconds or not rate or name == "barrier":
                continue
            bus = nbytes / count * (COLLECTIVES[name].bus_factor(size) if name in COLLECTIVES else 1.0)
            took_ms, at_link_ms = seconds / count * 1e3, bus / (rate * 1e9) * 1e3
            if at_link_ms * 1e3 < LINK_MIN_US or at_link_ms / took_ms >= LINK_SHARE:
                continue
            s = slow.setdefault(key, {"op": name, "group": group, "bytes": nbytes // count, "link_GBps": rate,
                                      "over_ms": 0.0, "share": []})
            s["over_ms"] += (took_ms - at_link_ms) * count / steps / len(ranks)
            s["share"].append(at_link_ms / took_ms)
    if not slow:
        return []
    ops = sorted(({**s, "fraction_of_link": statistics.median(s["share"]),
                   "busbw_GBps": s["link_GBps"] * statistics.median(s["share"])} for s in slow.values()),
                 key=lambda s: s["fraction_of_link"])
    for s in ops:
        del s["share"]
    worst = ops[0]
    return [_finding("link", sum(s["over_ms"] for s in ops), step_ms, op=worst["op"], group=worst["group"],
                     bytes=worst["bytes"], evidence={"link_GBps": worst["link_GBps"], "share": LINK_SHARE,
                                                     "ops": ops})]
