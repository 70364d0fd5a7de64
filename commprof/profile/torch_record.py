"""torch's own record of a profiled script's collectives, set against what commprof counted over the same
measured iterations: every op either saw, counted once, and what neither saw said.

torch keeps a flight recorder: with TORCH_FR_BUFFER_SIZE=N in the environment when a process group is made,
every collective that reaches a group's backend — a Python call, a functional collective, a C++ call such as
`pg.allreduce([t])`, commprof's own Comm — is appended to a ring of the last N, with its group (torch's name
for it), its name (`gloo:all_reduce`), its tensors' sizes and dtypes and the wall clock at its issue
(`time_created_ns`, the clock of `time.time_ns()`). `commprof profile` turns it on in every rank (`turn_on`),
stamps the wall clock at each measured iteration's begin and end on rank 0, and reads rank 0's ring once, after
the last measured iteration (`read`: a dump pickles the whole ring, so never per iteration). The rest is pure
functions of plain data, testable without a process (tests/recorded/fr/ holds a real 2-rank dump):

    tally(dump, spans, groups)          the record's ops inside each measured iteration, per volume key
                                        ("all_reduce", "broadcast (ranks0-1)"), back as far as its ring reaches
    reconcile(tallied, steps, ...)      per key, commprof's calls and bytes beside the record's over those same
                                        iterations (`steps`: commprof's volume per measured iteration); the ops
                                        only the record holds, as volume rows counted from it; and what is in
                                        neither, of what commprof counted as unseen

Which entries are the measured iterations': those created between an iteration's begin and end stamps (wall
clock, taken by commprof on the same host as torch's stamp). One stamp covers every group at once; the
alternative, each group's collective_seq_id noted at the boundaries, needs a read of every group's counter per
boundary (torch exposes it only through a dump of the whole ring, or gloo's own sequence numbers, which are not
the record's) and still says nothing of point-to-point ops, which count apart. A wall-clock step (an NTP step, a
manual date) inside the measured iterations would misplace entries; one before or after them does not matter.

Whether the ring reached back far enough: the dump holds the last N entries; its first entry's record_id above 0
means older ones were dropped (torch keeps a ring for gloo's groups and one for NCCL's: each is read, and judged
so, on its own). An iteration is reconciled only when it began after that first entry was made (so
no dropped entry can be its), and the report says "reconciled over the last K of M measured iterations" rather
than guess at the rest.

Bytes follow commprof's volume convention (commprof/base/measurement.py, nccl-tests'): the elements of the input
tensors times their dtype's size, all_gather by its output (world size × the per-rank count), coalesced calls
over all their tensors. What gloo's record does not show as commprof counts it: no point-to-point op at all
(gloo records none), and a reduce_scatter of one tensor as the all_reduce gloo runs for it (the whole input
reduced, each rank keeping its piece) — within one iteration, where the record lacks reduce_scatters commprof
counted on a group and holds that many more all_reduces of those bytes on it, those are they.

Exercised by: `pytest tests/unit/test_torch_record.py` and `pytest tests/test_profile_cli.py -k torch_record`.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os

from commprof.base.measurement import COLLECTIVES, P2P, wire_factor
from commprof.record.volume import op_key, split_key

BUFFER_SIZE = 2000
"""Entries in the ring commprof asks for when the user set none. The ring is fixed, so a job of days holds no
more than a job of minutes: about 1 KiB an entry (its sizes, dtypes, names and a captured Python stack), 2 MiB a
rank; rank 0's one dump at the end pickles it in ~0.1 s (2,000 entries of one all_reduce each, 2 busy cores).
2,000 covers the last 500 iterations of a DDP step of 4 buckets, the last 30 of a per-parameter all-reduce of
62 tensors: the counts a volume table shows per iteration need a few, and beyond the ring the report says it
reconciled the last K only."""
ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
"""torch's variables for the ring's size, in the order torch reads them (the second its older, NCCL-only name)."""

DTYPE_BYTES = {
    "Byte": 1, "Char": 1, "Bool": 1, "QInt8": 1, "QUInt8": 1, "Float8_e5m2": 1, "Float8_e4m3fn": 1,
    "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1, "Float8_e8m0fnu": 1, "UInt8": 1, "Int8": 1,
    "Short": 2, "Half": 2, "BFloat16": 2, "UInt16": 2, "ComplexHalf": 4,
    "Int": 4, "Float": 4, "QInt32": 4, "UInt32": 4,
    "Long": 8, "Double": 8, "ComplexFloat": 8, "UInt64": 8,
    "ComplexDouble": 16,
}
"""Bytes per element of each dtype by the name torch's record gives it (c10's ScalarType names)."""

ALIASES = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "allgather": "all_gather", "_allgather_base": "all_gather", "all_gather_single": "all_gather",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "allgather_coalesced": "all_gather", "all_gather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_single_coalesced": "all_gather",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_single_coalesced": "reduce_scatter",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all",
    "recv_anysource": "recv", "isend": "send", "irecv": "recv",
}
"""torch's names for an op (the record's `gloo:<name>`, a backend method's, a Python function's) -> commprof's."""


