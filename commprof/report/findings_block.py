"""The findings block printed after a run's or a profile's tables: one paragraph per finding, costliest first
(commprof/findings/kinds.py makes them; this renders the plain dicts of a result document, so `commprof report
FILE` prints the same block again).

Each paragraph leads with one figure, what the finding costs a step (ms/step and its share of the step), then
one "evidence:" clause that holds at most one more ms figure, the step without it; every other figure is in
the JSON's `evidence`. A paragraph wraps to the width it is drawn in, with a hanging indent: its continuation
lines sit under its text, never at column 0.

    findings, costliest first (each above 3 % of the step):
      straggler     rank 1: its peers wait 19.7 ms/step for it (76 % of the step); evidence: it arrives last
                    at 100 % of its ops, its own time 6.7× the others'; step without it 7.9 ms

    commprof profile --nproc 2 --trace t/ -- train.py

Exercised by: `pytest tests/unit/test_findings_recorded.py tests/test_findings.py`.
"""

from __future__ import annotations

import re
import statistics
from typing import Iterable

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.text import Text

from commprof.base.units import format_bytes

LABEL = 14
"""The width of a finding's kind ahead of its text (latency_bound and a space)."""
INDENT = 2
"""Every line of the block but its first starts this far in."""


class Findings:
    """The block as paragraphs, each drawn with a hanging indent at the width it is given; `plain` is its text
    with one line per paragraph (what a test or a log reads)."""

    def __init__(self, title: Text, items: Iterable[tuple[str, Text]] = (), notes: Iterable[Text] = ()) -> None:
        self.title = title
        self.items = list(items)
        """(kind, its paragraph), costliest first."""
        self.notes = list(notes)
        """Dim lines after the findings: the host was contended, what "the step" is."""

    @property
    def plain(self) -> str:
        lines = [self.title.plain]
        lines += [" " * INDENT + f"{kind:<{LABEL}}" + text.plain for kind, text in self.items]
        lines += [" " * INDENT + note.plain for note in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.plain

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        yield from _hanging(console, Text(""), self.title, width, INDENT)
        for kind, text in self.items:
            label = Text(" " * INDENT + f"{kind:<{LABEL}}", style="bold")
            yield from _hanging(console, label, text, width, INDENT + LABEL)
        for note in self.notes:
            yield from _hanging(console, Text(" " * INDENT), note, width, INDENT + 1)  # under the "(" of "(the …"


def _hanging(console: Console, first: Text, body: Text, width: int, indent: int) -> RenderResult:
    """`first` then `body` wrapped at `width`: its first line after `first` (no wider than `indent`), the others
    `indent` in (less where the width leaves the text too little room), each ended by a newline."""
    indent = min(indent, max(0, width // 3))
    first = first if first.cell_len <= indent else first[:indent]
    for i, line in enumerate(_wrap(body.plain, max(1, width - indent))):
        yield from (first if i == 0 else Text(" " * indent)).render(console)
        yield from Text(line, style=body.style).render(console)
        yield Segment.line()


UNIT = re.compile(r"^(%|ms|ms/step|µs|s|GB/s|B|KiB|MiB|GiB|TiB)(?=$|[^\w/])")
"""A word that names the unit of the figure before it: the two stay on one line ("72 %", "9.5 ms")."""


def _wrap(text: str, room: int) -> list[str]:
    """`text` in lines of at most `room` cells, broken at spaces but never between a figure and its unit or
    after a "≥"; a word longer than a line is folded."""
    words: list[str] = []
    for word in text.split():
        if words and (UNIT.match(word) and words[-1][-1:].isdigit() or words[-1].endswith("≥")):
            words[-1] += " " + word
        else:
            words.append(word)
    lines = [""]
    for word in words:
        if lines[-1] and cell_len(lines[-1]) + 1 + cell_len(word) > room:
            lines.append("")
        lines[-1] += (" " if lines[-1] else "") + word
        while cell_len(lines[-1]) > room:  # a word wider than a whole line
            lines[-1:] = [lines[-1][:room], lines[-1][room:]]
    return lines


def findings_text(block: dict | None) -> Findings | None:
    """The block, drawn at the width it is printed in; None for a document without findings (not traced, or
    an older commprof)."""
    if not block:
        return None
    pct = f"{block['threshold'] * 100:g} %"
    if block.get("items") is None:
        return Findings(Text(f"findings: none computed ({block.get('why', 'the trace could not be matched')})"))
    scope = f" ({block['scope']})" if block.get("scope") else ""
    if not block["items"]:
        return Findings(Text(f"findings: none above {pct} of the step{scope}"))
    title = Text(f"findings, costliest first (each above {pct} of the step){scope}:", style="bold")
    items = [(f["kind"], Text(f"{_headline(f)}; evidence: {_evidence(f)}")) for f in block["items"]]
    notes = []
    if block.get("contended"):
        notes.append(Text(f"(measured while other processes used {block['contended']['others_cores']:.1f} core(s) "
                          "of this host: a straggler or an imbalance here may be the machine's, not a rank's)",
                          style="dim"))
    if block.get("step_ms") is not None:
        notes.append(Text(f"(the step: {block['step_ms']:.1f} ms, the slowest rank's median over the measured "
                          "iterations, as in the tables; each finding's cost is the step less its step without it; "
                          "the JSON's evidence holds every other figure)", style="dim"))
    return Findings(title, items, notes)


def _cost(f: dict) -> str:
    """The one headline figure: what the finding costs a step, and its share of the step."""
    return f"{f['ms_per_step']:.1f} ms/step ({f['share_of_step'] * 100:.0f} % of the step)"


def _headline(f: dict) -> str:
    """Who or what, and its cost a step: the only ms figure before the evidence."""
    kind, cost = f["kind"], _cost(f)
    if kind == "straggler":
        return (f"rank {f['rank']}: its peers wait {f['ms_per_step']:.1f} ms/step for it "
                f"({f['share_of_step'] * 100:.0f} % of the step)")
    if kind == "imbalance":
        return f"rank {f['rank']}'s own time (compute, data, optimizer) is the longest: {cost}"
    if kind == "exposed_comm":
        return f"{f['op']} ({f['group']}) of {format_bytes(f['bytes'])}, its transfer exposed: {cost}"
    if kind == "latency_bound":
        e = f["evidence"]
        under = (f"under n½ = {format_bytes(int(e['n_half_bytes']))} on the bus" if e["n_half_bytes"] is not None
                 else "of latency alone")
        return f"{e['ops_per_step']:.3g} collectives a step {under}: fusing them saves {cost}"
    if kind == "link":
        return f"{f['op']} ({f['group']}) of {format_bytes(f['bytes'])}: {cost} over the link's time"
    if kind == "bubble":
        return f"{f['evidence']['schedule']}: {cost} beyond the schedule's own bubble"
    if kind == "host":
        return (f"every rank's training thread spends {f['ms_per_step']:.1f} ms/step or more in no phase and no "
                f"wait ({f['share_of_step'] * 100:.0f} % of the step)")
    return cost


def _evidence(f: dict) -> str:
    """What says so, in words and ratios, then the step without it: the clause's one ms figure."""
    e, ms = f["evidence"], f["ms_per_step"]
    said: list[str] = []
    if f["kind"] == "straggler":
        said.append(f"it arrives last at {e['last_at_share'] * 100:.0f} % of its ops" if "last_at_share" in e
                    else "late by each rank's own and blocked time a step")
        if e.get("others_busy_ms"):
            said.append(f"its own time {e['busy_ms'] / e['others_busy_ms']:.1f}× the others'")
        peers = sorted(waits_of(e.get("peers_wait_ms")).items())
        more = (e.get("peers") or {}).get("count", 0) - len(peers)
        if more > 0:  # the longest waits are named; the rest in one figure, at any world size
            longest = max((w for _, w in peers), default=0.0)
            share = e["peers"]["median_wait_ms"] / longest * 100 if longest > 0 else 0.0
            said.append("waiting longest: " + ", ".join(f"rank {r}" for r, _ in peers)
                        + f" and {more} more, the median peer {share:.0f} % as long")
        elif len(peers) > 1:
            said.append("waiting: " + ", ".join(f"rank {r}" for r, _ in peers))
    elif f["kind"] == "imbalance":
        busy = {int(r): v for r, v in e["busy_ms"].items()}
        others = [v for r, v in busy.items() if r != f["rank"]]
        if others and statistics.median(others) > 0:
            said.append(f"its own time {(busy[f['rank']] / statistics.median(others) - 1) * 100:.0f} % above "
                        "the others' median")
    elif f["kind"] == "exposed_comm":
        bw = "" if e.get("busbw_GBps") is None else f" at {e['busbw_GBps']:.3g} GB/s bus bandwidth"
        said.append(f"{e['per_step']:.3g} a step{bw}")
    elif f["kind"] == "latency_bound":
        said.append(f"α {e['alpha_us']:.0f} µs, {e['bandwidth_GBps']:.3g} GB/s" if e["n_half_bytes"] is not None
                    else f"α {e['alpha_us']:.0f} µs, their times not growing with their sizes")
    elif f["kind"] == "link":
        worst, more = e["ops"][0], len(e["ops"]) - 1
        said.append(f"{worst['busbw_GBps']:.3g} GB/s on the bus, {worst['fraction_of_link'] * 100:.0f} % of the "
                    f"{e['link_GBps']:.3g} GB/s link"
                    + (f"; {more} more op size(s) below {e['share'] * 100:.0f} %" if more else ""))
    elif f["kind"] == "bubble":
        idle = ", ".join(f"stage {st} {x * 100:.0f} %" for st, x in sorted(e["fraction_by_stage"].items(), key=_rank))
        said.append(f"it idles {idle} of its schedule against the {e['predicted_fraction'] * 100:.0f} % that "
                    f"{e['stages']} stages × {e['micro_batches']} micro-batches need")
        if "unequal_stages_ms" in e and ms > 0:
            said.append(f"{e['unequal_stages_ms'] / ms * 100:.0f} % of it from unequal stages, the rest p2p latency "
                        "and wake-ups")
    elif f["kind"] == "host":
        said.append("host work between the phases: a batch fetched outside a data phase, gradient clipping, "
                    "logging")
    at_least = "≥ " if f.get("step_without_lower_bound") else ""
    without = f"step without it {at_least}{f['step_ms_without']:.1f} ms{_bound(f)}"
    return "; ".join([", ".join(said), without] if said else [without])


def _bound(f: dict) -> str:
    """Why a step without is a lower bound, and what prices it: the straggler's late ops that met aligned
    in too few warm-up iterations (findings/whatif.py) keep their late transfer."""
    if not f.get("step_without_lower_bound"):
        return ""
    priced = f["evidence"].get("late_ops_priced_aligned", 0.0)
    return (f" (a lower bound: {priced * 100:.0f} % of the ops it made late met aligned in two warm-up iterations "
            "or more; a higher --warmup prices more)")


def waits_of(value) -> dict[int, float]:
    """Per-peer waits as {rank: ms}, from the JSON's [{"rank", "ms"}] or from the {"rank": ms} a file written
    before that form holds."""
    if isinstance(value, dict):
        return {int(r): ms for r, ms in value.items()}
    return {int(p["rank"]): p["ms"] for p in value or ()}


def _rank(item) -> int:
    return int(item[0])  # JSON keys are strings once saved
