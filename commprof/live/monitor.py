"""A live job on one rank: each measured iteration folded into this rank's window (live/window.py); every
window posted to rank 0 over the job's control plane (the store beside the rendezvous, never the script's
process group: no rank waits for another for it); on rank 0 a thread of its own combines the windows every
rank has posted (live/combine.py) as soon as they are there, exports them (live/export.py) and says the last
one on the terminal's progress line — the training thread only folds and hands its window over.

    live = Live(cfg.live, rank=0, world_size=2, control=plane, show=say)
    tracker.live = live.add             # after each measured iteration (record/hooks.py)
    live.close("complete")              # the last window, the log's end line, the endpoint gone

What a rank keeps is one window and, on rank 0, the windows still waiting for a rank (a rank behind by more
than MAX_PENDING windows has its oldest combined without it): memory does not grow with the job.
Exercised by: `pytest tests/test_live_jobs.py`.
"""

from __future__ import annotations

import queue
import socket
import sys
import threading
import time

from commprof.comm.control import REPLY_S
from commprof.findings.kinds import THRESHOLD
from commprof.live.combine import Held, combine
from commprof.live.config import LiveConfig
from commprof.live.export import LiveLog, Metrics
from commprof.live.window import Fold
from commprof.report.live_log import subject

MAX_PENDING = 8
"""Windows rank 0 holds for a rank not yet there; past this many, the oldest is combined with what it has."""
CLOSE_S = 3.0
"""How long rank 0 waits at the end for the other ranks' last windows."""
POLL_S = 0.2
"""How often rank 0's thread asks the store for a window a rank has not posted yet (only while one is due)."""
_CLOSE = object()


class Live:
    """This rank's part of a live job."""

    def __init__(self, cfg: LiveConfig, *, rank: int, world_size: int, control=None, elapsed_ns=None,
                 show=None, contention=None, link=None) -> None:
        self.cfg, self.rank, self.world_size, self.control = cfg, rank, world_size, control
        self.link = link
        """The link the ops cross (--link-rate, a perfmodel Fabric): the windows find `link` too; None: not."""
        self.contention = contention
        """rank 0: its host's record/contention.Contention, read once a window (None: not known)."""
        self.fold = Fold(rank=rank, host=socket.gethostname(), window=cfg.window, elapsed_ns=elapsed_ns)
        self.show = show
        """rank 0: called with the live line after each combined window (the terminal's progress line)."""
        self.metrics: Metrics | None = None
        self.log: LiveLog | None = None
        self.held = Held()
        self.pending: dict[int, dict[int, dict]] = {}
        """rank 0: window index -> {rank: window} posted so far."""
        self.laps: dict[int, dict | None] = {}
        """rank 0: window index -> its host's contention over that window's own span, read as rank 0's window
        closed (the windows are combined later, when every rank's is there: a reading taken then would cover
        another span, the more so the later a rank posts)."""
        self.last: dict | None = None
        """rank 0: the last combined window."""
        self.closed = False
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self.thread_s = 0.0
        """rank 0: the CPU time its live thread has used so far (benchmarks/live_cost.py reads it)."""
        if rank != 0:
            return
        if cfg.log:
            self.log = LiveLog(cfg.log)
        if cfg.address is not None:
            try:
                self.metrics = Metrics(cfg.address, cfg.port)
            except OSError as exc:  # the job goes on: its log and its line still say what the endpoint would
                sys.stderr.write(f"commprof: live: cannot listen on {cfg.address}:{cfg.port} "
                                 f"({exc.strerror or exc}): no metrics endpoint\n")
            else:
                sys.stderr.write(f"commprof: live metrics on http://{_host(cfg.address)}:{self.metrics.port}/metrics\n")
        self._thread = threading.Thread(target=self._run, name="commprof-live", daemon=True)
        self._thread.start()

    def add(self, iteration: dict, ops: list, waits: list) -> None:
        """One measured iteration (record/hooks.py calls it)."""
        window = self.fold.add(iteration, ops, waits)
        if window is not None:
            self._post(window)

    def _post(self, window: dict) -> None:
        if self.rank != 0:
            if self.control is not None and not self.control.gone:
                try:
                    self.control.post_window(window["window"], window)
                except Exception:  # rank 0's store gone: the job is ending, the watchdog says why
                    pass
            return
        self._queue.put(window)

    def _run(self) -> None:
        """Rank 0's thread: each window of its own as it comes; the others' as soon as the store has them."""
        while True:
            try:
                item = self._queue.get(timeout=POLL_S if self.pending else None)
            except queue.Empty:
                item = None
            if isinstance(item, tuple) and item[0] is _CLOSE:
                self._collect(within_s=item[1])
                return
            if item is not None:
                if self.contention is not None:
                    self.laps[item["window"]] = self.contention.lap()
                self.pending.setdefault(item["window"], {})[0] = item
            self._collect()
            self.thread_s = time.thread_time()

    def _collect(self, *, within_s: float = 0.0) -> None:
        """Combine, in order, every pending window all ranks have posted. With `within_s` (the end): wait that
        long for the missing, then combine each with what came."""
        deadline = time.monotonic() + within_s
        while self.pending:
            index = min(self.pending)
            have = self.pending[index]
            late = time.monotonic() >= deadline
            give_up = len(self.pending) > MAX_PENDING or (within_s and late)
            if len(have) < self.world_size and self.control is not None and not self.control.gone:
                try:  # every other rank's at once, when all are there (or, giving up, those that are)
                    have.update((w["rank"], w) for w in self.control.windows(
                        index, self.world_size - len(have), now=give_up))
                except Exception:  # rank 0's own store: it answers while this process lives, unless stopped
                    pass
            if len(have) == self.world_size or give_up:
                self._export(combine(list(self.pending.pop(index).values()), link=self.link))
            elif late:
                return
            else:
                time.sleep(0.05)

    def _export(self, job: dict) -> None:
        reading = self.laps.pop(job["window"], None)
        if reading is not None:
            job["contention"] = reading
            if reading["contended"]:  # another process's load can make a rank look slow: the reader is told
                for f in job["findings"]:
                    f["contended"] = True
        self.held.update(job)
        self.last = job
        if self.metrics is not None:
            self.metrics.add(job)
        if self.log is not None:
            self.log.write(job)
        if self.show is not None:
            self.show(line(job))

    def close(self, reason: str = "complete") -> None:
        """The end of the job, or of this rank's part in it (`reason` why): the last window posted; rank 0
        combines what came, ends its log and closes the endpoint."""
        if self.closed:
            return
        self.closed = True
        window = self.fold.flush()
        if window is not None:
            self._post(window)
        if self._thread is None:
            return
        within = CLOSE_S if reason == "complete" else 0.5
        self._queue.put((_CLOSE, within))
        self._thread.join(within + 2 * REPLY_S)
        if self.log is not None:
            self.log.end(reason)
        if self.metrics is not None:
            if self.cfg.linger_s > 0:
                time.sleep(self.cfg.linger_s)
            self.metrics.close()


