"""Chrome Trace Event files (`--trace DIR`): one per rank, streamed as the run goes, and one merged file
of every rank. They open in Perfetto (ui.perfetto.dev) and chrome://tracing.

Per rank, DIR/rank<r>.trace.json holds, on one time axis aligned to rank 0's clock:
  thread "training"      every range commprof pushes to NVTX (record/annotate.py), same names, same
                         nesting, stamps taken inside the NVTX range — one span per NVTX range
  thread "comm (<group>)" every op from issue to completion (async ones stay open while in flight); the
                         thread's metadata names the group's members (global ranks): `commprof predict`
                         matches each op across them
  counter "bytes in flight"  the sum of the payloads of this rank's ops in flight
  flows                  arrows joining the same collective (same group, op and sequence number) on
                         every rank, in group-rank order
  threads "stream: …"    on CUDA, the same ranges and ops as the device's stream ran them
                         (record/gpu_trace.py); the comm ops and flows are there, not on "comm (…)"
The file is a JSON array written as events happen — "[", then one event per line followed by "," (the Horovod
timeline's way); a run killed part-way leaves a file the Trace Event format allows (no closing "]"; Chrome's
DevTools panel still refuses it, so `merge` below), and SIGTERM closes it ("]"). `load(path)` reads either.
Rank 0 writes DIR/trace.json at the end (every rank's events plus the clock alignment in "otherData");
`merge(DIR)` rebuilds it from the per-rank files after a killed run. Exercised by: `pytest
tests/test_trace.py`.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import zlib
from pathlib import Path

from commprof.measurement import COLLECTIVES, P2P
from commprof.record.annotate import ANNOTATOR
from commprof.record.gpu_trace import StreamSpans
from commprof.record.recorder import END, GROUP, GROUP_SIZE, HOST, NAME, NBYTES, START

FLOWS = tuple(name for name in COLLECTIVES if name not in P2P)
"""Ops whose spans on every member of their group are joined by flow arrows: the collectives."""
FLUSH_EVERY = 4096
"""Buffered events that force a write."""
IDLE_WAIT_S = 0.2
"""How long a SIGTERM handler waits for a write in progress on another thread before it defers to its end."""
FLUSH_NS = 200_000_000
"""Otherwise the buffer is written when a range at the top (an iteration, a bench op: inside at most the
`measured` range) ends at least this long after the last write: what a SIGKILL can lose."""


def sync_clocks(comm, rounds: int = 16) -> dict:
    """Each rank's clock offset against rank 0 (perf_counter_ns), by round trips over the control plane:
    rank 0 stamps a, broadcasts; rank r stamps b on arrival; rank 0 stamps c once all answered. Rank r's
    b happened between a and c on rank 0's clock, so offset = b − (a + c)/2 with error ≤ (c − a)/2; the
    round with the tightest bound wins. Ranks on rank 0's host share its CLOCK_MONOTONIC: offset 0."""
    best: dict[int, tuple[int, int]] = {}
    for _ in range(rounds):
        comm.control_barrier()
        a = comm.broadcast_object(time.perf_counter_ns() if comm.rank == 0 else None, src=0)
        b = time.perf_counter_ns()
        stamps = comm.gather_object(b, dst=0)
        if stamps is not None:
            c = time.perf_counter_ns()
            for r, b_r in enumerate(stamps):
                bound = (c - a) // 2
                if r not in best or bound < best[r][1]:
                    best[r] = (b_r - (a + c) // 2, bound)
    hosts = comm.gather_object(_host(), dst=0)
    table = None
    if hosts is not None:
        table = {"epoch_ns": a, "ranks": [
            {"rank": r, "host": hosts[r], "measured_offset_ns": best[r][0], "bound_ns": best[r][1],
             "applied_offset_ns": 0 if hosts[r] == hosts[0] else best[r][0],
             "residual_ns": 0 if hosts[r] == hosts[0] else best[r][1]} for r in range(comm.world_size)]}
    return comm.broadcast_object(table, src=0)


def _host() -> str:
    import socket

    return socket.gethostname()


class TraceRecorder:
    """One rank's trace, streamed to `path`. Attach with `start`; `close` ends the file."""

    def __init__(self, path: Path, *, rank: int, world_size: int, clocks: dict) -> None:
        self.path, self.rank = Path(path), rank
        mine = clocks["ranks"][rank]
        self._shift = clocks["epoch_ns"] + mine["applied_offset_ns"]  # local ns -> ns since rank 0's epoch
        self._f = open(self.path, "w", encoding="utf-8")
        self._f.write("[\n")
        self._buf: list[str] = []
        self._stack: list[tuple] = []
        self._tid = threading.get_native_id()
        self._threads: dict[str, int] = {}
        self._prefixes: dict = {}
        self._seq: dict[tuple, int] = {}
        self._lock = threading.Lock()
        """Held while the buffer is swapped or the file written: a SIGTERM handler that finds it held waits for
        `on_idle` (the main thread may be the one it interrupted, mid-write)."""
        self.on_idle = None
        """Called once the current write ends: a SIGTERM that came while the main thread was writing."""
        self._closed = False
        self._flushed = time.perf_counter_ns()
        self.gpu: StreamSpans | None = None
        """The CUDA events of ranges and ops, while the trace runs on a GPU."""
        meta = {"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                "args": {"name": f"rank {rank} ({mine['host']})"}}
        self._emit(meta)
        self._emit({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        self._emit({"name": "thread_name", "ph": "M", "pid": rank, "tid": self._tid, "args": {"name": "training"}})
        self._emit({"name": "clock_sync", "ph": "M", "pid": rank, "tid": 0, "args": {**mine, "world_size": world_size}})
        self._f.flush()  # on disk now: a rank killed before its first flush still leaves a loadable file

    def attach_gpu(self, gpu: StreamSpans) -> None:
        self.gpu = gpu
        self._emit({"name": "gpu_clock_sync", "ph": "M", "pid": self.rank, "tid": 0,
                    "args": {"anchor_bound_ns": gpu.bound_ns}})

    # ---- recording (hot path: tuples only, formatted at flush) ------------------------------
    def begin(self, label, t_ns: int) -> None:
        self._stack.append((label, t_ns, None if self.gpu is None else self.gpu.mark()))

    def end(self, t_ns: int) -> bool:
        """Close the innermost range at `t_ns`; True when the buffer is due to be written, which the caller
        does with flush() once its NVTX range is popped (writing inside it would lengthen that range)."""
        if not self._stack:
            return False  # a range opened before the trace was attached
        label, t0, event = self._stack.pop()
        self._buf.append(("X", label, t0, t_ns))
        if event is not None:
            with self._lock:
                self.gpu.pending.append((("range", label), event, self.gpu.mark()))
        return len(self._buf) >= FLUSH_EVERY or (len(self._stack) <= 1 and t_ns - self._flushed >= FLUSH_NS)

    def op(self, entry: tuple, comm) -> None:
        """One completed op from the Comm op log (any thread: async completions arrive on backend threads)."""
        with self._lock:
            if self.gpu is not None and comm.clock.kind == "cuda" and not entry[HOST]:
                self.gpu.pending.append((("op", entry, comm.rank, comm.members), entry[START], entry[END]))
            else:
                self._buf.append(("op", entry, comm.rank, comm.clock, comm.members))

    # ---- formatting and writing -------------------------------------------------------------
    def _us(self, t_ns: int) -> float:
        return (t_ns - self._shift) / 1e3

    def _emit(self, event: dict) -> None:
        self._f.write(json.dumps(event, separators=(",", ":")) + ",\n")

    def _thread(self, name: str, members: list[int] | None = None) -> int:
        tid = self._threads.get(name)
        if tid is None:
            tid = self._threads[name] = 1_000_000 + len(self._threads)
            args = {"name": name} if members is None else {"name": name, "members": list(members)}
            self._emit({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid, "args": args})
        return tid

    def flush(self, final: bool = False) -> None:
        """Format what is buffered and append it to the file. Events are written as JSON text built
        from per-name prefixes (json.dumps per event would cost ~4 µs a range; this is ~1 µs)."""
        if self._closed:
            return
        self._flushed = time.perf_counter_ns()
        with self._lock:
            items, self._buf = self._buf, []
            streamed = self.gpu.ready(final) if self.gpu is not None else ()
        out, spans = [], []
        for item in items:
            if item[0] == "X":
                _, label, t0, t1 = item
                head, tail = self._prefix(label)
                out.append(f"{head}{self._us(t0):.3f},\"dur\":{(t1 - t0) / 1e3:.3f}{tail}")
            else:
                self._op_events(*item[1:], spans, out)
        for what, t0, t1 in streamed:
            if what[0] == "op":
                _, entry, group_rank, members = what
                tid = self._thread(f"stream: comm ({entry[GROUP]})", members)
                self._op_span(entry, group_rank, tid, self._us(t0), (t1 - t0) / 1e3, spans, out)
            else:
                label = what[1]
                out.append(json.dumps({"name": label.message, "cat": label.category, "ph": "X", "pid": self.rank,
                                       "tid": self._thread("stream: ranges"), "ts": round(self._us(t0), 3),
                                       "dur": round((t1 - t0) / 1e3, 3)}, separators=(",", ":")) + ",\n")
        self._in_flight(spans, out)
        if out:
            with self._lock:
                if not self._closed:  # another thread may have closed it meanwhile (a failure's salvage)
                    self._f.write("".join(out))
                    self._f.flush()
        if self.on_idle is not None and threading.current_thread() is threading.main_thread():
            deferred, self.on_idle = self.on_idle, None
            deferred()

    def idle(self) -> bool:
        """Whether no thread is swapping the buffer or writing (waits a moment for one that is: a backend
        thread's op() is quick; the main thread, interrupted by a signal inside a write, never ends it while
        its handler waits)."""
        if not self._lock.acquire(timeout=IDLE_WAIT_S):
            return False
        self._lock.release()
        return True

    def _prefix(self, label) -> tuple[str, str]:
        """Cached text around ts/dur of a training-thread span."""
        hit = self._prefixes.get(label)
        if hit is None:
            head = (f'{{"name":{json.dumps(label.message)},"cat":"{label.category}","ph":"X",'
                    f'"pid":{self.rank},"tid":{self._tid},"ts":')
            tail = "},\n" if label.payload is None else f',"args":{{"bytes":{label.payload}}}}},\n'
            hit = self._prefixes[label] = (head, tail)
        return hit

    def _op_events(self, entry: tuple, group_rank: int, clock, members: list[int], spans: list,
                   out: list) -> None:
        if clock.kind == "cuda" and not entry[HOST]:
            return  # CUDA-event stamps, with no stream spans to place them on
        self._op_span(entry, group_rank, self._thread(f"comm ({entry[GROUP]})", members), self._us(entry[START]),
                      (entry[END] - entry[START]) / 1e3, spans, out)

    def _op_span(self, entry: tuple, group_rank: int, tid: int, ts: float, dur: float, spans: list,
                  out: list) -> None:
        name, nbytes, size, group = entry[NAME], entry[NBYTES], entry[GROUP_SIZE], entry[GROUP]
        seq = self._seq[(group, name)] = self._seq.get((group, name), -1) + 1
        out.append(f'{{"name":"{name} ({group})","cat":"comm","ph":"X","pid":{self.rank},"tid":{tid},'
                   f'"ts":{ts:.3f},"dur":{dur:.3f},"args":{{"bytes":{nbytes},"group_size":{size},"seq":{seq}}}}},\n')
        if nbytes:
            spans.append((ts, nbytes))
            spans.append((ts + dur, -nbytes))
        if name in FLOWS and size > 1:
            phase = "s" if group_rank == 0 else ("f" if group_rank == size - 1 else "t")
            flow = zlib.crc32(f"{group}|{name}|{seq}".encode())
            # the slice's own category: Chrome's DevTools panel binds a flow only to a slice of the same cat
            out.append(f'{{"name":"{name}","cat":"comm","ph":"{phase}","id":{flow},"pid":{self.rank},'
                       f'"tid":{tid},"ts":{ts:.3f},"bp":"e"}},\n')

    def _in_flight(self, spans: list, out: list) -> None:
        """The counter: payload bytes of this rank's ops in flight, stepping at every issue and completion
        (ops of one flush; every async op has completed by the end of an iteration)."""
        level = 0
        for ts, delta in sorted(spans, key=lambda s: (s[0], s[1] > 0)):
            level += delta
            out.append(f'{{"name":"bytes in flight","ph":"C","pid":{self.rank},"ts":{ts:.3f},'
                       f'"args":{{"bytes":{level}}}}},\n')

    def close(self) -> None:
        """Write what is buffered and end the JSON array. Safe to call twice."""
        if self._closed:
            return
        self.flush(final=True)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._f.write(json.dumps({"name": "trace_end", "ph": "M", "pid": self.rank, "tid": 0,
                                      "args": {"open_ranges": len(self._stack)}}) + "\n]\n")
            self._f.close()


def start(comm, directory: str | Path) -> TraceRecorder:
    """Align clocks, open this rank's file, attach it to the annotator and close it on SIGTERM.
    `comm` None: one process with nobody to align with."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if comm is None:
        clocks = {"epoch_ns": time.perf_counter_ns(), "ranks": [
            {"rank": 0, "host": _host(), "measured_offset_ns": 0, "bound_ns": 0, "applied_offset_ns": 0,
             "residual_ns": 0}]}
        rank, size = 0, 1
    else:
        clocks, rank, size = sync_clocks(comm), comm.rank, comm.world_size
    trace = TraceRecorder(directory / f"rank{rank}.trace.json", rank=rank, world_size=size, clocks=clocks)
    trace.clocks = clocks
    if comm is not None and comm.clock.kind == "cuda":
        trace.attach_gpu(StreamSpans())
    ANNOTATOR.trace = trace
    if threading.current_thread() is threading.main_thread():
        def on_term(signum, frame):
            # a second SIGTERM (a launcher passes the group's on) would run this again inside the first and
            # end the process before the file is closed
            signal.signal(signum, signal.SIG_IGN)
            if not trace.idle():  # interrupted inside a write (an EINTR runs handlers there): it ends first
                trace.on_idle = lambda: on_term(signum, None)
                return
            ANNOTATOR.trace = None
            trace.close()
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

        signal.signal(signal.SIGTERM, on_term)
    return trace


def abandon(trace: TraceRecorder) -> None:
    """A failing rank's trace: detached and closed as it stands, for `merge` to pick up."""
    ANNOTATOR.trace = None
    trace.close()


def finish(comm, trace: TraceRecorder, directory: str | Path) -> Path | None:
    """Detach and close this rank's file; rank 0 writes the merged file (returned there)."""
    ANNOTATOR.trace = None
    trace.close()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    text = trace.path.read_text()
    texts = comm.gather_object(text, dst=0) if comm is not None else [text]
    if texts is None:
        return None
    return write_merged(Path(directory), [_parse(t) for t in texts], trace.clocks)


def load(path: str | Path) -> list[dict]:
    """A per-rank file's events, whether it was closed or cut short."""
    return _parse(Path(path).read_text())


def _parse(text: str) -> list[dict]:
    body = text.rstrip()
    if not body.endswith("]"):
        body = body.rstrip(",") + "\n]"
    return json.loads(body)


def write_merged(directory: Path, per_rank: list[list[dict]], clocks: dict | None) -> Path:
    events = [e for rank in per_rank for e in rank]
    path = directory / "trace.json"
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"producer": "commprof", "clock_sync": clocks}}
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return path


def merge(directory: str | Path) -> Path:
    """Rebuild DIR/trace.json from DIR/rank*.trace.json (e.g. after a killed run)."""
    directory = Path(directory)
    files = sorted(directory.glob("rank*.trace.json"), key=lambda p: int(p.name[4:].split(".")[0]))
    per_rank = [load(p) for p in files if p.stat().st_size]  # a rank killed while opening its file
    clocks = [e["args"] for rank in per_rank for e in rank if e.get("name") == "clock_sync"]
    return write_merged(directory, per_rank, {"ranks": clocks} if clocks else None)
