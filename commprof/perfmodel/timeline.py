"""The measured iterations of a run, read back from its Chrome trace as one program per rank: time the
training thread was busy, the points where it issued each op, and the points where it blocked on one.

Every op is named the same on every member of its group — (label, group, op, k) for the k-th such
collective, (label, group, sender, receiver, k) for the k-th message of a pipeline link, the group a number
standing for its member list — so a replay can join the ranks again. A wait is joined to the oldest op of
its name and group issued before it and not yet waited on, and the last wait of a name and group in an
iteration to every such op issued before it (a C++ reducer's one wait at the end of backward is on all of
DDP's buckets: it blocks on each in turn, until the last completes); a blocking op blocks from its issue to
the end of its own training-thread range.

    commprof run --strategy ddp --nproc 2 --trace t/ --json r.json && commprof predict r.json --fabric …

Exercised by: `pytest tests/unit/test_predict.py`.
"""

from __future__ import annotations

import os
import statistics
from bisect import bisect_left, bisect_right
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

from commprof.base.errors import UsageError
from commprof.base.inputs import read_json, wrong_shape
from commprof.base.measurement import ALIGNED, Members, members_of

NOT_OURS = "neither a run JSON nor a commprof trace"

SENDS, RECVS = "send", "recv"


@dataclass(frozen=True)
class Op:
    """One op as one rank saw it."""

    key: tuple
    """The same on every rank taking part: which op of which group this is."""
    name: str
    """torch.distributed's name (isend logs as send)."""
    label: str
    """The group's label ("world", "dp", "pp0-1", …)."""
    members: tuple[int, ...]
    """The group's global ranks."""
    nbytes: int
    """Payload (nccl-tests' size: the whole vector for all_reduce, n × chunk for all_gather)."""
    measured_ms: float
    """Issue to completion, as measured."""


@dataclass(frozen=True)
class Program:
    """One rank's measured iteration: ("busy", ms), ("issue", Op) and ("wait", Op, ms after completion)."""

    rank: int
    wall_ms: float
    steps: tuple
    start_us: float = 0.0
    """When the iteration began, on the trace's clock (rank 0's)."""
    spans: tuple = ()
    """(issue µs, completion µs, Op) of each op issued in the iteration, on the trace's clock."""
    blocks: tuple = ()
    """(Op, from µs, resume µs): each time the training thread blocked on an op, on the trace's clock."""


@dataclass(frozen=True)
class Measured:
    """What a prediction starts from."""

    source: str
    strategy: str
    backend: str | None
    """The backend it ran on (None: the trace alone does not say)."""
    world_size: int
    hosts: tuple[str, ...]
    """Each rank's host."""
    global_batch: int | None
    """Samples per iteration (None: the trace alone does not say)."""
    iterations: tuple[tuple[Program, ...], ...]
    """Per measured iteration, every rank's program."""
    measured_wall_ms: float
    """The step: each rank's median iteration over those iterations, of the slowest rank (the tables' figure)."""
    aligned: tuple[tuple[Program, ...], ...] = ()
    """Per aligned iteration (record/aligned.py: the warm-up iterations after the first), every rank's program."""


def load(path: str) -> Measured:
    """Its files read through base/inputs.py: a run (or profile) JSON made with --trace
    and the trace it names, a trace.json, or a trace's folder, as a timeline.Measured; any file that cannot
    be read, parsed or replayed is UsageError naming it."""
    p = Path(path)
    folder = os.path.isdir(p)
    if folder and not os.path.lexists(p / "trace.json"):
        raise UsageError(f"{path}: a folder with no trace.json in it: give a run JSON, a trace.json or its folder")
    doc = read_json(p / "trace.json" if folder else p, NOT_OURS)
    if "traceEvents" in doc:
        with wrong_shape(path, NOT_OURS):
            return from_trace(doc, path, strategy=p.name if folder else p.parent.name, global_batch=None,
                              backend=None, folder=p if folder else p.parent)
    if not (isinstance(doc.get("config"), dict) and "iterations" in doc):
        raise UsageError(f"{path}: {NOT_OURS}")
    with wrong_shape(path, NOT_OURS):
        cfg = doc["config"]
        traced = (cfg.get("out") or {}).get("trace")
        if not traced:
            raise UsageError(f"{path}: this run was not traced, so its ops' timing is not in it: "
                             "rerun it with --trace DIR")
        found = next((c for c in (Path(traced), p.parent / traced) if os.path.isfile(c / "trace.json")), None)
        if found is None:
            raise UsageError(f"{path}: its trace {traced}/trace.json is not there (moved?): give the trace instead")
        strategy = cfg.get("strategy") or Path(cfg.get("script") or "script").name
        global_batch = (doc.get("steps") or {}).get("global_batch")
    trace = read_json(found / "trace.json", "not a commprof trace")
    with wrong_shape(str(found / "trace.json"), "not a commprof trace"):
        return from_trace(trace, path, strategy=strategy, global_batch=global_batch,
                          backend=cfg.get("backend"), folder=found)


