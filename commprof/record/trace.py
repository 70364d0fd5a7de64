"""Chrome Trace Event files (`--trace DIR`): one per rank, streamed as the run goes, and one merged file
of every rank. They open in Perfetto (ui.perfetto.dev) and chrome://tracing.

Per rank, DIR/rank<r>.trace.json holds, on one time axis aligned to rank 0's clock, as process r + 1 (Perfetto
treats pid 0 as the kernel's idle process) named "rank r":
  thread "training"      every range commprof pushes to NVTX (record/annotate.py), same names, same
                         nesting, stamps taken inside the NVTX range — one span per NVTX range
  thread "comm (<group>)" every op from issue to completion (async ones stay open while in flight); the
                         thread's metadata names the group's members (global ranks): `commprof predict`
                         matches each op across them
  threads "stream: …"    on CUDA, the same ranges and ops as the device's stream ran them
                         (record/gpu_trace.py); the comm ops are there (and the merged file's flows),
                         not on "comm (…)"
The file is a JSON array, one event per line, that is complete JSON after every write: each flush writes
its events over the closing "]" and a new "]" after them, in one pwrite at the offset where the array's
end stood — as cheap as appending, where rewriting the file (a temporary, then a rename) would cost the
whole file at every flush. A rank killed between writes (SIGKILL, a crash) leaves a file json.load reads;
one killed inside a write's syscall may leave that write cut short, which `load(path)` reads too.
Rank 0 writes DIR/trace.json at the end (record/merge.py: every rank's events, the flow arrows between them,
each rank's counter "bytes in flight", the clock alignment); `merge(DIR)` rebuilds it from the per-rank files
after a killed run.
Exercised by: `pytest tests/unit/test_trace_files.py tests/test_trace.py`.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

from commprof.base.files import OutputError, write_atomic
from commprof.base.measurement import member_args
from commprof.record.annotate import ANNOTATOR
from commprof.record.clock_sync import host_name, sync_clocks
from commprof.record.gpu_trace import StreamSpans
from commprof.record.merge import load, merge, parse, write_merged  # noqa: F401 (trace.load, trace.merge)
from commprof.record.recorder import END, GROUP, GROUP_SIZE, HOST, NAME, NBYTES, START

FLUSH_EVERY = 4096
"""Buffered events that force a write."""
IDLE_WAIT_S = 0.2
"""How long a SIGTERM handler waits for a write in progress on another thread before it defers to its end."""
FLUSH_NS = 200_000_000
"""Otherwise the buffer is written when a range at the top (an iteration, a bench op: inside at most the
`measured` range) ends at least this long after the last write: what a SIGKILL can lose."""
CLOSE = "\n]\n"
"""What closes the array: every write ends with it, and the next one starts where it starts."""


class TraceRecorder:
    """One rank's trace, streamed to `path`. Attach with `start`; `close` ends the file."""

    def __init__(self, path: Path, *, rank: int, world_size: int, clocks: dict) -> None:
        self.path, self.rank, self.pid = Path(path), rank, rank + 1
        mine = clocks["ranks"][rank]
        self._shift = clocks["epoch_ns"] + mine["applied_offset_ns"]  # local ns -> ns since rank 0's epoch
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._end = 0
        """Where the closing CLOSE starts in the file (0: nothing written yet)."""
        self._written = 0
        """Events in the file."""
        self._head: list[str] = []
        """Metadata events waiting for the next write."""
        self._buf: list = []
        self._stack: list[tuple] = []
        self._tid = threading.get_native_id()
        self._threads: dict[tuple, int] = {}
        """(thread name, slot) -> tid."""
        self._ends: dict[str, list[int]] = {}
        """Per comm thread name: when the last span of each of its tracks ends (_track)."""
        self._prefixes: dict = {}
        self._op_heads: dict = {}
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
        pid = self.pid
        self._emit({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                    "args": {"name": f"rank {rank} ({mine['host']})"}})
        self._emit({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": rank}})
        self._emit({"name": "thread_name", "ph": "M", "pid": pid, "tid": self._tid, "args": {"name": "training"}})
        self._emit({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": self._tid, "args": {"sort_index": 0}})
        self._emit({"name": "clock_sync", "ph": "M", "pid": pid, "tid": 0, "args": {**mine, "world_size": world_size}})
        with self._lock:
            self._write([])  # on disk now: a rank killed before its first flush still leaves a loadable file

    def attach_gpu(self, gpu: StreamSpans) -> None:
        self.gpu = gpu
        self._emit({"name": "gpu_clock_sync", "ph": "M", "pid": self.pid, "tid": 0,
                    "args": {"anchor_bound_ns": gpu.bound_ns}})

    # ---- recording (hot path: tuples only, formatted at flush) ------------------------------
    def begin(self, label, t_ns: int) -> None:
        self._stack.append((label, t_ns, None if self.gpu is None else self.gpu.mark()))

    def enter(self, label) -> None:
        """begin() now: the Annotator's push while the trace is the only place ranges go."""
        self._stack.append((label, time.perf_counter_ns(), None if self.gpu is None else self.gpu.mark()))

    def exit(self) -> int:
        """end() now, then the write it made due: the Annotator's pop while the trace is the only place ranges go;
        the stamp it ended the range at."""
        t_ns = time.perf_counter_ns()
        if self.end(t_ns):
            self.flush()
        return t_ns

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

    def end_unfinished(self, t_ns: int | None) -> None:
        """Close the innermost range at `t_ns`, or drop it when None (Annotator.pop_unfinished)."""
        if not self._stack:
            return
        if t_ns is None:
            self._stack.pop()  # a GPU mark taken at its push is left unmatched: nothing reads it
        else:
            self.end(t_ns)  # its GPU twin, if any, still ends at the stream's mark now

    def span(self, label, t0_ns: int, t1_ns: int) -> None:
        """A training-thread span known only once it is over (a wait found after the fact); no GPU twin."""
        self._buf.append(("X", label, t0_ns, t1_ns))

    def op(self, entry: tuple, comm) -> None:
        """One completed op from the Comm op log (any thread: async completions arrive on backend threads)."""
        with self._lock:
            if self.gpu is not None and comm.clock.kind == "cuda" and not entry[HOST]:
                self.gpu.pending.append((("op", entry, comm.members), entry[START], entry[END]))
            else:
                self._buf.append(("op", entry, comm.clock, comm.members))

    # ---- formatting and writing -------------------------------------------------------------
    def _us(self, t_ns: int) -> float:
        return (t_ns - self._shift) / 1e3

    def _emit(self, event: dict) -> None:
        self._head.append(json.dumps(event, separators=(",", ":")))

    def _write(self, events: list[str]) -> None:
        """Put `events` (and the metadata waiting) over the array's end, with the end after them, in one
        write: between writes the file is always a whole JSON array. Called with the lock held."""
        events, self._head = self._head + events, []
        if not events and self._end:
            return
        lead = ("[\n" if not self._end else "") + (",\n" if self._written and events else "")
        data = (lead + ",\n".join(events) + CLOSE).encode()
        done = 0
        try:
            while done < len(data):  # a regular file takes it whole, short of a full disk or a fatal signal
                done += os.pwrite(self._fd, data[done:], self._end + done)
        except OSError as exc:  # the job's one line names the file (a full disk: the private trace's too)
            self._restore()
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self._end += len(data) - len(CLOSE)
        self._written += len(events)

    def _restore(self) -> None:
        """After a write the disk cut short: the file back to the whole array it was (the cut part removed,
        its blocks freed, the array's end written again within them)."""
        try:
            os.ftruncate(self._fd, self._end)
            os.pwrite(self._fd, (CLOSE if self._end else "[]\n").encode(), self._end)
        except OSError:
            pass

    def _thread(self, name: str, members: list[int] | None = None, slot: int = 0) -> int:
        tid = self._threads.get((name, slot))
        if tid is None:
            tid = self._threads[(name, slot)] = 1_000_000 + len(self._threads)
            args = {"name": name} if members is None else {"name": name, **member_args(members)}
            if slot:
                args["slot"] = slot
            self._emit({"name": "thread_name", "ph": "M", "pid": self.pid, "tid": tid, "args": args})
            # a group's tracks side by side, in slot order, whenever each was first needed
            first = self._threads[(name, 0)] if (name, 0) in self._threads else tid
            self._emit({"name": "thread_sort_index", "ph": "M", "pid": self.pid, "tid": tid,
                        "args": {"sort_index": (first - 1_000_000 + 1) * 64 + slot}})
        return tid

    def _track(self, name: str, members: list[int], t0: int, t1: int) -> int:
        """The track of an op span [t0, t1] of thread `name`: its first track whose last span ended by t0, else
        a new one. Ops in flight at once on one group (a DDP bucket issued while the last one runs, FSDP's
        prefetched all_gathers) overlap partly, and viewers drop slices that overlap partly on one track: each
        gets a track of its own, all named `name` (the slot in the thread's args)."""
        ends = self._ends.setdefault(name, [])
        for slot, end in enumerate(ends):
            if end <= t0:
                ends[slot] = t1
                return self._thread(name, members, slot)
        ends.append(t1)
        return self._thread(name, members, len(ends) - 1)

    def flush(self, final: bool = False) -> None:
        """Format what is buffered and add it to the file. Events are written as JSON text built
        from per-name prefixes (json.dumps per event would cost ~4 µs a range; this is ~1 µs)."""
        if self._closed:
            return
        self._flushed = time.perf_counter_ns()
        with self._lock:
            items, self._buf = self._buf, []
            streamed = self.gpu.ready(final) if self.gpu is not None else ()
        out, ops = [], []
        for item in items:
            if item[0] == "X":
                _, label, t0, t1 = item
                head, tail = self._prefix(label)
                out.append(f"{head}{self._us(t0):.3f},\"dur\":{(t1 - t0) / 1e3:.3f}{tail}")
            else:
                ops.append(item)
        for item in sorted(ops, key=lambda item: item[1][START]):  # logged as they complete; seq by issue
            self._op_events(*item[1:], out)
        for what, t0, t1 in streamed:
            if what[0] == "op":
                _, entry, members = what
                tid = self._track(f"stream: comm ({entry[GROUP]})", members, t0, t1)
                self._op_span(entry, tid, self._us(t0), (t1 - t0) / 1e3, out)
            else:
                label = what[1]
                out.append(json.dumps({"name": label.message, "cat": label.category, "ph": "X", "pid": self.pid,
                                       "tid": self._thread("stream: ranges"), "ts": round(self._us(t0), 3),
                                       "dur": round((t1 - t0) / 1e3, 3)}, separators=(",", ":")))
        with self._lock:
            if not self._closed:  # another thread may have closed it meanwhile (a failure's salvage)
                self._write(out)
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
                    f'"pid":{self.pid},"tid":{self._tid},"ts":')
            tail = "}" if label.payload is None else f',"args":{{"bytes":{label.payload}}}}}'
            hit = self._prefixes[label] = (head, tail)
        return hit

    def _op_events(self, entry: tuple, clock, members: list[int], out: list) -> None:
        if clock.kind == "cuda" and not entry[HOST]:
            return  # CUDA-event stamps, with no stream spans to place them on
        tid = self._track(f"comm ({entry[GROUP]})", members, entry[START], entry[END])
        self._op_span(entry, tid, self._us(entry[START]),
                      (entry[END] - entry[START]) / 1e3, out)

    def _op_span(self, entry: tuple, tid: int, ts: float, dur: float, out: list) -> None:
        name, group = entry[NAME], entry[GROUP]
        key = (group, name)
        seq = self._seq[key] = self._seq.get(key, -1) + 1
        # seq: this rank's k-th op of its group and name, by issue (ops in flight across a write, rare, may
        # take another number: the merged file's flows join ops by issue time, record/merge.py)
        head = self._op_heads.get((key, tid))
        if head is None:  # the text before ts, per op name, group and thread: a pipeline's ops are many
            head = self._op_heads[(key, tid)] = (f'{{"name":"{name} ({group})","cat":"comm","ph":"X",'
                                                 f'"pid":{self.pid},"tid":{tid},"ts":')
        out.append(f'{head}{ts:.3f},"dur":{dur:.3f},"args":{{"bytes":{entry[NBYTES]},'
                   f'"group_size":{entry[GROUP_SIZE]},"seq":{seq}}}}}')

    def close(self) -> None:
        """Write what is buffered and a last event saying how many ranges were still open. Safe to call twice."""
        if self._closed:
            return
        self.flush(final=True)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.gpu is not None:
                self._rescale_streams(*self.gpu.rate())
            self._emit({"name": "trace_end", "ph": "M", "pid": self.pid, "tid": 0,
                        "args": {"open_ranges": len(self._stack)}})
            self._write([])
            os.close(self._fd)

    def _rescale_streams(self, rate: float, bound_ns: int) -> None:
        """Place the stream spans by the device clock's measured rate against the host's (gpu_trace.rate):
        the file is rewritten, its stream threads' spans stretched about the anchor. Lock held."""
        events = json.loads(self.path.read_bytes())  # whole between writes (_write)
        streams = {e["tid"] for e in events
                   if e.get("name") == "thread_name" and e["args"]["name"].startswith("stream")}
        anchor = self._us(self.gpu.anchor_ns)
        for e in events:
            if e.get("ph") == "X" and e["tid"] in streams:
                e["ts"], e["dur"] = round(anchor + (e["ts"] - anchor) * rate, 3), round(e["dur"] * rate, 3)
        events.append({"name": "gpu_clock_rate", "ph": "M", "pid": self.pid, "tid": 0,
                       "args": {"drift_ppm": round((rate - 1) * 1e6, 3), "bound_ns": bound_ns}})
        os.ftruncate(self._fd, 0)
        self._end = self._written = 0
        self._write([json.dumps(e, separators=(",", ":")) for e in events])


def start(comm, directory: str | Path) -> TraceRecorder:
    """Align clocks, open this rank's file, attach it to the annotator and close it on SIGTERM.
    `comm` None: one process with nobody to align with."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if comm is None:
        clocks = {"epoch_ns": time.perf_counter_ns(), "ranks": [
            {"rank": 0, "host": host_name(), "measured_offset_ns": 0, "bound_ns": 0, "applied_offset_ns": 0,
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
    directory = Path(directory)
    for rank, text in enumerate(texts):
        # every rank's own file beside the merged one, those of other hosts too: the findings read them one
        # by one, and a merged trace of a large job holds some ranks only
        mine = directory / f"rank{rank}.trace.json"
        if not mine.exists():
            write_atomic(mine, text, sync=False)
    return write_merged(directory, [lambda t=t: parse(t) for t in texts], trace.clocks)
