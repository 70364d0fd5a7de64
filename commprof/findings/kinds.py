"""What a measured job's time went to, as findings ranked by what each costs a step. Each is a plain dict:

    {"kind": "straggler", "rank": 1, "ms_per_step": 19.6, "share_of_step": 0.31, "step_ms_without": 43.2,
     "evidence": {…}}

  straggler     rank k arrived last at the ops its peers blocked on: ms_per_step is the most any peer's
                training thread waited for it a step, as far as k's own time exceeds the others' median
                (a rank late because its previous op ended later is not one); evidence: how often it was
                last, each peer's wait, its own time and the others'. Without it: its own time as theirs.
  imbalance     a rank's own time (compute, data, optimizer) more than IMBALANCE above the least of the
                others', where no peer waits for it (else it is a straggler): ms_per_step is what the step
                would lose with it set to the others' median (the replay's), nothing when none waits on it.
  exposed_comm  the op (name, group, size) whose transfer the ranks' threads blocked on longest, the mean
                over ranks; evidence: its bus bandwidth once every party had arrived. Without it: free.
  latency_bound collectives smaller than n½, the size where the link gives half its bandwidth, by an α–β
                fit of the job's own collectives (their transfer times against their bytes on the bus; every
                one when their times do not grow with their sizes, β = 0):
                how many a step, what they take, and what fusing them would save: their transfer less the
                fit's α + β·n of one op of all their bytes (one α, not k, and none of the per-op excess a
                small op's time shows over the fit). Fused are the runs of a group's ops issued back to
                back (any rank's own time between two under α); ops apart by compute stay apart. Without
                them: each run replayed as that one op where its last was: their sync points go too.
  link          given the link (--link-rate: one rate, a rate per level, or a bench JSON's fit): the ops whose
                transfer reaches less than LINK_SHARE of the rate of the level they cross (inside a host or
                between hosts) on the bus, among those whose bytes take at least LINK_MIN_US on it (below,
                latency rules: latency_bound's kind); evidence: each such op (name, group, size) with its
                bus bandwidth and fraction of its link. Without it: each costs its bytes at the link's rate.
  bubble, host  from the job's own figures, no trace needed: findings/untraced.py.

A finding below THRESHOLD of the step is not reported: a balanced job reports no straggler or imbalance.

    commprof profile --nproc 2 --json p.json -- train.py     # traced privately when --trace is not given

Exercised by: `pytest tests/unit/test_findings_recorded.py tests/test_findings.py`.
"""

from __future__ import annotations

import numpy as np

from commprof.base.measurement import COLLECTIVES
from commprof.base.stats import gc_paused, median_ci, others_median
from commprof.findings import slices, whatif
from commprof.findings.arrivals import Analysis, analyze, median
from commprof.perfmodel.alphabeta import fit
from commprof.perfmodel.fabric import Fabric
from commprof.perfmodel.timeline import Measured

THRESHOLD = 0.03
"""Smallest share of the step a finding must cost to be reported."""
IMBALANCE = 0.10
"""How far a rank's own time may exceed the least of the others' before it is an imbalance."""
LINK_SHARE = 0.5
"""An op whose transfer reaches less than this share of the known link's rate is slow for that link."""
LINK_MIN_US = 100.0
"""The least time an op's bytes take at the link's rate for `link` to judge it: a smaller op's time is its
latency, not the link's bandwidth."""
PEERS_SHOWN = 8
"""A straggler's peers named with their wait: the longest waits; the rest summed up (at 16,384 ranks a
paragraph naming every peer was 16,000 lines)."""


def per_peer(waits: dict) -> list[dict]:
    """{rank: ms} as the JSON holds it: [{"rank", "ms"}] by rank — fields named, so a table reader (pandas) makes
    rows of them, not a column per rank id."""
    return [{"rank": int(r), "ms": ms} for r, ms in sorted(waits.items(), key=lambda kv: int(kv[0]))]


def top_peers(waits: dict) -> dict:
    """A straggler's evidence of its peers' waits {rank: ms}: the PEERS_SHOWN longest by name
    (`peers_wait_ms`, per_peer's form), and `peers` (how many, the median and the least wait) for all of them."""
    shown = sorted(waits.items(), key=lambda kv: (-kv[1], kv[0]))[:PEERS_SHOWN]
    values = sorted(waits.values())
    return {"peers_wait_ms": per_peer(dict(shown)),
            "peers": {"count": len(values), "median_wait_ms": median(values), "least_wait_ms": values[0]
                      if values else 0.0}}