def from_trace(doc: dict, source: str, *, strategy: str, global_batch: int | None, backend: str | None,
               folder: Path | None = None) -> Measured:
    """The merged trace `doc`; one that holds some of the ranks only (record/merge.py's `held`, a job of many
    ranks) is read from every rank's own file in `folder` instead, one file at a time."""
    held = (doc.get("otherData") or {}).get("held")
    if held is not None:
        return from_ranks(_rank_files(folder, held["of"], source), held["of"], source, strategy=strategy,
                          global_batch=global_batch, backend=backend)
    events = doc["traceEvents"]
    # each process's clock_sync metadata names its rank (pid r + 1; traces of older commprof used pid r)
    rank_of = {e.get("pid"): e["args"]["rank"] for e in events if e.get("name") == "clock_sync"}
    by_rank: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        by_rank[rank_of.get(e.get("pid"), e.get("pid"))].append(e)
    ranks = sorted(r for r in by_rank if isinstance(r, int))
    if ranks != list(range(len(ranks))) or not ranks:
        raise UsageError(f"{source}: the trace lacks ranks (it holds {ranks}): was the run cut short?")
    return from_ranks(((r, by_rank.pop(r)) for r in ranks), len(ranks), source, strategy=strategy,
                      global_batch=global_batch, backend=backend)