def op_name(raw: str) -> str:
    """commprof's name of an op torch names `raw`: the record's "gloo:all_reduce" or "nccl:send 0->1", a backend's
    "allreduce", an unseen call's "functional all_reduce" or "ddp broadcast"."""
    name = raw.split(":", 1)[-1].strip()
    for prefix in ("functional ", "ddp "):
        name = name.removeprefix(prefix)
    name = name.split(" ", 1)[0]
    return ALIASES.get(name, name)


def turn_on(environ=os.environ) -> dict:
    """Torch's record on for the process groups made from now on (the script's), unless the user sized it:
    {"buffer_size": the ring's entries (0: off), "set_by": "commprof" or the variable the user set}."""
    for name in ENV:
        value = environ.get(name, "").strip()
        if value:
            try:
                return {"buffer_size": max(0, int(value)), "set_by": name}
            except ValueError:
                return {"buffer_size": 0, "set_by": name}
    environ[ENV[0]] = str(BUFFER_SIZE)
    return {"buffer_size": BUFFER_SIZE, "set_by": "commprof"}


def read() -> dict:
    """This process's record as torch dumps it, plain data: its CPU recorder's (gloo's groups) and its NCCL
    recorder's entries, each marked with its "recorder" (torch keeps one ring of each kind), no stack traces (the
    counts need none). RuntimeError where torch cannot dump them."""
    import pickle

    from torch._C import _distributed_c10d as c10d

    entries = []
    for recorder, dump in (("cpu", "_dump_fr_trace"), ("nccl", "_dump_nccl_trace")):
        if not hasattr(c10d, dump):
            continue
        try:
            got = pickle.loads(getattr(c10d, dump)(includeStackTraces=False))
        except (pickle.UnpicklingError, EOFError) as exc:
            raise RuntimeError(f"torch's {recorder} record: {exc}") from exc
        entries += [{**e, "recorder": recorder} for e in got.get("entries") or []]
    return {"entries": entries}


def _elements(sizes) -> list[int]:
    out = []
    for shape in sizes or ():
        n = 1
        for d in shape:
            n *= d
        out.append(n)
    return out


def entry_bytes(entry: dict, op: str) -> int:
    """An entry's payload in commprof's convention: its input tensors' bytes; all_gather's output's."""
    side = "output" if op == "all_gather" else "input"
    sizes, dtypes = entry.get(f"{side}_sizes") or [], entry.get(f"{side}_dtypes") or []
    return sum(n * DTYPE_BYTES.get(dt, 0) for n, dt in zip(_elements(sizes), dtypes))


