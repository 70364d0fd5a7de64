"""The flight recorder: every rank's last ops, and the first place where the ranks' calls diverge.

`Comm._call` appends one tuple per op to a short ring shared by a rank's Comms — (group, seq, name, bytes,
dtype), seq counting the collectives of that group, so the k-th collective of a group has the same seq on
every member. Point-to-point ops are kept (they show where a rank was) but never compared: a pipeline's
stages legitimately send and receive different things. On a failure (a timeout, a backend error) the
ranks' snapshots are exchanged over the control plane and `first_divergence` names the earliest seq at
which the members of a group called different collectives — or at which one rank called one and a peer,
blocked in another op, never will — as one line:

    desync at all_reduce seq 17 (world): rank 0 called all_reduce 4 KiB float32, rank 1 called all_gather 8 KiB float32

`dump` writes a rank's snapshot as JSON (`--debug-dump DIR`, or beside the --json file on a failure), and as
torch's flight-recorder dump for `python -m torch.distributed.flight_recorder.fr_trace DIR -p fr_trace_rank_`
(comm/failure/fr_dump.py).
Exercised by: `pytest tests/unit/test_failure_diagnosis.py tests/test_failures.py`.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from pathlib import Path

from commprof.base.measurement import P2P, runs
from commprof.base.stats import gc_paused
from commprof.base.units import format_bytes
from commprof.comm.dtypes import dtype_name
from commprof.comm.failure import fr_dump


def snapshot(recorder, *, rank: int, reason: str | None = None) -> dict:
    """This rank's flight record as plain data: its ring, its groups, where each group's seq stands and
    the op it is blocked in, if any."""
    comms = list(recorder.comms)
    busy = next((f"{c.busy or c.failed} ({c.label})" for c in comms if (c.busy or c.failed) is not None), None)
    return {
        "rank": rank,
        "reason": reason,
        "busy": busy,
        "groups": {c.label: list(c.members) for c in comms},
        "seqs": {c.label: c.seq for c in comms},
        "ring": [[label, seq, name, nbytes, dtype_name(dtype) if dtype is not None else None]
                 for label, seq, name, nbytes, dtype in list(recorder.ring)],
    }


def describe(name: str, nbytes: int, dtype: str | None) -> str:
    return f"{name} {format_bytes(nbytes)}{' ' + dtype if dtype else ''}"


def first_divergence(snapshots: dict[int, dict]) -> str | None:
    """The earliest collective seq, in any group, at which the reporting members' calls differ; None when
    every rank that answered agrees (then the failure is a stall or a death, not a desync)."""
    with gc_paused():
        return _first_divergence(snapshots)


def _first_divergence(snapshots: dict[int, dict]) -> str | None:
    groups: dict[tuple, list[int]] = {}
    for rank, snap in snapshots.items():
        for label, members in snap["groups"].items():
            spans = tuple(map(tuple, members if members and isinstance(members[0], list) else runs(members)))
            groups.setdefault((label, spans), [])
            if _within(rank, spans):
                groups[(label, spans)].append(rank)
    found = []
    for (label, _members), ranks in sorted(groups.items()):
        if len(ranks) < 2:
            continue
        calls = {r: {seq: (name, nbytes, dtype) for lbl, seq, name, nbytes, dtype in snapshots[r]["ring"]
                     if lbl == label and name not in P2P} for r in ranks}
        last = {r: snapshots[r]["seqs"].get(label, 0) for r in ranks}
        # older seqs may have left some rank's ring: compare only what every member still holds
        start = max((min(c) if c else last[r] + 1) for r, c in calls.items())
        for seq in range(start, max(last.values()) + 1):
            line = _diverges(label, seq, {r: calls[r].get(seq) for r in ranks}, last, snapshots)
            if line:
                found.append((seq, line))
                break
    return min(found)[1] if found else None


def _diverges(label: str, seq: int, at: dict, last: dict, snapshots: dict) -> str | None:
    made = {r: c for r, c in at.items() if c is not None}
    if not made:
        return None
    # a member that has not reached seq is a desync only if it is blocked in some other op: an idle one
    # is merely late (a stall, reported as such)
    absent = [r for r, c in at.items() if c is None and last[r] < seq and snapshots[r]["busy"]]
    if len(set(made.values())) == 1 and not absent:
        return None
    first = made[min(made)]
    parts = []
    for call in dict.fromkeys(made[r] for r in sorted(made)):
        who = [r for r in sorted(made) if made[r] == call]
        parts.append(f"{name_ranks(who)} called {describe(*call)}")
    for r in absent:
        parts.append(f"{name_ranks([r])} called nothing at this seq (it is in {snapshots[r]['busy']})")
    return f"desync at {first[0]} seq {seq} ({label}): " + ", ".join(parts)


RUNS_SHOWN = 8
"""Runs of consecutive ranks a line names; the rest counted."""


def name_ranks(ranks: list[int]) -> str:
    """`ranks` (sorted) as one short phrase at any world size: "rank 3", "ranks 0, 2", "ranks 0-4094, 4096-16383"."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    spans = runs(ranks)
    text = ", ".join(f"{a}" if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}" for a, b in spans[:RUNS_SHOWN])
    more = sum(b - a + 1 for a, b in spans[RUNS_SHOWN:])
    return f"ranks {text}" + (f" and {more} more" if more else "")


def _within(rank: int, spans: tuple) -> bool:
    k = bisect_right(spans, (rank, float("inf"))) - 1
    return k >= 0 and spans[k][0] <= rank <= spans[k][1]


def dump(folder: str | Path, snap: dict) -> Path:
    """Write one rank's snapshot to FOLDER/rank<r>.flight.json (base/files.py's OutputError if it cannot), and
    beside it the same record in torch's flight-recorder format, for torch's fr_trace (comm/failure/fr_dump.py)."""
    from commprof.base.files import write_atomic

    path = Path(folder) / f"rank{snap['rank']}.flight.json"
    write_atomic(path, json.dumps(snap, indent=1) + "\n", sync=False)  # a rank killed meanwhile leaves none, not 0 B
    try:
        fr_dump.write(folder, snap)
    except Exception:  # any failure, a full disk or a bug: the JSON is written, and the job's verdict comes next
        pass
    return path
