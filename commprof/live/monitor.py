"""A live job on one rank: each measured iteration folded into this rank's window (live/window.py); every
window posted to rank 0 over the job's control plane (the store beside the rendezvous, never the script's
process group: no rank waits for another for it); on rank 0 a thread of its own combines the windows every
rank has posted (live/combine.py) as soon as they are there, exports them (live/export.py) and says the last
one on the terminal's progress line — the training thread only folds and hands its window over.

    live = Live(cfg.live, rank=0, world_size=2, control=plane, show=say)
    tracker.live = live.add             # after each measured iteration (record/hooks.py)
    live.close("complete")              # the last window, the log's end line, the endpoint gone

In a job of several hosts (a local world smaller than the world) each host's first local rank does rank 0's
part for its own ranks — combines their windows, serves their series on its own endpoint — and posts one
bounded part (live/hosts.py) to rank 0, which combines the hosts' parts into the job's window, log, line and
findings, and lists every host's endpoint (--metrics-targets: Prometheus' file_sd).

What a rank keeps is one window and, on a host's first rank, the windows still waiting for a rank (a rank
behind by more than MAX_PENDING windows has its oldest combined without it): memory does not grow with the job.
Exercised by: `pytest tests/test_live_jobs.py tests/test_live_hosts.py`.
"""

from __future__ import annotations

import queue
import socket
import sys
import threading
import time