def find(m: Measured, *, threshold: float = THRESHOLD, link: Fabric | None = None,
         a: Analysis | None = None) -> list[dict]:
    """Every finding of `m` above `threshold` of its step, costliest first; `link` only given the link's
    levels (perfmodel/fabric.py's Fabric). `a`: m's analysis, when the caller has it."""
    a = a or analyze(m)
    out = _stragglers(m, a, threshold) + _imbalance(m, a) + _exposed(m, a) + _latency_bound(m, a)
    if link is not None:
        out += _link(m, a, link)
    return sorted((f for f in out if f["share_of_step"] >= threshold), key=lambda f: -f["ms_per_step"])


def _finding(kind: str, a: Analysis, ms: float, without: float, **fields) -> dict:
    return {"kind": kind, **{k: v for k, v in fields.items() if k != "evidence"}, "ms_per_step": ms,
            "share_of_step": ms / a.step_ms if a.step_ms else 0.0, "step_ms_without": without,
            "evidence": fields.get("evidence", {})}


def _stragglers(m: Measured, a: Analysis, threshold: float) -> list[dict]:
    """Per iteration, rank k's cost is the longest any peer waited for it, as far as its own time exceeds the
    others' median (a rank late because its previous op ended later is not a straggler); the finding's
    figure is the median over iterations, and it is reported only when the lower end of that median's
    95 % confidence interval reaches the threshold (the scheduling noise of a busy machine does not)."""
    ranks = len(a.ranks)
    busy = np.array([[it[r].busy_ms for it in a.per_iteration] for r in range(ranks)], dtype=np.float64)
    # the longest any peer waited for each rank, each iteration: one pass over every rank's waits
    waited = np.zeros_like(busy)
    for i, it in enumerate(a.per_iteration):
        for r in it:
            for who, ms in r.waiting_ms.items():
                if who != r.rank and ms > waited[who, i]:
                    waited[who, i] = ms
    costs = np.maximum(0.0, np.minimum(waited, busy - others_median(busy))) if ranks > 1 else np.zeros_like(busy)
    out = []
    for s, mine in zip(a.ranks, costs.tolist()):
        # the interval's lower end is at most the median: the median's test first, the interval's sort after
        if median(mine) <= 0 or median(mine) < threshold * a.step_ms or median_ci(mine)[0] < threshold * a.step_ms:
            continue
        met = [x for x in a.arrivals if s.rank in x.parties]
        evidence = {"last_at_share": sum(x.last == s.rank for x in met) / len(met) if met else 0.0,
                    **top_peers({r.rank: r.waiting_ms.get(s.rank, 0.0) for r in a.ranks if r.rank != s.rank}),
                    "busy_ms": s.busy_ms, "others_busy_ms": median(r.busy_ms for r in a.ranks if r.rank != s.rank),
                    "spread_ms_median": median(x.spread_ms for x in met if x.last == s.rank),
                    "ms_per_step_ci95": median_ci(mine),
                    "late_ops_priced_aligned": whatif.priced_aligned(a, s.rank)}
        without = whatif.without_straggler(m, a, s.rank)
        out.append(_finding("straggler", a, median(mine), without, rank=s.rank, evidence=evidence,
                            step_without_lower_bound=evidence["late_ops_priced_aligned"] < 1.0))
    return out


def _imbalance(m: Measured, a: Analysis) -> list[dict]:
    """The rank with the most own time, when it exceeds the least of the others' by IMBALANCE in most
    iterations (the lower end of the 95 % confidence interval of the median ratio); what it costs is what
    the replay saves with its own time set to the others' (nothing, when nobody waits for it)."""
    if len(a.ranks) < 2:
        return []
    s = max(a.ranks, key=lambda r: r.busy_ms)
    ratios = [it[s.rank].busy_ms / max(1e-9, min(r.busy_ms for r in it if r.rank != s.rank))
              for it in a.per_iteration]
    if median_ci(ratios)[0] <= 1 + IMBALANCE or any(r.waiting_ms.get(s.rank, 0.0) > 0 for r in a.ranks):
        return []  # balanced, or a straggler (which says so)
    without = whatif.step_without(m, a, edit=whatif.busy_as_median(s.rank))
    return [_finding("imbalance", a, max(0.0, a.step_ms - without), without, rank=s.rank,
                     evidence={"busy_ms": {r.rank: r.busy_ms for r in a.ranks}})]