def _rank_files(folder: Path | None, world_size: int, source: str):
    """(rank, its events) of every rank's file in `folder`, in rank order, each read when it is reached."""
    from commprof.record.merge import load as load_rank

    for r in range(world_size):
        path = None if folder is None else Path(folder) / f"rank{r}.trace.json"
        if path is None or not path.is_file():
            raise UsageError(f"{source}: its trace.json holds some ranks only, and rank {r}'s own file "
                             f"({path}) is not there: give the folder the job traced into")
        try:
            yield r, load_rank(path)
        except (OSError, ValueError) as exc:
            raise UsageError(f"{path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None


def from_ranks(ranks, world_size: int, source: str, *, strategy: str, global_batch: int | None,
               backend: str | None) -> Measured:
    """Every rank's (rank, events) of a job of `world_size` ranks, in rank order, as a Measured: each rank's
    events are made into its programs and let go before the next rank's are read."""
    known = {}  # one Members per group, shared by every rank's ops: a key's lookup is then by identity
    found, hosts, order = [], [], []
    for r, events in ranks:
        order.append(r)
        sync = next((e for e in events if e.get("name") == "clock_sync"), None)
        hosts.append(sync["args"]["host"] if sync is not None else "?")
        found.append(_rank_programs(events, r, world_size, source, known))
    if order != list(range(len(order))) or not order:
        raise UsageError(f"{source}: the trace lacks ranks (it holds {order}): was the run cut short?")
    per_rank = [programs for programs, _ in found]
    # paired by name: a rank that counted its iterations differently pairs none wrongly
    names = sorted(set.intersection(*(set(a) for _, a in found)), key=lambda n: int(n.split()[1]))
    aligned = tuple(tuple(a[n] for _, a in found) for n in names)
    count = min(len(p) for p in per_rank)
    if count == 0:
        raise UsageError(f"{source}: the trace holds no measured iteration (raise --steps above --warmup)")
    iterations = tuple(tuple(p[i] for p in per_rank) for i in range(count))
    # the slowest rank's median, as the tables' "ms/iteration (slowest rank)": one step everywhere
    slowest = max(statistics.median(p[i].wall_ms for i in range(count)) for p in per_rank)
    return Measured(source=source, strategy=strategy, backend=backend, world_size=len(order), hosts=tuple(hosts),
                    global_batch=global_batch, iterations=iterations, measured_wall_ms=slowest,
                    aligned=aligned)


def _rank_programs(events: list[dict], rank: int, world_size: int, source: str,
                   known: dict) -> tuple[list[Program], dict[str, Program]]:
    """This rank's program of each measured iteration, and of each aligned one by its name."""
    threads = {e["tid"]: e["args"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    training = next((t for t, a in threads.items() if a["name"] == "training"), None)
    spans = sorted((e for e in events if e.get("ph") == "X" and e.get("tid") == training), key=lambda e: e["ts"])
    measured = next((e for e in spans if e["name"] == "measured" and e.get("cat") == "iteration"), None)
    iterations = [e for e in spans if e.get("cat") == "iteration" and e["name"] != "measured"
                  and (measured is None or e["ts"] >= measured["ts"]) and not e["name"].endswith(ALIGNED)]
    ops = _ops(events, threads, rank, world_size, source, known)
    blocking = [e for e in spans if e.get("cat") in ("comm", "bubble", "wait")]
    aligned = [e for e in spans if e.get("cat") == "iteration" and e["name"].endswith(ALIGNED)]

    # both in start order: an iteration's ops and blocking spans are a slice of each, found by bisection (a
    # scan of every op per iteration made a 1,500-step job's replay take longer than the job)
    op_starts, blocking_starts = [start for start, _, _ in ops], [e["ts"] for e in blocking]

    def program(it: dict) -> Program:
        t0, t1 = it["ts"], it["ts"] + it["dur"]
        mine = ops[bisect_left(op_starts, t0):bisect_right(op_starts, t1)]
        waits = blocking[bisect_left(blocking_starts, t0):bisect_right(blocking_starts, t1)]
        return _program(rank, t0, t1, mine, waits)

    return [program(it) for it in iterations], {it["name"]: program(it) for it in aligned}


def _ops(events, threads, rank, world_size, source, known: dict) -> list[tuple[float, float, Op]]:
    """Every op of this rank (µs start, µs end, Op), keyed to match across ranks, in issue order; `known`: the
    groups' Members so far (measurement.members_of)."""
    world = known.setdefault("world", Members(range(world_size)))
    raw = []
    for e in events:
        args = threads.get(e.get("tid")) or {}
        threaded = args.get("name", "").startswith(("comm (", "stream: comm ("))
        if e.get("ph") != "X" or e.get("cat") != "comm" or not threaded:
            continue
        label = args["name"].split("(", 1)[1].rstrip(")")
        members = members_of(args, known) or (world if e["args"]["group_size"] == world_size else ())
        if not members:
            raise UsageError(f"{source}: group {label!r} has no member list (a trace of an older commprof): "
                             "trace the run again")
        name = e["name"].rsplit(" (", 1)[0]
        raw.append((e["ts"], e["ts"] + e["dur"], name, label, members, e["args"]["bytes"]))
    raw.sort()
    counts: dict[tuple, int] = defaultdict(int)
    out = []
    ids = known.setdefault("ids", {})  # id(shared Members) -> a small number: a key hashes it, not the ranks
    for start, end, name, label, members, nbytes in raw:
        group = ids.setdefault(id(members), len(ids))
        if name in (SENDS, RECVS) and len(members) == 2:
            peer = members[1] if members[0] == rank else members[0]
            src, dst = (rank, peer) if name == SENDS else (peer, rank)
            ident = (label, group, src, dst)
        else:
            ident = (label, group, name)
        key = (*ident, counts[ident])
        counts[ident] += 1
        op = Op(key=key, name=name, label=label, members=members, nbytes=nbytes, measured_ms=(end - start) / 1e3)
        out.append((start, end, op))
    return out


def _waited(w: dict) -> tuple[str, str]:
    """(op name, group label) of a wait span "wait all_reduce (world)"."""
    name, _, label = w["name"][len("wait "):].rpartition(" (")
    return name, label.rstrip(")")


def _program(rank: int, t0: float, t1: float, ops: list, blocking: list[dict]) -> Program:
    """Issue points, block intervals and the busy time between them, in µs from the iteration's start."""
    points = []  # (µs, order, step): at one instant, issue before block
    waits_for: dict[tuple, deque] = defaultdict(deque)  # (name, label) -> issued async ops, oldest first
    used = set()
    for start, end, op in ops:
        points.append((start, 0, ("issue", op)))
        own = next((b for b in blocking if b.get("cat") != "wait" and b["ts"] <= start <= b["ts"] + b["dur"]
                    and end <= b["ts"] + b["dur"] + 1.0 and id(b) not in used), None)
        if own is not None:  # blocking: the thread waits from the issue to the end of the op's range
            used.add(id(own))
            points.append((start, 1, ("block", op, end, own["ts"] + own["dur"])))
        else:
            waits_for[(op.name, op.label)].append((start, end, op))
    waits = [w for w in blocking if w.get("cat") == "wait"]
    last_wait = {_waited(w): i for i, w in enumerate(waits)}
    for i, w in enumerate(waits):
        queue = waits_for.get(_waited(w))
        if not queue or queue[0][0] > w["ts"]:
            continue
        covered = [queue.popleft()]
        if last_wait[_waited(w)] == i:
            # the last wait on these ops covers every one issued before it: a C++ reducer's one wait at the end
            # of backward is on all of DDP's buckets, the last to complete the one it really waited for
            while queue and queue[0][0] <= w["ts"]:
                covered.append(queue.popleft())
        covered.sort(key=lambda c: c[1])
        at, resume = w["ts"], w["ts"] + w["dur"]
        for k, (_, end, op) in enumerate(covered):  # one after another: each blocks until its completion
            stop = resume if k == len(covered) - 1 else max(at, min(end, resume))
            points.append((at, 1, ("block", op, end, stop)))
            at = stop
    points.sort(key=lambda p: (p[0], p[1]))
    blocks = tuple((step[1], at, step[3]) for at, _, step in points if step[0] == "block")
    steps, t = [], t0
    for at, _, step in points:
        if at > t:
            steps.append(("busy", (at - t) / 1e3))
            t = at
        if step[0] == "issue":
            steps.append(step)
            continue
        _, op, end, resume = step
        # after the op completed, the thread took (resume − completion) to go on: kept as is
        steps.append(("wait", op, max(0.0, resume - max(end, t)) / 1e3))
        t = max(t, resume)
    if t1 > t:
        steps.append(("busy", (t1 - t) / 1e3))
    return Program(rank=rank, wall_ms=(t1 - t0) / 1e3, steps=tuple(steps), start_us=t0, spans=tuple(ops),
                   blocks=blocks)