from commprof.comm.failure.control import REPLY_S
from commprof.findings.kinds import THRESHOLD
from commprof.live.combine import Held, combine
from commprof.live.config import LiveConfig
from commprof.live.export import LiveLog, Metrics, reachable, write_targets
from commprof.live.hosts import combine_hosts, summarize
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
                 show=None, contention=None, link=None, local_rank: int = 0,
                 local_world_size: int | None = None, backend: str = "") -> None:
        self.cfg, self.rank, self.world_size, self.control = cfg, rank, world_size, control
        self.link = link
        """The link the ops cross (--link-rate, a perfmodel Fabric): the windows find `link` too; None: not."""
        self.contention = contention
        """rank 0: its host's record/contention.Contention, read once a window (None: not known)."""
        local = local_world_size or world_size
        several = control is not None and local < world_size and world_size % local == 0
        self.hosts = world_size // local if several else 1
        """The hosts the windows are combined by: 1, rank 0 combines every rank's window; more, each host's first
        local rank combines its own ranks' windows and rank 0 the hosts' parts (live/hosts.py)."""
        self.first = rank - local_rank if self.hosts > 1 else 0
        """The first rank of this rank's host (0 when rank 0 combines every window)."""
        self.size = local if self.hosts > 1 else world_size
        """The ranks whose windows this rank's host's first rank combines."""
        self.fold = Fold(rank=rank, host=socket.gethostname(), window=cfg.window, elapsed_ns=elapsed_ns)
        self.show = show
        """rank 0: called with the live line after each combined window (the terminal's progress line)."""
        self.metrics: Metrics | None = None
        self.log: LiveLog | None = None
        self.held = Held()
        self.pending: dict[int, dict[int, dict]] = {}
        """A host's first rank: window index -> {rank: window} posted so far."""
        self.parts: dict[int, dict[int, dict]] = {}
        """rank 0 of a job of several hosts: window index -> {host's first rank: its part} posted so far."""
        self.laps: dict[int, dict | None] = {}
        """rank 0: window index -> its host's contention over that window's own span, read as rank 0's window
        closed (the windows are combined later, when every rank's is there: a reading taken then would cover
        another span, the more so the later a rank posts)."""
        self.last: dict | None = None
        """rank 0: the last combined window."""
        self.closed = False
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._targets_said = 0
        self.thread_s = 0.0
        """rank 0: the CPU time its live thread has used so far (benchmarks/live_cost.py reads it)."""
        if rank != self.first:
            return
        if cfg.log and rank == 0:
            self.log = LiveLog(cfg.log)
        if cfg.address is not None:
            try:
                self.metrics = Metrics(cfg.address, cfg.port, about={**dict(cfg.about), "backend": backend,
                                                                     "world_size": str(world_size)})
            except OSError as exc:  # the job goes on: its log and its line still say what the endpoint would
                sys.stderr.write(f"commprof: live: cannot listen on {cfg.address}:{cfg.port} "
                                 f"({exc.strerror or exc}): no metrics endpoint\n")
            else:
                where = f"http://{_host(cfg.address)}:{self.metrics.port}/metrics"
                if self.hosts == 1:
                    sys.stderr.write(f"commprof: live metrics on {where}\n")
                else:  # rank 0 lists every host's for Prometheus (--metrics-targets)
                    self._post_endpoint()
        self._thread = threading.Thread(target=self._run, name="commprof-live", daemon=True)
        self._thread.start()

    def add(self, iteration: dict, ops: list, waits: list) -> None:
        """One measured iteration (record/hooks.py calls it)."""
        window = self.fold.add(iteration, ops, waits)
        if window is not None:
            self._post(window)

    def _post(self, window: dict) -> None:
        if self.rank != self.first:
            if self.control is not None and not self.control.gone:
                try:
                    self.control.post_window(window["window"], window, host=self.first if self.hosts > 1 else None)
                except Exception:  # rank 0's store gone: the job is ending, the watchdog says why
                    pass
            return
        self._queue.put(window)

    def _run(self) -> None:
        """A host's first rank's thread: each window of its own as it comes; the others' as soon as the store
        has them."""
        while True:
            try:
                item = self._queue.get(timeout=POLL_S if self.pending or self.parts else None)
            except queue.Empty:
                item = None
            if isinstance(item, tuple) and item[0] is _CLOSE:
                self._collect(within_s=item[1])
                if self.rank == 0 and self.hosts > 1:
                    self._collect_parts(within_s=item[1])
                return
            if item is not None:
                if self.contention is not None and self.rank == 0:
                    self.laps[item["window"]] = self.contention.lap()
                self.pending.setdefault(item["window"], {})[self.rank] = item
            self._collect()
            if self.rank == 0 and self.hosts > 1:
                self._collect_parts()
                self._say_targets()
            self.thread_s = time.thread_time()

    def _collect(self, *, within_s: float = 0.0) -> None:
        """Combine, in order, every pending window all of this host's ranks (or the job's) have posted. With
        `within_s` (the end): wait that long for the missing, then combine each with what came."""
        deadline = time.monotonic() + within_s
        host = self.first if self.hosts > 1 else None
        while self.pending:
            index = min(self.pending)
            have = self.pending[index]
            late = time.monotonic() >= deadline
            give_up = len(self.pending) > MAX_PENDING or (within_s and late)
            if len(have) < self.size and self.control is not None and not self.control.gone:
                try:  # every other rank's at once, when all are there (or, giving up, those that are)
                    have.update((w["rank"], w) for w in self.control.windows(
                        index, self.size - len(have), now=give_up, host=host))
                except Exception:  # rank 0's own store: it answers while this process lives, unless stopped
                    pass
            if len(have) == self.size or give_up:
                self._combined(list(self.pending.pop(index).values()))
            elif late:
                return
            else:
                time.sleep(0.05)

    def _combined(self, windows: list[dict]) -> None:
        """This host's (or the job's) windows of one index, all there or given up on."""
        if self.hosts == 1:
            self._export(combine(windows, link=self.link))
            return
        if self.metrics is not None:  # this host's ranks' series, on this host's endpoint
            self.metrics.add(combine(windows, link=self.link), findings=False)
        part = summarize(windows)
        if self.rank == 0:
            self.parts.setdefault(part["window"], {})[part["first"]] = part
        elif self.control is not None and not self.control.gone:
            try:
                self.control.post_window(part["window"], part)
            except Exception:  # rank 0's store gone: the job is ending
                pass

    def _collect_parts(self, *, within_s: float = 0.0) -> None:
        """rank 0 of a job of several hosts: combine, in order, every window whose hosts' parts are all there."""
        deadline = time.monotonic() + within_s
        while self.parts:
            index = min(self.parts)
            have = self.parts[index]
            late = time.monotonic() >= deadline
            give_up = len(self.parts) > MAX_PENDING or (within_s and late)
            if len(have) < self.hosts and self.control is not None and not self.control.gone:
                try:
                    have.update((p["first"], p) for p in self.control.windows(index, self.hosts - len(have),
                                                                               now=give_up))
                except Exception:
                    pass
            if len(have) == self.hosts or give_up:
                self._export(combine_hosts(list(self.parts.pop(index).values())))
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
            if self.hosts == 1:
                self.metrics.add(job)
            else:
                self.metrics.found(job)
        if self.log is not None:
            self.log.write(job)
        if self.show is not None:
            self.show(lambda width, **loop: line(job, width, **loop))  # fitted to the row (report/progress.py)

    def _post_endpoint(self) -> None:
        """This host's endpoint, for rank 0 to list: where Prometheus reaches it from another host."""
        address = self.cfg.address
        if address in ("0.0.0.0", "::", ""):
            address = reachable(self.control.host) if self.control.host else socket.gethostname()
        try:
            self.control.post_endpoint({"host": socket.gethostname(),
                                        "target": f"{_host(address)}:{self.metrics.port}"})
        except Exception:  # the store gone: the job is ending
            pass

    def _say_targets(self) -> None:
        """rank 0: once more hosts' endpoints are in, the scrape targets written (--metrics-targets) and said."""
        if self.metrics is None or self._targets_said >= self.hosts or self.control is None or self.control.gone:
            return
        try:
            found = self.control.endpoints()
        except Exception:
            return
        if len(found) <= self._targets_said:
            return
        self._targets_said = len(found)
        found = sorted(found, key=lambda e: e["host"])
        if self.cfg.targets:
            write_targets(self.cfg.targets, found)
        if len(found) == self.hosts:
            shown = ", ".join(f"http://{e['target']}/metrics" for e in found[:3])
            more = f" and {len(found) - 3} more" if len(found) > 3 else ""
            where = (f"; Prometheus file_sd targets in {self.cfg.targets}" if self.cfg.targets else
                     "; --metrics-targets FILE writes them for Prometheus' file_sd")
            sys.stderr.write(f"commprof: live metrics on {len(found)} hosts' endpoints, one a host: {shown}{more}"
                             f"{where}\n")

    def close(self, reason: str = "complete") -> None:
        """The end of the job, or of this rank's part in it (`reason` why): the last window posted; a host's
        first rank combines what came, rank 0 ends its log; the endpoint closes."""
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
        self._thread.join((2 if self.hosts > 1 else 1) * within + 2 * REPLY_S)
        if self.log is not None:
            self.log.end(reason)
        if self.metrics is not None:
            if self.cfg.linger_s > 0 and reason == "complete":  # kept up past the job's last gather
                from commprof.comm import at_end

                at_end(self._linger)
            else:
                self.metrics.close()

    def _linger(self) -> None:
        time.sleep(self.cfg.linger_s)
        self.metrics.close()