def line(job: dict) -> str:
    """The terminal's live text for a combined window: its step and its costliest finding, since when."""
    head = f"live: steps {job['first_step']}-{job['last_step']} {job['step_ms']:.1f} ms/step"
    if (job.get("contention") or {}).get("contended"):
        head += f" (contended: others used {job['contention']['others_cores']:.2f} core(s))"
    if not job["findings"]:
        return head + " · no finding above 3 %"
    f = job["findings"][0]
    return (f"{head} · {f['kind']} {subject(f)}".rstrip() + f" +{f['ms_per_step']:.1f} ms/step "
            f"({f['share_of_step']:.0%}) since step {f.get('since_step', job['first_step'])}")


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


KEEP = 1000
"""Measured iterations a live job keeps for its end-of-job tables and --json (the latest): what a days-long job
holds is then what a 1,000-step one does."""


def attach(cfg: LiveConfig, tracker, *, rank: int, world_size: int, control, progress, contention=None,
           link=None) -> Live:
    """A Live fed by `tracker`'s measured iterations (which then keeps the last KEEP), its line on `progress`."""
    clock = tracker.recorder.clock
    live = Live(cfg, rank=rank, world_size=world_size, control=control,
                elapsed_ns=clock.elapsed_ns if clock.kind == "cuda" else None,
                show=progress.say if rank == 0 else None, contention=contention, link=link)
    tracker.live = live.add
    tracker.keep = KEEP
    return live


def findings_block(live: Live | None) -> dict | None:
    """The JSON's findings block of a live job traced by no --trace: its last window's findings."""
    if live is None or live.last is None:
        return None
    job = live.last
    return {"threshold": THRESHOLD, "items": job["findings"], "step_ms": job["step_ms"],
            "scope": f"the last live window, steps {job['first_step']}-{job['last_step']}; a --live job keeps no "
                     "trace unless --trace asks for one"}
