"""commprof's own rank-0 paths at N = 8 … 16,384 simulated ranks, in one process: what each costs in time,
peak memory and bytes, and how it grows (the exponent of a power law fitted from 1,024 ranks up).

The world is made from a recorded 2-rank job (tests/recorded/slowed: DDP, rank 1 sleeping 20 ms before every
backward): every rank but the last steps as the recorded rank 0 did, the last as the slowed rank 1, each rank's
figures with ±JITTER of scheduling noise of its own. Every path runs commprof's real code on that world:

  live_combine    live/combine.py `combine`: one window of --window steps of every rank, into the job's window
                  and its findings (the windows folded by live/window.py's Fold from the recorded iterations)
  live_hosts      live/hosts.py: the same window combined host by host (PER_HOST ranks a host): each host's
                  part folded by its first local rank (`summarize`), rank 0 reading every host's part from the
                  store and combining them (`combine_hosts`): the figure; bytes: the parts rank 0 reads
  live_collect    comm/failure/control.py `ControlPlane.windows`: rank 0 reading every rank's posted window from a
                  real TCPStore served in this process (the ranks' posts made beforehand by client threads);
                  the store's keys left after it (none: what was read is gone)
  scrape          live/export.py `Metrics`: one HTTP scrape of the endpoint after one combined window
  host_scrape     the same in a job of several hosts: rank 0's endpoint serves its own host's ranks and the
                  job's findings; every host's endpoint its own ranks
  states          comm/failure/control.py `ControlPlane.states`: every rank's flight-recorder snapshot
                  (comm/failure/flight.py's shape, the world group's member list in it) read back from the
                  store on a failure; the resident growth of this process, the store's server, as they were
                  posted
  listen          comm/failure/watchdog.py's listeners: LISTENERS ranks spread over the world, each a real Watchdog over
                  a TCPStore client of its own, for 4 of their intervals; the store calls each made in the last
                  3, counted on the way to the store: the job's calls a second (`calls_per_s`, the figure
                  fitted) are their mean rate times the world size; `seconds`: the time measured
  findings        record/merge.py and findings/kinds.py: a traced job's end on rank 0 — the merged trace.json
                  written from every rank's file (of 64 ranks at most), the findings read from those files —
                  in a process of its own, whose peak RSS is the figure; --iterations measured iterations

Memory is the growth of this process's resident set while the path ran (sampled every 10 ms), but for
`findings`, whose figure is its own process's peak.

Each path checks what it produced: the slowed rank named a straggler with its cost within 15 % of what the
same path gives the 2-rank job, every rank's window read back. A path whose last size took longer than
--budget seconds is not run at larger sizes (its row says so): it is extrapolated by its fit, never guessed.

    python benchmarks/scale.py [--quick] [--sizes 8,256,1024,...] [--paths live_combine,...] [--budget 60]
                               [--iterations 11] [--fit-from 1024]

Results: benchmarks/README.md, benchmarks/results/scale-results.json.
"""

from __future__ import annotations

import copy
import gc
import json
import math
import random
import resource
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from common import ROOT, parse, parser

SIZES = (8, 256, 1024, 2048, 4096, 8192, 16384)
QUICK = {"sizes": "8,64", "budget": 10.0, "fit_from": 8}
JITTER = 0.02
"""Each rank's busy and blocked time per step drawn within ±2 % of the recorded rank's."""
PER_HOST = 8
"""Ranks per simulated host (an 8-GPU node)."""
RECORDED = ROOT / "tests" / "recorded" / "slowed" / "trace"
WINDOW = 20
POSTERS = 16
"""Client threads posting the simulated ranks' keys (a client per rank would be 16,384 sockets)."""
TOLERANCE = 0.15
LISTENERS = 32
"""Ranks whose watchdog listens for real in the `listen` path."""