def line(job: dict, width: int | None = None, *, iteration: int | None = None, total: int | None = None,
         eta_s: float | None = None) -> str:
    """The terminal's live text for a combined window, at most `width` columns (None: all of it): first who or
    what costs the step, how much a step and since which step; then the loop's iteration (of `total`) and the
    time left (`eta_s`); then the rest — the window's steps and step, the finding's share of the step, the
    host's contention. Pieces go from the last of that order until the text fits, each whole or not at all, so
    no number is cut; then the room left takes back, the most needed first, what fits in it. Only a width too
    narrow for the first three shortens them ("rank 1", "since 1200"), and then cuts at a space.

        None: iteration 1240/5000 · ETA 0:00:41 · live: steps 1220-1239 31.2 ms/step · straggler rank 1 +19.9 ms/step
              (64%) since step 1200                                                       (one line, 125 columns)
        120:  iteration 1240/5000 · ETA 0:00:41 · straggler rank 1 +19.9 ms/step (64%) since step 1200
        80:   iteration 1240/5000 · straggler rank 1 +19.9 ms/step (64%) since step 1200

    The live thread says `line(job)` on rank 0's progress line (`_export`, report/progress.py's `say`), where it
    is one column of Rich's row after the loop's own iteration, rate and time columns, and Rich narrows every
    column of a row wider than the terminal: given the terminal's width and the loop's iteration and ETA, this
    makes that whole row.
    """
    pieces = _line_pieces(job, iteration=iteration, total=total, eta_s=eta_s)
    shown = [0] * len(pieces)  # the form each piece is shown in; past its last: left out

    def text() -> str:
        out, last = "", None
        for (group, forms), k in zip(pieces, shown):
            if k < len(forms):
                out += ("" if last is None else " " if group == last else " · ") + forms[k][0]
                last = group
        return out

    if width is None:
        return text()
    taken = []
    while len(text()) > width:
        # the piece whose form is the least needed, the later one of two as needed
        least = max(((forms[k][1], i) for i, ((_, forms), k) in enumerate(zip(pieces, shown))
                     if k < len(forms) and forms[k][1] is not None), default=None)
        if least is None:  # too narrow for the first three: the last of them goes, then the one left is cut
            left = [i for i, ((_, forms), k) in enumerate(zip(pieces, shown)) if k < len(forms)]
            if len(left) == 1:
                return _cut(text(), width)
            shown[left[-1]] = len(pieces[left[-1]][1])
            continue
        shown[least[1]] += 1
        taken.append(least[1])
    for i in reversed(taken):  # the room a longer piece left: back, the most needed first, what fits in it
        shown[i] -= 1
        if len(text()) > width:
            shown[i] += 1
    return text()