def _exposed(m: Measured, a: Analysis) -> list[dict]:
    if not a.exposed_by_op:
        return []
    signature, ms = max(a.exposed_by_op.items(), key=lambda kv: kv[1])
    name, label, nbytes = signature
    mine = [x for x in a.arrivals if (x.op.name, x.op.label, x.op.nbytes) == signature]
    took = median(x.transfer_ms for x in mine)
    factor = COLLECTIVES[name].bus_factor(len(mine[0].parties)) if mine and name in COLLECTIVES else 1.0
    busbw = nbytes / (took / 1e3) / 1e9 * factor if took > 0 else None
    without = whatif.step_without(m, a, cost=whatif.op_free(signature, a))
    # its cost is what the step saves without it (the replay's), as every finding's; the transfer the ranks
    # sat in, which another op's wait may cover too, is its evidence
    return [_finding("exposed_comm", a, max(0.0, a.step_ms - without), without, op=name, group=label,
                     bytes=nbytes, evidence={"per_step": len(mine) / a.iterations, "transfer_ms_median": took,
                                             "busbw_GBps": busbw, "exposed_ms_per_step": ms})]


def _latency_bound(m: Measured, a: Analysis) -> list[dict]:
    ops = [x for x in a.arrivals if x.op.name in COLLECTIVES and x.op.name != "barrier" and x.op.nbytes > 0]
    bus = {x.op.key: x.op.nbytes * COLLECTIVES[x.op.name].bus_factor(len(x.parties)) for x in ops}
    line = fit([(bus[x.op.key], x.transfer_ms / 1e3) for x in ops])
    if line is None or line.alpha_s <= 0:
        return []
    # bytes on the bus where α = β·n: half the bandwidth; none where the times do not grow with the sizes
    # (the fit's β = 0: latency alone, every op under it)
    half = line.alpha_s / line.beta_s_per_byte if line.beta_s_per_byte > 0 else None
    small = [x for x in ops if half is None or bus[x.op.key] < half]
    if len(small) < 2 * a.iterations:  # fewer than two a step: nothing to fuse
        return []
    alpha_ms = line.alpha_s * 1e3
    # each run of ops issued back to back (a rank's own time between them under one op's latency) is one op
    runs = whatif.back_to_back(m, {x.op.key: (x.op.name, x.op.label, x.parties) for x in small}, alpha_ms)
    sizes: dict[tuple, int] = {}
    for run in runs.values():
        sizes[run] = sizes.get(run, 0) + 1
    group = {key: run for key, run in runs.items() if sizes[run] > 1}
    small = [x for x in small if x.op.key in group]
    if len(group) - len({*group.values()}) < a.iterations:  # under one op a step to save
        return []
    bus_bytes: dict[tuple, float] = {}
    for x in small:
        bus_bytes[group[x.op.key]] = bus_bytes.get(group[x.op.key], 0.0) + bus[x.op.key]

    def model(op) -> float:  # the fit's time for the op's bytes on the bus, ms
        factor = COLLECTIVES[op.name].bus_factor(len(op.members))
        return (line.alpha_s + line.beta_s_per_byte * op.nbytes * factor) * 1e3

    fused_ms = sum(line.alpha_s + line.beta_s_per_byte * b for b in bus_bytes.values()) * 1e3 / a.iterations
    in_them = sum(x.transfer_ms for x in small) / a.iterations
    edit, cost = whatif.fused(group, model, whatif.measured_costs(a))
    without = whatif.step_without(m, a, edit=edit, cost=cost)
    return [_finding("latency_bound", a, max(0.0, a.step_ms - without), without,
                     evidence={"ops_per_step": len(small) / a.iterations, "n_half_bytes": half,
                               "alpha_us": line.alpha_s * 1e6, "bandwidth_GBps": line.as_record()["bandwidth_GBps"],
                               "ms_per_step_in_them": in_them, "fused_ms": fused_ms,
                               "fused_runs_per_step": len(bus_bytes) / a.iterations,
                               "fusing_saves_ms": max(0.0, in_them - fused_ms)})]