def tally(dump: dict, spans: list, groups: dict[str, tuple[str, int]]) -> dict:
    """The record's ops in the measured iterations. `spans`: the last measured iterations' (begin, end) wall-clock
    ns on this rank, in order (the last of those whose volume commprof keeps, one to one); `groups`: torch's name
    of each process group -> (commprof's label for it, its size).

    {"entries": entries in the ring, "wrapped": older ones were dropped, "spans": how many were given, "first":
    the first iteration (an index into `spans`) the ring reaches back to, "steps": per iteration from `first` on,
    {volume key: [each call's payload bytes]}, "sizes": {volume key: its group's size}}: plain data, a few numbers
    per recorded op."""
    entries = dump.get("entries") or []
    begins = [b for b, _ in spans]
    first, wrapped = 0, False
    for recorder in {e.get("recorder", "cpu") for e in entries}:  # a ring each: the CPU's and NCCL's
        oldest = min((e for e in entries if e.get("recorder", "cpu") == recorder), key=lambda e: e.get("record_id", 0))
        if oldest.get("record_id", 0) > 0:  # an iteration is whole in the ring once it began after its oldest entry
            wrapped = True
            first = max(first, bisect.bisect_right(begins, oldest["time_created_ns"]))
    steps: list[dict[str, list[int]]] = [{} for _ in spans[first:]]
    sizes: dict[str, int] = {}
    for e in entries:
        t = e.get("time_created_ns")
        if t is None:
            continue
        i = bisect.bisect_right(begins, t) - 1
        if i < first or t > spans[i][1]:
            continue
        pg = e.get("process_group") or ("?", "")
        label, size = groups.get(str(pg[0]), (f"pg {pg[0]}", 0))
        op = op_name(e.get("profiling_name", "?"))
        key = op_key(op, label)
        steps[i - first].setdefault(key, []).append(entry_bytes(e, op))
        sizes[key] = size
    return {"entries": len(entries), "wrapped": wrapped, "spans": len(spans), "first": first, "steps": steps,
            "sizes": sizes}


def _fold_reduce_scatter(mine: dict, recorded: dict[str, list[int]]) -> tuple[dict, set[str]]:
    """One iteration's record as {key: [calls, payload bytes]}, with the all_reduces that are commprof's
    reduce_scatters of the same group (gloo runs and records one as an all_reduce of the whole input) moved to
    reduce_scatter; and the keys moved to. They are taken as such where the record lacks that many
    reduce_scatters of the group and its all_reduces beyond commprof's own hold that many calls of those bytes:
    all of them, or some of them (a choice among at most FOLD_CHOICES)."""
    totals = {k: [len(v), sum(v)] for k, v in recorded.items()}
    moved = set()
    for key, want in mine.items():
        op, group = split_key(key)
        if op != "reduce_scatter":
            continue
        have = totals.get(key, [0, 0])
        calls, payload = want["calls"] - have[0], want["payload_bytes"] - have[1]
        ar = op_key("all_reduce", group)
        pool, ours = recorded.get(ar, []), mine.get(ar, {"calls": 0, "payload_bytes": 0})
        if calls <= 0 or len(pool) - ours["calls"] < calls:
            continue
        whole = (len(pool) - ours["calls"], sum(pool) - ours["payload_bytes"]) == (calls, payload)
        if not whole and not _some_sum(pool, calls, payload):
            continue
        totals[key] = [want["calls"], want["payload_bytes"]]
        totals[ar] = [len(pool) - calls, sum(pool) - payload]
        if not totals[ar][0]:
            del totals[ar]
        moved.add(key)
    return totals, moved


FOLD_CHOICES = 20_000
"""The most choices of the record's all_reduces tried as an iteration's reduce_scatters (`_fold_reduce_scatter`)."""


def _some_sum(pool: list[int], calls: int, payload: int) -> bool:
    """Whether `calls` of `pool`'s byte counts sum to `payload` (False where there are too many choices to try)."""
    if math.comb(len(pool), calls) > FOLD_CHOICES:
        return False
    return any(sum(c) == payload for c in itertools.combinations(pool, calls))


def _wire(op: str, size: int) -> float | None:
    """Bytes a rank sends per payload byte, where commprof's measurement model has the op (None elsewhere:
    gather, scatter, an op torch names that commprof has no form for)."""
    if op in COLLECTIVES or op in P2P:
        return wire_factor(op, size)
    return None