# ---- the world ----------------------------------------------------------------------------------------
def recorded_windows(window: int) -> tuple[dict, dict]:
    """The recorded job's two ranks' windows (fast, slowed), each folded by live/window.py's Fold from the
    trace's measured iterations: its iterations' figures, its ops and its waits, repeated to `window` steps."""
    from commprof.findings.arrivals import analyze
    from commprof.live.window import Fold
    from commprof.perfmodel.timeline import load

    m = load(str(RECORDED))
    a = analyze(m)
    out = []
    for rank in (0, 1):
        fold = Fold(rank=rank, host="h", window=window)
        got = None
        for i in range(window):
            it = m.iterations[i % len(m.iterations)]
            split = a.per_iteration[i % len(m.iterations)][rank]
            p = it[rank]
            ops = [(op.name, op.nbytes, len(op.members), int(s * 1e3), int(e * 1e3), True, op.label)
                   for s, e, op in p.spans]
            waits = [(op.name, int(b0 * 1e3), int(b1 * 1e3)) for op, b0, b1 in p.blocks]
            figures = {"step": i, "wall_ms": split.wall_ms, "exposed_comm_ms": split.blocked_ms, "bubble_ms": 0.0}
            got = fold.add(figures, ops, waits) or got
        out.append(got)
    return out[0], out[1]


def windows(n: int, fast: dict, slow: dict, seed: int = 0) -> list[dict]:
    """n ranks' windows: rank n-1 the slowed rank's, the others the fast rank's, each step's busy and blocked
    time jittered."""
    rnd = random.Random(seed)
    out = []
    for rank in range(n):
        w = copy.deepcopy(slow if rank == n - 1 else fast)
        w["rank"], w["host"] = rank, f"node{rank // PER_HOST}"
        w["busy_by_step_ms"] = [b * rnd.uniform(1 - JITTER, 1 + JITTER) for b in w["busy_by_step_ms"]]
        w["blocked_by_step_ms"] = [b * rnd.uniform(1 - JITTER, 1 + JITTER) for b in w["blocked_by_step_ms"]]
        for agg in w["ops"].values():
            agg[4] = n  # the world group's size
        out.append(w)
    return out


def straggler(job: dict) -> dict | None:
    return next((f for f in job["findings"] if f["kind"] == "straggler"), None)


# ---- the paths ----------------------------------------------------------------------------------------
def live_combine(n: int, ctx: dict) -> dict:
    from commprof.live.combine import combine

    ws = windows(n, ctx["fast"], ctx["slow"])
    took, peak, job = measure(lambda: combine(ws))
    return {"seconds": took, "peak_bytes": peak, "bytes": len(json.dumps(job)), "straggler": named(straggler(job))}


def live_hosts(n: int, ctx: dict) -> dict:
    """live/hosts.py: each host's first local rank folds its ranks' windows into a part (`summarize`, timed on
    the host holding the slowed rank), rank 0 combines the hosts' parts (`combine_hosts`, the figure)."""
    from commprof.live.hosts import combine_hosts, summarize

    by_host: dict[str, list] = {}
    for w in windows(n, ctx["fast"], ctx["slow"]):
        by_host.setdefault(w["host"], []).append(w)
    host_s, _, _ = measure(lambda: summarize(by_host[f"node{(n - 1) // PER_HOST}"]))
    parts = [summarize(ws) for ws in by_host.values()]
    plane, store, clients = serve(n)
    post(clients, [(lambda c, p=p: _post_window(c, n, {**p, "rank": p["first"]})) for p in parts])

    def rank0():  # what rank 0's live thread does a window: read every host's part, combine them
        got = plane.windows(0, len(parts))
        return got, combine_hosts(got)

    took, peak, (got, job) = measure(rank0)
    return {"seconds": took, "peak_bytes": peak, "combine_seconds": measure(lambda: combine_hosts(parts))[0],
            "host_seconds": host_s, "hosts": len(parts), "bytes": sum(len(json.dumps(p)) for p in parts),
            "straggler": named(straggler(job)), **({} if len(got) == len(parts) else {"check": "parts lost"})}