LINE_DROP = ("contention", "window", "share", "contended", "eta", "iteration", "kind", "since")
"""What the live line leaves out first, then next, ... at a narrow width (`line`): the rest, then the iteration
and the ETA, then, where even those go, the finding's kind and the word "step"."""


def _line_pieces(job: dict, *, iteration: int | None, total: int | None,
                 eta_s: float | None) -> list[tuple[str, list[tuple[str, int | None]]]]:
    """The live line's pieces in the order shown: (group, [(form, how soon it goes: a higher number sooner;
    None: never), ...]); pieces of one group are joined by a space, groups by " · "."""
    def drop(what: str) -> int:
        return len(LINE_DROP) - LINE_DROP.index(what)

    pieces: list[tuple[str, list[tuple[str, int | None]]]] = []
    if iteration is not None:
        pieces.append(("iteration", [(f"iteration {iteration}" + (f"/{total}" if total else ""), drop("iteration"))]))
    if eta_s is not None:
        left = max(0, round(eta_s))
        pieces.append(("eta", [(f"ETA {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d}", drop("eta"))]))
    pieces.append(("live", [(f"live: steps {job['first_step']}-{job['last_step']} {job['step_ms']:.1f} ms/step",
                             drop("window"))]))
    if (job.get("contention") or {}).get("contended"):
        pieces.append(("live", [(f"(contended: others used {job['contention']['others_cores']:.2f} core(s))",
                                 drop("contention")), ("(contended)", drop("contended"))]))
    if not job["findings"]:
        pieces.append(("finding", [("no finding above 3 %", None)]))
        return pieces
    f = job["findings"][0]
    cost = f" +{f['ms_per_step']:.1f} ms/step"
    who = subject(f) or f["kind"]
    pieces.append(("finding", [(f"{f['kind']} {subject(f)}".rstrip() + cost, drop("kind")), (who + cost, None)]))
    pieces.append(("finding", [(f"({f['share_of_step']:.0%})", drop("share"))]))
    since = f.get("since_step", job["first_step"])
    pieces.append(("finding", [(f"since step {since}", drop("since")), (f"since {since}", None)]))
    return pieces


def _cut(text: str, width: int) -> str:
    """`text` cut to `width` at a space, never inside a number, "…" saying so."""
    if len(text) <= width:
        return text
    at = text.rfind(" ", 0, max(0, width - 1) + 1)
    return (text[:at].rstrip(" ·") if at > 0 else text[:max(0, width - 1)]) + "…"


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


KEEP = 1000
"""Measured iterations a live job keeps for its end-of-job tables and --json (the latest): what a days-long job
holds is then what a 1,000-step one does."""


def start(cfg: LiveConfig, *, clock, progress, rank: int, world_size: int, control, contention=None, link=None,
          local_rank: int = 0, local_world_size: int | None = None, backend: str = "") -> Live:
    """The Live of a job whose iterations `clock` times (CUDA's: each op's time read once its window folds) and
    whose progress line rank 0's says: run's loop and profile's tracker (attach) both start theirs here."""
    return Live(cfg, rank=rank, world_size=world_size, control=control,
                elapsed_ns=clock.elapsed_ns if clock.kind == "cuda" else None,
                show=progress.say if rank == 0 else None, contention=contention, link=link,
                local_rank=local_rank, local_world_size=local_world_size, backend=backend)


def attach(cfg: LiveConfig, tracker, *, rank: int, world_size: int, control, progress, contention=None,
           link=None, local_rank: int = 0, local_world_size: int | None = None, backend: str = "") -> Live:
    """A Live fed by `tracker`'s measured iterations (which then keeps the last KEEP), its line on `progress`."""
    live = start(cfg, clock=tracker.recorder.clock, progress=progress, rank=rank, world_size=world_size,
                 control=control, contention=contention, link=link, local_rank=local_rank,
                 local_world_size=local_world_size, backend=backend)
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
