"""The merged Chrome trace, DIR/trace.json: every rank's file read back (`load`, which also takes a file cut
short), their events in one file with the clock alignment, flow arrows for every collective from the
rank everyone waited for to the others, and each rank's counter "bytes in flight".

A rank blocked in a collective waits for the last member to issue it, so each op gets one arrow per other
member: from the last rank to arrive (the latest issue among the members' spans of that op) to each
other member's completion — who everyone waited for, always pointing forward in time (Perfetto sorts
events by time and drops a flow end without an earlier start). A member that completed before the last
one issued (a broadcast root, say) did not wait and gets no arrow. The arrows need every rank's
spans, so they are drawn here, not in the per-rank files. The counter, the payload bytes of a rank's ops
issued and not yet complete, is drawn here too: from a rank's whole run at once (not a write's share of
it), and off the ranks' hot path, where it cost two events and a sort per op. Rank 0 merges at the end of a run
(record/trace.py's `finish`); `merge(DIR)` does it again from the files after a killed run. A job of more than
MERGED_RANKS ranks gets a merged file of the ranks that tell its story (`held_ranks`), its otherData's `held`
saying which and where the rest are: every rank's own file stays beside it, and the findings read those.
Exercised by: `pytest tests/unit/test_trace_files.py tests/test_trace.py`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from commprof.base.files import write_atomic
from commprof.base.measurement import COLLECTIVES, P2P, members_of

MERGED_RANKS = 64
"""The most ranks a merged trace.json holds: at 16,384 ranks every rank's events made 1.85 GB, past what the
Perfetto UI opens; the ranks that tell the story fit in 64 (each rank's own file holds the rest)."""
OUTLIERS = 8
"""The least and the most blocked ranks a merged trace of some ranks holds, each."""

FLOWS = tuple(name for name in COLLECTIVES if name not in P2P)
"""Ops whose spans on every member of their group are joined by flow arrows: the collectives."""
INSIDE_US = 0.001
"""How far before its slice's end a flow end sits: one nanosecond, the files' resolution. A flow end binds
to the slice that encloses it, and a slice's end is the next slice's start on a busy comm thread."""


def comm_ops(events: list[dict]) -> dict[tuple, dict[int, dict]]:
    """(group label, members, op, k) -> {pid: that rank's span of its k-th such op}, for the collectives of every
    group of two ranks or more, from the spans on each rank's comm threads (host or stream)."""
    threads, known = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            name = e["args"]["name"]
            if name.startswith(("comm (", "stream: comm (")):
                label = name.split("(", 1)[1][:-1]
                threads[(e["pid"], e["tid"])] = (label, members_of(e["args"], known) or ())
    issued: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        group = threads.get((e.get("pid"), e.get("tid")))
        if group is None or e.get("ph") != "X" or e.get("cat") != "comm":
            continue
        name = e["name"].rsplit(" (", 1)[0]
        if name in FLOWS and e["args"]["group_size"] > 1:
            issued[(e["pid"], *group, name)].append(e)
    # every member issues a group's collectives in the same order: the k-th by issue time is one op (the
    # files list ops as they complete, which async ops do in another order on each rank)
    ops: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for (pid, *key), spans in issued.items():
        for k, e in enumerate(sorted(spans, key=lambda e: e["ts"])):
            ops[(*key, k)][pid] = e
    return ops


def flows(events: list[dict], *, partial: bool = False) -> list[dict]:
    """Flow events ("s" on the last rank to arrive, "f" on each rank that waited for it) for every op seen
    on all of its group's members; an op some member never traced (a rank killed first) gets none. `partial`
    (a merged trace of some ranks only): every member whose events are here."""
    out: list[dict] = []
    here = {e["args"]["rank"] for e in events if e.get("name") == "clock_sync"} if partial else None
    need: dict[int, int] = {}  # id(members) -> members whose events are here
    for (_label, members, name, _seq), spans in comm_ops(events).items():
        size = next(iter(spans.values()))["args"]["group_size"]
        if here is not None and members:
            if id(members) not in need:
                need[id(members)] = sum(1 for r in members if r in here)
            size = need[id(members)]
        if len(spans) < size or len(spans) < 2:
            continue
        last = max(spans.values(), key=lambda e: (e["ts"], e["pid"]))
        start = last["ts"]
        for pid, span in sorted(spans.items()):
            end = span["ts"] + span["dur"]
            if span is last or end < start:
                continue
            ident = len(out) // 2 + 1
            at = round(max(start, span["ts"], end - INSIDE_US), 3)
            # the slice's own category: Chrome's DevTools panel binds a flow only to a slice of the same cat
            out.append({"name": name, "cat": "comm", "ph": "s", "id": ident, "pid": last["pid"], "tid": last["tid"],
                        "ts": start})
            out.append({"name": name, "cat": "comm", "ph": "f", "bp": "e", "id": ident, "pid": pid,
                        "tid": span["tid"], "ts": at})
    return out


def in_flight(events: list[dict]) -> list[dict]:
    """Counter events "bytes in flight", per rank (pid): stepping at every issue and completion of the spans
    on its comm threads, host or stream, a completion before an issue at the same instant."""
    comm, training = set(), {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            if e["args"]["name"].startswith(("comm (", "stream: comm (")):
                comm.add((e["pid"], e["tid"]))
            elif e["args"]["name"] == "training":
                training[e["pid"]] = e["tid"]
    steps: dict[int, list[tuple]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in comm and e["args"].get("bytes"):
            steps[e["pid"]] += [(e["ts"], e["args"]["bytes"]), (round(e["ts"] + e["dur"], 3), -e["args"]["bytes"])]
    out = []
    for pid, deltas in sorted(steps.items()):
        level = 0
        for ts, delta in sorted(deltas, key=lambda s: (s[0], s[1] > 0)):
            level += delta
            out.append({"name": "bytes in flight", "ph": "C", "pid": pid, "tid": training.get(pid, 0), "ts": ts,
                        "args": {"bytes": level}})
    return out


def load(path: str | Path) -> list[dict]:
    """A per-rank file's events: a whole array, or one cut short (by a kill inside a write, or written by an
    older commprof, which ended every event with "," and the array only at the end)."""
    return parse(Path(path).read_text())


def parse(text: str) -> list[dict]:
    """A per-rank file's text as its events (see `load`)."""
    body = text.rstrip().rstrip(",")
    for attempt in (text, body + "\n]"):  # whole; or all there but the array's end
        try:
            return json.loads(attempt)
        except json.JSONDecodeError:
            pass
    cut = body.rfind("\n")  # one event a line: what follows the last newline is an event cut short
    return json.loads(body[:cut].rstrip().rstrip(",") + "\n]")


def write_merged(directory: Path, per_rank: list, clocks: dict | None) -> Path:
    """DIR/trace.json: every rank's events — of a job of more than MERGED_RANKS ranks, those of the ranks
    `held_ranks` picks, saying which and where the others are — then the flow arrows between them and each
    rank's counter. `per_rank`: each rank's events, or a call that reads them (a large job's are then read
    one at a time, and again for the ranks held: never all at once)."""
    sources = [r if callable(r) else (lambda r=r: r) for r in per_rank]
    world, held = len(sources), None
    if world > MERGED_RANKS:
        summaries = [summary(get()) for get in sources]
        held = held_ranks(summaries)
        keep = set(held)
        sources = [get for get, s in zip(sources, summaries) if s[0] in keep]
        if clocks:
            clocks = {**clocks, "ranks": [c for c in clocks.get("ranks", ()) if c.get("rank") in keep]}
    events = [e for get in sources for e in get()]
    events += flows(events, partial=held is not None) + in_flight(events)
    path = directory / "trace.json"
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"producer": "commprof", "clock_sync": clocks}}
    if held is not None:
        doc["otherData"]["held"] = {
            "of": world, "ranks": held, "rest": "every rank's own file beside this one: rank<r>.trace.json",
            "why": f"a job of {world} ranks: its {OUTLIERS} least and {OUTLIERS} most blocked ranks (who the "
                   f"others waited for, and who waited), rank 0, then the first rank of each host, "
                   f"{MERGED_RANKS} at most; flow arrows join the ranks held here"}
    # whole or not at all, under its final name: a full disk leaves no truncated trace.json, and says which file
    write_atomic(path, json.dumps(doc, separators=(",", ":")) + "\n", sync=False)
    return path


def merge(directory: str | Path) -> Path:
    """Rebuild DIR/trace.json from DIR/rank*.trace.json (e.g. after a killed run)."""
    directory = Path(directory)
    files = sorted(directory.glob("rank*.trace.json"), key=lambda p: int(p.name[4:].split(".")[0]))
    files = [p for p in files if p.stat().st_size]  # a rank killed while opening its file
    if len(files) <= MERGED_RANKS:
        per_rank = [load(p) for p in files]
        clocks = [e["args"] for rank in per_rank for e in rank if e.get("name") == "clock_sync"]
    else:  # read one at a time, here and as they are merged
        per_rank = [lambda p=p: load(p) for p in files]
        clocks = [c for c in (summary(get())[3] for get in per_rank) if c is not None]
    return write_merged(directory, per_rank, {"ranks": clocks} if clocks else None)


def summary(events: list[dict]) -> tuple:
    """(rank, host, blocked µs, clock_sync args) of one rank's events: rank None when they name none. Blocked:
    its training thread's time in comm and waits."""
    rank, host, training, clock = None, None, None, None
    for e in events:
        if e.get("ph") != "M":
            continue
        if e.get("name") == "clock_sync":
            rank, host, clock = e["args"]["rank"], e["args"].get("host"), e["args"]
        elif e.get("name") == "thread_name" and e["args"].get("name") == "training":
            training = e["tid"]
    blocked = sum(e.get("dur", 0.0) for e in events if e.get("ph") == "X" and e.get("tid") == training
                  and e.get("cat") in ("comm", "wait", "bubble"))
    return rank, host, blocked, clock


def held_ranks(summaries: list[tuple]) -> list[int]:
    """The ranks a merged trace of a large job holds (`summary` of each rank's events): the OUTLIERS least
    blocked (a straggler blocks least: the others wait for it) and most blocked; rank 0; then the first rank
    of each host, in rank order, up to MERGED_RANKS."""
    blocked = {s[0]: s[2] for s in summaries if s[0] is not None}
    first_of_host: dict = {}
    for rank, host, _, _ in sorted((s for s in summaries if s[0] is not None), key=lambda s: s[0]):
        first_of_host.setdefault(host, rank)
    by_blocked = sorted(blocked, key=lambda r: (blocked[r], r))
    chosen = dict.fromkeys(r for r in (*by_blocked[:OUTLIERS], *by_blocked[-OUTLIERS:], 0) if r in blocked)
    for rank in first_of_host.values():
        if len(chosen) >= MERGED_RANKS:
            break
        chosen.setdefault(rank)
    return sorted(chosen)