def live_collect(n: int, ctx: dict) -> dict:
    plane, store, clients = serve(n)
    ws = windows(n, ctx["fast"], ctx["slow"])
    post(clients, [(lambda c, w=w: _post_window(c, n, w)) for w in ws])
    took, peak, got = measure(lambda: plane.windows(0, n))
    left = store.num_keys()
    return {"seconds": took, "peak_bytes": peak, "bytes": sum(len(json.dumps(w)) for w in got),
            "store_keys_after": left, "check": "ok" if len(got) == n and {w["rank"] for w in got} == set(range(n))
            else f"read {len(got)} of {n}"}


def _post_window(store, n: int, w: dict) -> None:
    from commprof.comm.failure.control import ControlPlane

    ControlPlane(store, rank=w["rank"], world_size=n).post_window(0, w)


def scrape(n: int, ctx: dict) -> dict:
    from commprof.live.combine import combine
    from commprof.live.export import Metrics

    metrics = Metrics("127.0.0.1", 0)
    try:
        metrics.add(combine(windows(n, ctx["fast"], ctx["slow"])))
        url = f"http://127.0.0.1:{metrics.port}/metrics"
        took, peak, body = measure(lambda: urllib.request.urlopen(url, timeout=600).read())
    finally:
        metrics.close()
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    return {"seconds": took, "peak_bytes": peak, "bytes": len(body), "series": series, "check": "ok"}


def host_scrape(n: int, ctx: dict) -> dict:
    """A job of several hosts (PER_HOST ranks a host): one HTTP scrape of rank 0's endpoint, which serves its
    own host's ranks and the job's findings (combined from every host's part) — each host's endpoint serves
    its own ranks alike."""
    from commprof.live.combine import combine
    from commprof.live.export import Metrics
    from commprof.live.hosts import combine_hosts, summarize

    by_host: dict[str, list] = {}
    for w in windows(n, ctx["fast"], ctx["slow"]):
        by_host.setdefault(w["host"], []).append(w)
    metrics = Metrics("127.0.0.1", 0)
    try:
        metrics.add(combine(by_host["node0"]), findings=False)
        metrics.found(combine_hosts([summarize(ws) for ws in by_host.values()]))
        url = f"http://127.0.0.1:{metrics.port}/metrics"
        took, peak, body = measure(lambda: urllib.request.urlopen(url, timeout=600).read())
    finally:
        metrics.close()
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    named_slow = f'subject="rank {n - 1}"' in body.decode() and 'kind="straggler"' in body.decode()
    return {"seconds": took, "peak_bytes": peak, "bytes": len(body), "series": series,
            "check": "ok" if named_slow else "the job's straggler is not on rank 0's endpoint"}


def states(n: int, ctx: dict) -> dict:
    from commprof.comm.failure import flight
    from commprof.comm.failure.control import ControlPlane

    plane, store, clients = serve(n)
    snap = {"rank": 0, "reason": "answering rank 0", "busy": "all_reduce (world)",
            "groups": {"world": list(range(n))}, "seqs": {"world": 40},
            "ring": [["world", s, "all_reduce", 1597480, "float32"] for s in range(40 - 32, 41)]}

    def post_state(client, rank):
        ControlPlane(client, rank=rank, world_size=n).post_state({**snap, "rank": rank})

    rss0 = rss()
    post(clients, [(lambda c, r=r: post_state(c, r)) for r in range(n)])
    grown = max(0, rss() - rss0)
    def claimant():  # what the claimant does with them (comm/failure/watchdog.py): read, and look for a desync
        got = plane.states(within_s=0.0)
        return got, flight.first_divergence(got)

    took, peak, (got, desync) = measure(claimant)
    whole = len(got) == n and all(got[r]["groups"]["world"] == [[0, n - 1]] for r in (0, n - 1))
    return {"seconds": took, "peak_bytes": peak, "store_growth_bytes": grown,
            "check": "ok" if whole and desync is None else f"read {len(got)} of {n}, desync {desync}"}