def reconcile(tallied: dict, steps: list[dict], *, backend: str = "gloo", steps_per_epoch: int = 1,
              unseen: dict | None = None, unseen_steps: list[dict] | None = None) -> dict:
    """commprof's counts beside the record's, over the measured iterations the record reaches back to.

    `steps`: commprof's volume per measured iteration ({key: {"calls", "payload_bytes", …}}), whose last ones are
    those of the spans `tally` was given, one to one (rank 0 stamps no more iterations than the ring holds ops);
    `unseen`: commprof's unseen calls (every rank, the whole run); `unseen_steps`: rank 0's unseen calls in each
    iteration `tally` was given.

    The report's "torch_record" block: "rows", per key both counts over the iterations reconciled and how they
    stand (`_status`); "agree", whether every key's counts are equal (or the difference is explained: "why");
    "volume", the ops the record holds beyond commprof's count (a C++ call, a form commprof cannot route) in the
    volume table's form, per iteration over the iterations reconciled; "in_neither" (given `unseen`)."""
    first = tallied["first"]
    covered = steps[len(steps) - tallied.get("spans", len(steps)) + first:]
    ours: dict[str, dict] = {}
    theirs: dict[str, dict] = {}
    folded: set[str] = set()
    for mine, recorded in zip(covered, tallied["steps"], strict=True):
        totals, moved = _fold_reduce_scatter(mine, recorded)
        folded |= moved
        for key, v in mine.items():
            got = ours.setdefault(key, {"calls": 0, "payload_bytes": 0})
            got["calls"] += v["calls"]
            got["payload_bytes"] += v["payload_bytes"]
        for key, (calls, payload) in totals.items():
            got = theirs.setdefault(key, {"calls": 0, "payload_bytes": 0})
            got["calls"] += calls
            got["payload_bytes"] += payload
    rows = []
    for key in sorted(set(ours) | set(theirs)):
        op, group = split_key(key)
        a = ours.get(key, {"calls": 0, "payload_bytes": 0})
        b = theirs.get(key, {"calls": 0, "payload_bytes": 0})
        row = {"key": key, "op": op, "group": group, "commprof_calls": a["calls"],
               "commprof_payload_bytes": a["payload_bytes"], "record_calls": b["calls"],
               "record_payload_bytes": b["payload_bytes"], "status": _status(a, b)}
        if row["status"] == "commprof only" and op in P2P and "gloo" in backend:
            row["why"] = "torch's gloo record holds no point-to-point op"
        if key in folded:
            row["why"] = "gloo records a reduce_scatter as the all_reduce it runs"
        rows.append(row)
    n = len(covered)
    volume = {}
    for row in rows:
        if row["status"] not in ("record only", "record more") or n == 0:
            continue
        calls = (row["record_calls"] - row["commprof_calls"]) / n
        payload = round((row["record_payload_bytes"] - row["commprof_payload_bytes"]) / n)
        factor = _wire(row["op"], tallied["sizes"].get(row["key"], 0))
        wire = None if factor is None else round(payload * factor)
        volume[row["key"]] = {"calls_per_step": calls, "payload_bytes_per_step": payload,
                              "wire_bytes_per_step": wire, "bytes_per_epoch": payload * steps_per_epoch,
                              "wire_bytes_per_epoch": None if wire is None else wire * steps_per_epoch}
    block = {"entries": tallied["entries"], "wrapped": tallied["wrapped"], "iterations": n, "measured": len(steps),
             "agree": all(r["status"] == "agree" or "why" in r for r in rows),
             "rows": rows, "volume": volume}
    if unseen is not None:
        block["in_neither"] = in_neither(unseen, (unseen_steps or [])[first:], rows)
    return block


def _status(ours: dict, theirs: dict) -> str:
    """How commprof's count of a key stands to the record's: "agree" (calls and bytes equal), "record only",
    "record more" (more calls and no fewer bytes: ops commprof did not count beside those it did), "commprof
    only", or "differ"."""
    a, b = (ours["calls"], ours["payload_bytes"]), (theirs["calls"], theirs["payload_bytes"])
    if a == b:
        return "agree"
    if a[0] == 0:
        return "record only"
    if b[0] == 0:
        return "commprof only"
    if b[0] > a[0] and b[1] >= a[1]:
        return "record more"
    return "differ"


def in_neither(unseen: dict, unseen_steps: list[dict], rows: list[dict]) -> dict:
    """commprof's unseen calls (every rank, the whole run) less those of rank 0 in the reconciled iterations that
    the record holds beyond commprof's count (matched by commprof's name of the op): what neither counted."""
    held: dict[str, int] = {}
    for r in rows:
        if r["status"] in ("record only", "record more"):
            held[r["op"]] = held.get(r["op"], 0) + r["record_calls"] - r["commprof_calls"]
    mine: dict[str, int] = {}
    for step in unseen_steps:
        for name, n in step.items():
            mine[name] = mine.get(name, 0) + n
    left = dict(unseen)
    for name, n in sorted(mine.items()):
        op = op_name(name)
        take = min(n, held.get(op, 0), left.get(name, 0))
        if take:
            held[op] -= take
            left[name] -= take
    return {k: v for k, v in left.items() if v > 0}