def _bus_bytes(x) -> float:
    """Bytes an op moves on the bus (nccl-tests' busbw numerator): a message's own, a collective's scaled."""
    if x.op.name in COLLECTIVES:
        return x.op.nbytes * COLLECTIVES[x.op.name].bus_factor(len(x.parties))
    return float(x.op.nbytes)


def _link(m: Measured, a: Analysis, link: Fabric) -> list[dict]:
    by_op: dict[tuple, list] = {}
    for x in a.arrivals:
        rate = link.rate_GBps(len({m.hosts[r] for r in x.parties}) > 1)
        at_link_ms = _bus_bytes(x) / (rate * 1e9) * 1e3 if rate else 0.0
        if x.op.name != "barrier" and at_link_ms * 1e3 >= LINK_MIN_US and x.transfer_ms > 0:
            by_op.setdefault((x.op.name, x.op.label, x.op.nbytes), []).append((x.transfer_ms, at_link_ms, rate))
    slow = {}
    for signature, spans in by_op.items():
        took, ideal, rate = median(t for t, _, _ in spans), spans[0][1], spans[0][2]
        if ideal / took < LINK_SHARE:
            slow[signature] = {"op": signature[0], "group": signature[1], "bytes": signature[2],
                               "per_step": len(spans) / a.iterations, "transfer_ms_median": took,
                               "at_link_ms": ideal, "link_GBps": rate, "busbw_GBps": rate * ideal / took,
                               "fraction_of_link": ideal / took}
    if not slow:
        return []
    base = whatif.measured_costs(a)

    def at_link(op):
        s = slow.get((op.name, op.label, op.nbytes))
        return base(op) if s is None else min(base(op), s["at_link_ms"])

    without = whatif.step_without(m, a, cost=at_link)
    ops = sorted(slow.values(), key=lambda s: s["fraction_of_link"])
    return [_finding("link", a, max(0.0, a.step_ms - without), without, op=ops[0]["op"], group=ops[0]["group"],
                     bytes=ops[0]["bytes"], evidence={"link_GBps": ops[0]["link_GBps"], "share": LINK_SHARE,
                                                      "fabric": link.as_record(), "ops": ops})]


def by_rank(a: Analysis) -> list[dict]:
    """Each rank's step split by cause (medians over the measured iterations): its own time, its waits for
    each peer, its exposed transfer, and its wall — what the causes plot draws (report/cause_plot.py)."""
    return [{"rank": r.rank, "wall_ms": r.wall_ms, "busy_ms": r.busy_ms, "transfer_ms": r.transfer_ms,
             "waiting_ms": per_peer(r.waiting_ms)} for r in a.ranks]


def of_trace(directory: str, *, threshold: float = THRESHOLD, link: Fabric | None = None) -> dict:
    """The findings of the merged trace in `directory` as the JSON's "findings" block: {"threshold", "items",
    "by_rank", "trace_slices"} (the slices by cause it added to DIR/trace.json: findings/slices.py), or {"threshold",
    "items": None, "why"} when the trace cannot be matched (no measured iteration, say)."""
    with gc_paused():  # every rank's programs: many containers, no cycle, all let go before the collector is back
        return _of_trace(directory, threshold, link)


def _of_trace(directory: str, threshold: float, link: Fabric | None) -> dict:
    from commprof.base.errors import UsageError
    from commprof.perfmodel.timeline import load

    try:
        m = load(directory)
        a = analyze(m)
        block = {"threshold": threshold, "items": find(m, threshold=threshold, link=link, a=a),
                 "by_rank": by_rank(a), "step_ms": a.step_ms}
    except UsageError as exc:
        return {"threshold": threshold, "items": None, "why": str(exc)}
    except Exception as exc:  # an analysis that fails must not take the job's measured results with it
        return {"threshold": threshold, "items": None, "why": f"the analysis failed: {type(exc).__name__}: {exc}"}
    try:
        block["trace_slices"] = slices.mark(directory, m)
    except Exception as exc:  # the findings stand without their drawing
        block["trace_slices"] = f"not drawn: {type(exc).__name__}: {exc}"
    return block