class Counted:
    """A store client whose calls are counted."""

    def __init__(self, store) -> None:
        self.store, self.calls = store, 0

    def __getattr__(self, name: str):
        value = getattr(self.store, name)
        if not callable(value):
            return value

        def call(*args):
            self.calls += 1
            return value(*args)

        return call


def listen(n: int, ctx: dict) -> dict:
    import types

    import torch.distributed as dist

    from commprof.comm.failure.control import ControlPlane
    from commprof.comm.failure.watchdog import LISTEN_RATE, Watchdog, listen_s

    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    ranks = sorted({r * n // LISTENERS for r in range(LISTENERS)})
    clients = [Counted(dist.TCPStore("127.0.0.1", store.port, 1, False)) for _ in ranks]
    dogs = [Watchdog(types.SimpleNamespace(control=ControlPlane(c, rank=r, world_size=n),
                                           recorder=types.SimpleNamespace(comms=[])), timeout_s=60.0, rank=r)
            for r, c in zip(ranks, clients)]
    every = listen_s(n, 0.2)
    for dog in dogs:
        dog.__enter__()
    time.sleep(every)  # each rank's first check is within its first interval
    start, before = time.perf_counter(), sum(c.calls for c in clients)
    time.sleep(3 * every)
    took, calls = time.perf_counter() - start, sum(c.calls for c in clients) - before
    for dog in dogs:
        dog._stop.set()
        dog._join()
    rate = calls / len(ranks) / took * n
    bound = max(n / 0.2, LISTEN_RATE) * 1.25
    return {"seconds": took, "peak_bytes": 0, "calls_per_s": rate, "interval_s": every,
            "check": "ok" if 0 < rate <= bound else f"{rate:.0f} calls/s, over {bound:.0f}"}


def rank_events(n: int, iterations: int, seed: int = 0) -> list[list[dict]]:
    """n ranks' trace events: rank n-1 the recorded slowed rank's file, the others the recorded rank 0's, each
    span's duration jittered (issue times kept: the ranks met as recorded), the measured iterations repeated
    to `iterations` one after another, each rank's own pid, rank, host and world group."""
    from commprof.base.measurement import member_args
    from commprof.record.merge import load

    rnd = random.Random(seed)
    recorded = [load(RECORDED / f"rank{r}.trace.json") for r in (0, 1)]
    out = []
    for rank in range(n):
        src = recorded[1 if rank == n - 1 else 0]
        measured = next(e for e in src if e.get("name") == "measured")
        its = [e for e in src if e.get("cat") == "iteration" and e["name"] != "measured" and e["ts"] >= measured["ts"]]
        t0, t1 = its[0]["ts"], its[-1]["ts"] + its[-1]["dur"]
        body = [e for e in src if e.get("ph") == "X" and t0 <= e["ts"] <= t1 and e["name"] != "measured"]
        head = [e for e in src if e.get("ph") == "M" or (e.get("ph") == "X" and e["ts"] < t0)]
        events = []
        for e in head:
            e = copy.deepcopy(e)
            if e.get("name") == "clock_sync":
                e["args"].update(rank=rank, world_size=n, host=f"node{rank // PER_HOST}")
            if e.get("name") == "thread_name" and "members" in e["args"]:  # as record/trace.py writes it
                del e["args"]["members"]
                e["args"].update(member_args(range(n)))
            if e.get("name") == "process_name":
                e["args"]["name"] = f"rank {rank} (node{rank // PER_HOST})"
            events.append(e)
        span, k, count = t1 - t0, 0, 0
        while count < iterations:
            shift = k * span
            for e in body:
                if e.get("cat") == "iteration":
                    count += 1
                    if count > iterations:
                        break
                dur = e["dur"] if e.get("cat") == "iteration" else e["dur"] * rnd.uniform(1 - JITTER, 1 + JITTER)
                d = {**e, "ts": round(e["ts"] + shift, 3), "dur": round(dur, 3)}
                if e.get("cat") == "iteration":
                    d["name"] = f"iteration {count}"
                events.append(d)
            k += 1
        end = max(e["ts"] + e.get("dur", 0) for e in events if e.get("ph") == "X")
        events.append({**measured, "ts": t0, "dur": end - t0})
        for e in events:
            e["pid"] = rank + 1
        out.append(events)
    return out


def findings(n: int, ctx: dict) -> dict:
    """A traced job's end on rank 0 (record/trace.py `finish`, then findings/kinds.py `of_trace`): every rank's
    file in the folder (written beforehand, as each rank writes its own), the merged trace.json written from
    them (record/merge.py: a large job's of some ranks only) and the findings read from the ranks' files."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="scale-"))
    try:
        files = []
        for rank, events in enumerate(rank_events(n, ctx["iterations"])):
            files.append(folder / f"rank{rank}.trace.json")
            files[-1].write_text(json.dumps(events, separators=(",", ":")))
        ranks_bytes = sum(f.stat().st_size for f in files)
        # rank 0's end of the job in a process of its own: its peak memory is then the end's, not this world's
        # (VmHWM: ru_maxrss outlives an exec, and would report the parent's)
        code = ("import json, sys, time; from pathlib import Path; "
                "from commprof.findings.kinds import of_trace; from commprof.record.merge import load, write_merged; "
                "f = Path(sys.argv[1]); files = sorted(f.glob('rank*.trace.json'), key=lambda p: int(p.name[4:-11])); "
                "t0 = time.perf_counter(); path = write_merged(f, [lambda p=p: load(p) for p in files], None); "
                "t1 = time.perf_counter(); block = of_trace(str(f)); t2 = time.perf_counter(); "
                "print(json.dumps({'merge_seconds': t1 - t0, 'findings_seconds': t2 - t1, 'block': block, "
                "'rss': next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM'))"
                "}))")
        proc = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True)
        if proc.returncode:
            return {"seconds": 0.0, "peak_bytes": 0, "check": proc.stderr.strip().splitlines()[-1]}
        got = json.loads(proc.stdout.splitlines()[-1])
        block, path = got["block"], folder / "trace.json"
        took = got["merge_seconds"] + got["findings_seconds"]
        if block.get("items") is None:
            return {"seconds": took, "peak_bytes": got["rss"], "check": block["why"]}
        found = next((f for f in block["items"] if f["kind"] == "straggler"), None)
        held = (json.loads(path.read_text())["otherData"].get("held") or {}).get("ranks")
        if held is not None and found is not None and found["rank"] not in held:
            return {"seconds": took, "peak_bytes": got["rss"],
                    "check": f"the merged trace leaves out rank {found['rank']}"}
        return {"seconds": took, "peak_bytes": got["rss"], "merge_seconds": got["merge_seconds"],
                "findings_seconds": got["findings_seconds"], "bytes": path.stat().st_size,
                "rank_files_bytes": ranks_bytes, "merged_ranks": n if held is None else len(held),
                "straggler": named(found)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


PATHS = {"live_combine": live_combine, "live_hosts": live_hosts, "live_collect": live_collect, "scrape": scrape,
         "host_scrape": host_scrape, "states": states, "listen": listen, "findings": findings}
FINDS = ("live_combine", "live_hosts", "findings")
"""The paths that name a straggler: each checked against its own 2-rank figure."""
FITTED = {"listen": "calls_per_s"}
"""The figure a path's exponent is fitted to, where it is not its seconds."""


# ---- measuring ----------------------------------------------------------------------------------------
def measure(fn):
    """(seconds, peak growth of this process's resident memory, result) of fn(): the memory sampled every
    10 ms by a thread beside it (tracemalloc would slow the call several-fold and miss C allocations)."""
    gc.collect()
    base, peak, done = rss(), [0], threading.Event()

    def sample():
        while not done.wait(0.01):
            peak[0] = max(peak[0], rss() - base)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    out = fn()
    took = time.perf_counter() - start
    done.set()
    sampler.join()
    return took, max(peak[0], rss() - base), out


def named(found: dict | None) -> list | None:
    return None if found is None else [found["rank"], found["ms_per_step"]]


def check(row: dict, n: int, reference: list | None) -> str:
    """'ok' when the slowed rank is the straggler at a cost within TOLERANCE of the same path's at 2 ranks."""
    if "check" in row:
        return row["check"]
    found = row.get("straggler")
    if found is None:
        return "no straggler found"
    if found[0] != n - 1:
        return f"straggler named rank {found[0]}, not {n - 1}"
    if reference is None or abs(found[1] - reference[1]) > TOLERANCE * reference[1]:
        return f"cost {found[1]:.1f} ms/step, the 2-rank job's {reference}"
    return "ok"


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def serve(n: int):
    """Rank 0's store and control plane, and POSTERS clients of it."""
    import torch.distributed as dist

    from commprof.comm.failure.control import ControlPlane

    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    clients = [dist.TCPStore("127.0.0.1", store.port, 1, False) for _ in range(POSTERS)]
    return ControlPlane(store, rank=0, world_size=n), store, clients


def post(clients: list, calls: list) -> None:
    """Each call(client) made, the calls shared out over the clients' threads."""
    def run(k):
        for call in calls[k::len(clients)]:
            call(clients[k])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def exponent(rows: list[dict], field: str = "seconds", start: int = 1024) -> float | None:
    """The slope of log(field) against log(ranks) from `start` ranks up (least squares); None under 2 points."""
    pts = [(math.log(r["ranks"]), math.log(r[field])) for r in rows if r["ranks"] >= start and r.get(field)]
    if len(pts) < 2:
        return None
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def main() -> int:
    p = parser(__doc__, json="scale-results.json")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--fit-from", type=int, default=1024, help="the least world size the exponent is fitted from")
    p.add_argument("--iterations", type=int, default=11, help="measured iterations of the traced job (findings)")
    p.add_argument("--budget", type=float, default=60.0,
                   help="seconds a path's run may take before its larger sizes are left out")
    args = parse(p, QUICK)
    sizes = [int(s) for s in args.sizes.split(",")]
    fast, slow = recorded_windows(WINDOW)

    ctx = {"fast": fast, "slow": slow, "iterations": args.iterations}
    out = {"iterations": args.iterations, "window": WINDOW, "fit_from": args.fit_from, "paths": {}}
    failed = False
    for name in args.paths.split(","):
        reference = PATHS[name](2, ctx).get("straggler")  # the 2-rank job the world was made from
        rows = []
        for n in sizes:
            if rows and rows[-1]["seconds"] > args.budget:
                rows.append({"ranks": n, "skipped": f"the {rows[-1]['ranks']}-rank run took over {args.budget:g} s"})
                break
            row = {"ranks": n, **PATHS[name](n, ctx)}
            row["check"] = check(row, n, reference) if name in FINDS else row.get("check", "ok")
            rows.append(row)
            failed |= row["check"] != "ok"
            print(f"{name:13} {n:6d} ranks {row['seconds']:9.3f} s  {row['peak_bytes'] / 2**20:8.1f} MiB peak  "
                  f"{row.get('bytes', 0) / 1e6:9.2f} MB  {row['check']}"
                  + (f"  {row['calls_per_s']:.0f} calls/s" if "calls_per_s" in row else ""), flush=True)
        ran = [r for r in rows if "seconds" in r]
        out["paths"][name] = {"rows": rows, "exponent": exponent(ran, FITTED.get(name, "seconds"), args.fit_from),
                              "two_ranks": reference}
        print(f"{name:13} exponent from {args.fit_from:,} ranks: {out['paths'][name]['exponent']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
