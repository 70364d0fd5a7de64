"""The findings block printed before a run's or a profile's tables: one line per finding, costliest first,
each with its evidence and the step it would leave (commprof/findings/kinds.py makes them; this renders
the plain dicts of a result document, so `commprof report FILE` prints the same block again).

    commprof profile --nproc 2 --trace t/ -- train.py

Exercised by: `pytest tests/test_findings.py`.
"""

from __future__ import annotations

from rich.text import Text

from commprof.report.units import format_bytes


def findings_text(block: dict | None) -> Text | None:
    """The block as Rich text; None for a document without findings (not traced, or an older commprof)."""
    if not block:
        return None
    pct = f"{block['threshold'] * 100:g} %"
    if block.get("items") is None:
        return Text(f"findings: none computed ({block.get('why', 'the trace could not be matched')})")
    scope = f" ({block['scope']})" if block.get("scope") else ""
    if not block["items"]:
        return Text(f"findings: none above {pct} of the step{scope}")
    out = Text(f"findings, costliest first (each above {pct} of the step){scope}:\n", style="bold")
    for f in block["items"]:
        out.append(f"  {f['kind']:<14}", style="bold")
        at_least = "≥ " if f.get("step_without_lower_bound") else ""
        out.append(f"{_what(f)}; step without it {at_least}{f['step_ms_without']:.1f} ms{_bound(f)}\n")
    if block.get("contended"):
        out.append(f"  (measured while other processes used {block['contended']['others_cores']:.1f} core(s) of this "
                   "host: a straggler or an imbalance here may be the machine's, not a rank's)\n", style="dim")
    if block.get("step_ms") is not None:
        out.append(f"  (the step: {block['step_ms']:.1f} ms, the slowest rank's median over the measured iterations, "
                   "as in the tables; each finding's cost is the step less its step without it)\n", style="dim")
    out.rstrip()
    return out


def _bound(f: dict) -> str:
    """Why a step without is a lower bound, and what prices it: the straggler's late ops that met aligned
    in too few warm-up iterations (findings/whatif.py) keep their late transfer."""
    if not f.get("step_without_lower_bound"):
        return ""
    priced = f["evidence"].get("late_ops_priced_aligned", 0.0)
    return (f" (a lower bound: {priced * 100:.0f} % of the ops it made late met aligned in two warm-up iterations "
            "or more; a higher --warmup prices more)")


def _what(f: dict) -> str:
    ms, share, e = f["ms_per_step"], f["share_of_step"] * 100, f["evidence"]
    if f["kind"] == "straggler":
        peers = ", ".join(f"rank {r} {w:.1f} ms" for r, w in sorted(e["peers_wait_ms"].items(), key=_rank))
        more = (e.get("peers") or {}).get("count", 0) - len(e["peers_wait_ms"])
        if more > 0:  # the longest waits are named; the rest in one figure, at any world size
            peers += f" and {more} more, the median peer {e['peers']['median_wait_ms']:.1f} ms"
        lo, hi = e.get("ms_per_step_ci95") or (ms, ms)
        last = (f"rank {f['rank']} arrives last at {e['last_at_share'] * 100:.0f} % of its ops; "
                if "last_at_share" in e else f"rank {f['rank']} is late (each rank's own and blocked time a step); ")
        return (f"{last}its peers wait "
                f"{ms:.1f} ms/step for it (95 % interval {lo:.1f}–{hi:.1f}; {share:.0f} % of the step: {peers}); "
                f"its own time {e['busy_ms']:.1f} ms against the others' {e['others_busy_ms']:.1f} ms")
    if f["kind"] == "imbalance":
        busy = sorted(f["evidence"]["busy_ms"].items(), key=_rank)
        return (f"rank {f['rank']}'s own time (compute, data, optimizer) is the longest: "
                + ", ".join(f"rank {r} {ms_:.1f} ms" for r, ms_ in busy) + f"; it costs {ms:.1f} ms/step "
                f"({share:.0f} % of the step)")
    if f["kind"] == "exposed_comm":
        bw = "" if e["busbw_GBps"] is None else f", {e['busbw_GBps']:.3g} GB/s bus bandwidth"
        exposed = e.get("exposed_ms_per_step", ms)
        return (f"{f['op']} ({f['group']}) of {format_bytes(f['bytes'])}: {ms:.1f} ms/step ({share:.0f} % of the "
                f"step), {exposed:.1f} ms/step of its transfer exposed, {e['per_step']:.3g} a step{bw}")
    if f["kind"] == "latency_bound":
        under = (f"under n½ = {format_bytes(int(e['n_half_bytes']))} on the bus (α {e['alpha_us']:.0f} µs, "
                 f"{e['bandwidth_GBps']:.3g} GB/s)" if e["n_half_bytes"] is not None else
                 f"of latency alone (α {e['alpha_us']:.0f} µs, their times not growing with their sizes)")
        return (f"{e['ops_per_step']:.3g} collectives a step {under}, {e['ms_per_step_in_them']:.1f} "
                f"ms/step in them: fusing them saves {e['fusing_saves_ms']:.1f} ms of comm, {ms:.1f} ms/step "
                f"({share:.0f} % of the step)")
    if f["kind"] == "link":
        worst, more = e["ops"][0], len(e["ops"]) - 1
        others = f"; {more} more op size(s) below {e['share'] * 100:.0f} %" if more else ""
        return (f"{f['op']} ({f['group']}) of {format_bytes(f['bytes'])} reaches {worst['busbw_GBps']:.3g} GB/s "
                f"on the bus, {worst['fraction_of_link'] * 100:.0f} % of the {e['link_GBps']:.3g} GB/s link"
                f"{others}: {ms:.1f} ms/step over the link's time ({share:.0f} % of the step)")
    if f["kind"] == "bubble":
        idle = ", ".join(f"stage {st} {x * 100:.0f} %" for st, x in sorted(e["fraction_by_stage"].items(), key=_rank))
        work = " / ".join(f"{w:.1f}" for _, w in sorted(e["work_ms_by_stage"].items(), key=_rank))
        return (f"{e['schedule']} idles {idle} of its schedule against the {e['predicted_fraction'] * 100:.0f} % "
                f"that {e['stages']} stages × {e['micro_batches']} micro-batches need; stage work {work} ms: "
                f"{ms:.1f} ms/step beyond the schedule's own bubble ({share:.0f} % of the step"
                + (f"; {e['unequal_stages_ms']:.1f} of it from unequal stages, the rest p2p latency and wake-ups)"
                   if "unequal_stages_ms" in e else ")"))
    if f["kind"] == "host":
        by = ", ".join(f"rank {r} {v:.1f} ms" for r, v in sorted(e["other_ms_by_rank"].items(), key=_rank))
        return (f"every rank's training thread spends {ms:.1f} ms/step or more in no phase and no wait ({share:.0f} % "
                f"of the step: {by}): host work between the phases — a batch fetched outside a data phase, "
                "gradient clipping, logging")
    return f"{ms:.1f} ms/step ({share:.0f} % of the step)"


def _rank(item) -> int:
    return int(item[0])  # JSON keys are strings once saved

