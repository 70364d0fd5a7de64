"""Where a live job's combined windows go: a Prometheus/OpenMetrics endpoint and an append-only JSON Lines log.

    metrics = Metrics("127.0.0.1", 9464)     # rank 0: http://127.0.0.1:9464/metrics
    log = LiveLog("live.jsonl")
    metrics.add(job); log.write(job)         # each combined window (live/combine.py)
    log.end("complete"); metrics.close()

The endpoint is prometheus_client's, the Prometheus project's own client: its exposition format is the one the
server parses, and a custom collector (`collect`) exports the counts the ranks aggregated themselves without
observing each op again. OpenTelemetry's Prometheus exporter is built on the same client and adds an SDK a
job does not need. Metrics, labels `rank` and `host` on every per-rank series:

  commprof_op_bytes_total{op,group}            payload bytes of every op of every window so far (the volume
                                               table's convention: what the call passes, not what the wire moves)
  commprof_ops_total{op,group}                 ops
  commprof_op_duration_seconds{op,group}       histogram of the ops' issue-to-completion times
  commprof_steps_total                         measured steps folded into windows
  commprof_step_seconds                        the last window's median step
  commprof_busy_seconds                        … its median time not blocked on comm, a step
  commprof_waiting_for_peers_seconds           … blocked beyond the least-blocked rank (peers late), a step
  commprof_transfer_seconds                    … blocked as the least-blocked rank was (the transfer), a step
  commprof_finding_seconds_per_step{kind,subject,rank}   each finding of the last window (subject: "rank 1" or
                                               an op; rank: the rank it names as a number, "" for an op's); in a
                                               job of several hosts, rank 0's endpoint serves the job's findings
                                               and every host's first local rank its own ranks' series
  commprof_finding_since_step{kind,subject,rank}   the step since which it has held
  commprof_finding_seconds_total{kind,subject,rank}  what it cost the steps of every window it held in, added
  commprof_build_info{version,command,workload,backend,world_size}   1 (no rank label)
  commprof_window_last_step                    the last step of the last window (no rank label)
  commprof_others_cores{host}                  cores other processes used on rank 0's host in the last window

The scrape targets of a job of several hosts (--metrics-targets FILE): Prometheus' file_sd JSON, one target a
host, labelled with it (`write_targets`).

The log: one JSON object per line, each a combined window with its fields named (report/live_line.py: ops
as records, maps keyed by rank as lists, for pandas), written whole with one write; a last line
{"end": reason} when the job ends. Once it passes MAX_LOG_BYTES it moves to FILE.1 (replacing the one
before) and FILE begins anew: a job of any length keeps at most twice that. `commprof report FILE` reads
both back. Exercised by: `pytest tests/unit/test_live.py tests/test_live_jobs.py`.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import sys
import threading
import time

from commprof import __version__
from commprof.live.window import DURATION_BUCKETS_S, split_key
from commprof.report.live_line import to_line
from commprof.report.live_log import subject

MAX_LOG_BYTES = 64 << 20
"""Size at which the live log moves to FILE.1: at a window a few seconds long and a few KiB a line, days."""


class Metrics:
    """The job's figures so far, served for Prometheus to scrape."""

    def __init__(self, address: str, port: int, about: dict[str, str] | None = None) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self._about = {"version": __version__, **(about or {})}
        """commprof_build_info's labels: the version, and what the job runs (command, workload, backend,
        world_size)."""
        self._lock = threading.Lock()
        self._costs: dict[tuple, float] = {}
        """(kind, subject, rank) -> seconds every served window's findings cost its steps, added."""
        self._totals: dict[tuple, list] = {}
        """(rank, host, op key) -> [count, bytes, seconds, histogram]: every window's, added."""
        self._steps: dict[tuple, int] = {}
        self._last: dict | None = None
        self._job: dict | None = None
        """The window whose findings are served: the last added, or in a job combined host by host the job's
        (rank 0: `found`), none on another host's endpoint."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.server, self._thread = start_http_server(port, addr=address, registry=self.registry)
        self.address, self.port = address, self.server.server_port

    def add(self, job: dict, *, findings: bool = True) -> None:
        """A combined window's figures, rank by rank (its ranks: the job's, or one host's); `findings`: serve
        its findings too."""
        with self._lock:
            if findings:
                self._serve(job)
            for r in job["ranks"]:
                self._steps[(r["rank"], r["host"])] = self._steps.get((r["rank"], r["host"]), 0) + job["steps"]
                for key, (count, nbytes, seconds, hist, _) in r["ops"].items():
                    t = self._totals.setdefault((r["rank"], r["host"], key), [0, 0, 0.0, [0] * len(hist)])
                    t[0], t[1], t[2] = t[0] + count, t[1] + nbytes, t[2] + seconds
                    t[3] = [a + b for a, b in zip(t[3], hist)]
            self._last = job

    def found(self, job: dict) -> None:
        """The job's window, combined from its hosts' parts: its findings served here."""
        with self._lock:
            self._serve(job)

    def _serve(self, job: dict) -> None:
        """Serve `job`'s findings and add what each cost its window's steps (under the lock): a finding that
        held for one window between two scrapes still shows in the counter's increase."""
        self._job = job
        for f in job["findings"]:
            key = finding_labels(f)
            self._costs[key] = self._costs.get(key, 0.0) + f["ms_per_step"] / 1e3 * job["steps"]

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        with self._lock:
            totals, steps, last, job = dict(self._totals), dict(self._steps), self._last, self._job
            costs = dict(self._costs)
        info = GaugeMetricFamily("commprof_build_info", "commprof's version and what the job runs",
                                 labels=list(self._about))
        info.add_metric(list(self._about.values()), 1)
        yield info
        labels = ["op", "group", "rank", "host"]
        nbytes = CounterMetricFamily("commprof_op_bytes", "Payload bytes of the job's ops", labels=labels)
        count = CounterMetricFamily("commprof_ops", "Ops the job issued", labels=labels)
        took = HistogramMetricFamily("commprof_op_duration_seconds", "Issue to completion of each op", labels=labels)
        series: dict[tuple, list] = {}  # the size buckets of an op added: the labels are op, group, rank, host
        for (rank, host, key), (n, b, seconds, hist) in totals.items():
            name, group, _ = split_key(key)
            t = series.setdefault((name, group, str(rank), host), [0, 0, 0.0, [0] * len(hist)])
            t[0], t[1], t[2], t[3] = t[0] + n, t[1] + b, t[2] + seconds, [x + y for x, y in zip(t[3], hist)]
        for values, (n, b, seconds, hist) in sorted(series.items()):
            values = list(values)
            nbytes.add_metric(values, b)
            count.add_metric(values, n)
            cumulative, buckets = 0, []
            for bound, k in zip((*(repr(x) for x in DURATION_BUCKETS_S), "+Inf"), hist):
                cumulative += k
                buckets.append((bound, cumulative))
            took.add_metric(values, buckets, seconds)
        yield from (nbytes, count, took)
        stepped = CounterMetricFamily("commprof_steps", "Measured steps folded into windows", labels=["rank", "host"])
        for (rank, host), n in sorted(steps.items()):
            stepped.add_metric([str(rank), host], n)
        yield stepped
        if last is None:
            return
        for field, name, what in (("step_ms", "step", "Median step of the last window"),
                                  ("busy_ms", "busy", "Time not blocked on comm a step, last window"),
                                  ("waiting_ms", "waiting_for_peers", "Blocked while peers were late, a step"),
                                  ("transfer_ms", "transfer", "Blocked for the transfer itself, a step")):
            g = GaugeMetricFamily(f"commprof_{name}_seconds", what, labels=["rank", "host"])
            for r in last["ranks"]:
                g.add_metric([str(r["rank"]), r["host"]], r[field] / 1e3)
            yield g
        if job is None:
            yield GaugeMetricFamily("commprof_window_last_step", "Last step of the last window",
                                    value=last["last_step"])
            return
        labels = ["kind", "subject", "rank"]
        cost = GaugeMetricFamily("commprof_finding_seconds_per_step", "What each finding of the last window costs "
                                 "a step", labels=labels)
        since = GaugeMetricFamily("commprof_finding_since_step", "The step since which the finding holds",
                                  labels=labels)
        for f in job["findings"]:
            values = list(finding_labels(f))
            cost.add_metric(values, f["ms_per_step"] / 1e3)
            since.add_metric(values, f.get("since_step", job["first_step"]))
        total = CounterMetricFamily("commprof_finding_seconds", "What each finding has cost the steps of the "
                                    "windows it held in, added", labels=labels)
        for values, seconds in sorted(costs.items()):
            total.add_metric(list(values), seconds)
        yield from (cost, since, total)
        yield GaugeMetricFamily("commprof_window_last_step", "Last step of the last window", value=job["last_step"])
        if job.get("contention"):
            g = GaugeMetricFamily("commprof_others_cores", "Cores other processes used on rank 0's host, last window",
                                  labels=["host"])
            g.add_metric([job["contention"]["host"]], job["contention"]["others_cores"])
            yield g

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class LiveLog:
    """The append-only JSON Lines file of combined windows. One that cannot be written — a full disk, a
    device that refuses, a FIFO with no reader — is said once and left: the job goes on, and a line cut by
    a full disk is taken back, so the file holds whole lines only."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        try:
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            self._fd = self._open()
        except OSError as exc:
            self._fail(exc)

    def _open(self) -> int:
        # non-blocking to open: a FIFO with no reader fails at once (ENXIO) instead of holding rank 0
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
        os.set_blocking(fd, True)
        return fd

    def write(self, doc: dict) -> None:
        if self._fd is None:
            return
        line = (json.dumps(doc if "end" in doc else to_line(doc), separators=(",", ":")) + "\n").encode()
        size = None
        try:
            st = os.fstat(self._fd)
            if stat.S_ISREG(st.st_mode):
                size = st.st_size
                if size + len(line) > MAX_LOG_BYTES:
                    os.close(self._fd)
                    self._fd = None
                    os.replace(self.path, self.path + ".1")
                    self._fd, size = self._open(), 0
            # one write: a reader, or a job killed now, sees whole lines only
            if os.write(self._fd, line) != len(line):
                raise OSError(errno.ENOSPC, "the line was cut short (a full disk?)")
        except OSError as exc:
            if size is not None and self._fd is not None:
                try:
                    os.ftruncate(self._fd, size)  # the cut line taken back
                except OSError:
                    pass
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        why = "a FIFO with no reader" if exc.errno == errno.ENXIO else exc.strerror or str(exc)
        sys.stderr.write(f"commprof: live: cannot write --live-log {self.path} ({why}): the job goes on, "
                         "its windows no longer logged\n")
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = None

    def end(self, reason: str) -> None:
        self.write({"end": reason, "time": time.time()})
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def finding_labels(f: dict) -> tuple[str, str, str]:
    """A finding's labels: its kind, what it names, and the rank it names as a number ("" for an op's): the
    per-rank series join it `on(rank)`."""
    return f["kind"], subject(f), str(f["rank"]) if "rank" in f else ""


def reachable(toward: str) -> str:
    """This host's address on the way to `toward` (the store's host): where a peer host reaches it."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((toward, 9))  # no packet is sent: the kernel only picks the route
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()


def write_targets(path: str, endpoints: list[dict]) -> None:
    """Prometheus' file_sd JSON: every host's endpoint, labelled with its host (rewritten whole: Prometheus
    reads the file again when it changes)."""
    from commprof.base.files import write_atomic

    write_atomic(path, json.dumps([{"targets": [e["target"]], "labels": {"host": e["host"], "job": "commprof"}}
                                   for e in endpoints], indent=1) + "\n", sync=False)
