"""The control plane: a side channel between the ranks of one job that still works when the data plane is
stuck — a torch.distributed TCPStore (rank 0 serves it from a thread of its own), spoken to by the watchdog
thread, never on the measured path (and, in the aligned warm-up iterations, by the training thread over a
client of its own: `meeting`).

On gloo/NCCL it is a second client of the rendezvous store; on MPI rank 0 serves a new one and tells the
others where over MPI, once, at start. Keys (all under `commprof/`):
  failure        the first rank to see a failure claims it (compare-and-set: one winner)
  states         every rank's flight-recorder snapshot, one line each, posted once a failure is claimed
                 (states/n counts them: rank 0 reads them all in one call, whatever the world size)
  live/<i>       the ranks' live window i, one line each (live/<i>/n counts them), read and removed whole;
                 in a job combined host by host, each host's part of it, and live/<i>/host/<r> the windows of
                 the ranks whose host's first rank is r
  live/endpoints each host's live metrics endpoint, one line each
  verdict        the winner's conclusion — exit code and one line — that every rank exits with
  ack/<rank>     a rank has read the verdict (the winner waits for these before it exits)
  go             every rank acked: all exit now, together (the others wait on it, woken by the store)
  done/<rank>    a rank ended well and stopped watching (rank 0 waits for these before the store goes)
  aligned/…      the meetings before each collective of an aligned iteration (record/aligned.py)

Every store call is bounded: a TCPStore call to a host that is stopped (SIGSTOP) or frozen blocks far past
the store's own timeout — its kernel still accepts the bytes, nobody answers. Each call therefore runs on a
thread of its own and is given up after REPLY_S; from then on the plane is `gone` and every call fails at
once, so no deadline of the watchdog ever waits on rank 0. Exercised by: `pytest tests/test_failures.py`.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from datetime import timedelta

from commprof.base.measurement import runs
from commprof.base.stats import gc_paused

PREFIX = "commprof/"
STORE_TIMEOUT_S = 5.0
"""The TCPStore's own timeout (connecting, and the waits it bounds itself)."""
REPLY_S = 2.0
"""A store call unanswered for this long means rank 0 (the store's host) is stopped or gone: a healthy store
answers in well under a millisecond, a busy machine's in tens."""


class Unreachable(Exception):
    """Rank 0's store did not answer within REPLY_S (or an earlier call already found it so)."""


class ControlPlane:
    """Claim, exchange snapshots and agree on a verdict, over a TCPStore client of this rank's own."""

    def __init__(self, store, *, rank: int, world_size: int, host: str | None = None) -> None:
        self._raw = store
        self.host = host
        """The store's address (None: not known, no meeting)."""
        self._meeting: Meeting | None = None
        self.rank = rank
        self.world_size = world_size
        self.gone = False
        """True once a call went unanswered: the store's host is stopped or dead."""
        self._store = _Bounded(self)

    @classmethod
    def connect(cls, *, host: str, port: int, rank: int, world_size: int, serve: bool = False,
                within_s: float = STORE_TIMEOUT_S) -> "ControlPlane":
        """A client of the store at host:port; `serve` (rank 0 on MPI) starts the store first. `within_s`: how
        long connecting may take (the job's --timeout at start-up: a loaded host can hold the store's answer
        to a new client past STORE_TIMEOUT_S); the calls' own bound is STORE_TIMEOUT_S after."""
        from commprof.comm.store import open_store

        store = open_store(host, port, rank=rank, world_size=world_size, timeout_s=max(within_s, STORE_TIMEOUT_S),
                           serve=serve)
        store.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
        return cls(store, rank=rank, world_size=world_size, host=host)

    def meeting(self) -> "Meeting | None":
        """Meetings of ranks over a store client of this rank's own (a wait there must not hold the watchdog's
        calls), made on first use; None when the store's address is not known or it cannot be reached."""
        if self._meeting is None and self.host is not None and not self.gone:
            from commprof.comm.store import open_store

            try:
                self._meeting = Meeting(open_store(self.host, self.port, rank=self.rank, world_size=self.world_size,
                                                   timeout_s=STORE_TIMEOUT_S, serve=False))
            except Exception:
                self.host = None
        return self._meeting

    @property
    def port(self) -> int:
        return self._raw.port

    def claim(self, code: int, message: str) -> bool:
        """True when this rank is the first to claim a failure for the job."""
        mine = json.dumps({"rank": self.rank, "code": code, "message": message})
        return self._store.compare_set(PREFIX + "failure", "", mine).decode() == mine

    def claimed(self) -> dict | None:
        """The claimed failure, if any rank has claimed one."""
        if not self._store.check([PREFIX + "failure"]):
            return None
        return json.loads(self._store.get(PREFIX + "failure"))

    def post_process(self) -> None:
        """This rank's host and pid, for a peer on the same host to end it when it is found stopped."""
        self._store.set(f"{PREFIX}process/{self.rank}", json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))

    def processes(self, ranks: list[int]) -> dict[int, dict]:
        """{rank: {"host", "pid"}} of `ranks` that posted theirs."""
        keys = {r: f"{PREFIX}process/{r}" for r in ranks}
        return {r: json.loads(self._store.get(k)) for r, k in keys.items() if self._store.check([k])}

    def post_state(self, snap: dict) -> None:
        """This rank's flight-recorder snapshot (comm/failure/flight.py), for the claimant to read with every
        other's."""
        self._post(PREFIX + "states", {**snap, "groups": {k: runs(v) for k, v in snap["groups"].items()}})
        # the member lists as runs: comm/failure/flight.py's first_divergence reads them so, and a list per rank of
        # the world's every rank made the claimant's read N^2

    def states(self, *, within_s: float) -> dict[int, dict]:
        """Every rank's posted snapshot, waiting at most `within_s` for the ones not posted yet: one call a
        poll to count them and one to read them, not a call per rank. Each group's members as
        comm/failure/flight.py's `runs`."""
        deadline = time.monotonic() + within_s
        while self._count(PREFIX + "states") < self.world_size and time.monotonic() <= deadline:
            time.sleep(0.05)
        return {snap["rank"]: snap for snap in self._read(PREFIX + "states")}

    def post_window(self, index: int, window: dict, *, host: int | None = None) -> None:
        """This rank's live window `index` (live/monitor.py), for rank 0 to combine — or, `host` (the first rank
        of this rank's host, in a job combined host by host), for that rank; a host's part goes as a window."""
        self._post(_live_key(index, host), window)

    def windows(self, index: int, expected: int, *, now: bool = False, host: int | None = None) -> list[dict]:
        """The live windows `index` posted to rank 0 (or to `host`'s first rank), once `expected` of them are
        (or, `now`, those that are): read and removed from the store in one go, which so holds no more than the
        windows not yet combined. [] while fewer are there."""
        key = _live_key(index, host)
        count = self._count(key)
        if not count or (count < expected and not now):
            return []
        out = self._read(key)
        self._store.delete_key(key)
        self._store.delete_key(key + "/n")
        return out

    def post_endpoint(self, endpoint: dict) -> None:
        """A host's live metrics endpoint ({"host", "target"}), for rank 0 to list for Prometheus."""
        self._post(PREFIX + "live/endpoints", endpoint)

    def endpoints(self) -> list[dict]:
        """Every endpoint posted so far."""
        return self._read(PREFIX + "live/endpoints")

    def _post(self, key: str, doc: dict) -> None:
        """One line appended to `key`, then counted: a reader that sees the count sees the line."""
        self._store.append(key, json.dumps(doc, separators=(",", ":")) + "\n")
        self._store.add(key + "/n", 1)

    def _count(self, key: str) -> int:
        return self._store.add(key + "/n", 0)

    def _read(self, key: str) -> list[dict]:
        if not self._store.check([key]):
            return []
        lines = self._store.get(key).decode().splitlines()
        with gc_paused():  # one parse, not one a line; no collection walks the process for each N windows' part
            return json.loads("[" + ",".join(line for line in lines if line) + "]")

    def post_verdict(self, code: int, message: str) -> None:
        self._store.set(PREFIX + "verdict", json.dumps({"code": code, "message": message}))

    def verdict(self, *, within_s: float) -> dict | None:
        """The claimant's verdict, once posted (None if not within `within_s`)."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self._store.check([PREFIX + "verdict"]):
                return json.loads(self._store.get(PREFIX + "verdict"))
            time.sleep(0.05)
        return None

    def ack(self) -> None:
        """This rank has the verdict and has saved what it measured: the claimant (maybe the store's host, and
        a launcher ends every rank once one exits) may go."""
        self._store.set(f"{PREFIX}ack/{self.rank}", "1")

    def go(self) -> None:
        """Every answering rank acked: they exit on this, with the claimant."""
        self._store.set(PREFIX + "go", "1")

    def wait_go(self, *, within_s: float) -> None:
        """Until the claimant says go, or its store is gone with it (raises then), or `within_s`. A launcher
        that ends every rank once one exits with a failure (MPICH's Hydra) would kill a rank still running,
        and a bare mpiexec then returns that SIGKILL's 9, not the verdict: the ranks exit together, the
        store waking the waiters at once (TCPStore.wait, not a poll)."""
        self._store.wait([PREFIX + "go"], timedelta(seconds=within_s))

    def wait_acks(self, ranks: list[int], *, within_s: float) -> None:
        """Until `ranks` have read the verdict: the store dies with rank 0, mid-request for a slow reader."""
        self._wait_all([f"{PREFIX}ack/{r}" for r in ranks], within_s)

    def close(self, *, within_s: float) -> None:
        """End of a run that went well. Every rank says it stopped watching; rank 0, whose process serves
        the store, waits for that before it lets the store go, so no watchdog polls a vanished store."""
        self._store.set(f"{PREFIX}done/{self.rank}", "1")
        if self.rank == 0:
            self._wait_all([f"{PREFIX}done/{r}" for r in range(self.world_size)], within_s)

    def _wait_all(self, keys: list[str], within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while keys and time.monotonic() < deadline:
            keys = [k for k in keys if not self._store.check([k])]
            if keys:
                time.sleep(0.02)


def _live_key(index: int, host: int | None) -> str:
    return f"{PREFIX}live/{index}" if host is None else f"{PREFIX}live/{index}/host/{host}"


class Meeting:
    """Ranks agreeing to meet at a key of the store, within a bound: each adds itself; the last to come sets
    the key's state to "go", a rank that waited past the bound to "closed" — whichever comes first
    (compare-and-set), so every rank that came reads the same outcome."""

    def __init__(self, store) -> None:
        self._store = store

    def meet(self, key: str, size: int, *, within_s: float) -> bool:
        """Whether all `size` ranks came to `key` (the same answer on every rank that came)."""
        key = f"{PREFIX}aligned/{key}"
        state = key + "/state"
        try:
            if self._store.add(key, 1) < size:
                try:
                    self._store.wait([state], timedelta(seconds=within_s))  # woken by the store, not a poll
                except Exception:  # not all came in time: torch's DistStoreError
                    pass
                return self._store.compare_set(state, "", "closed") == b"go"
            return self._store.compare_set(state, "", "go") == b"go"
        except Exception:  # the store went with rank 0
            return False


class _Bounded:
    """The store's methods, each called on a daemon thread and given up after REPLY_S (the thread, blocked
    in C with the GIL released, is left behind; it ends with the process)."""

    def __init__(self, plane: ControlPlane) -> None:
        self._plane = plane

    def __getattr__(self, name: str):
        method = getattr(self._plane._raw, name)

        def call(*args):
            if self._plane.gone:
                raise Unreachable(f"rank 0's store is unreachable ({name})")
            box: dict = {}

            def run() -> None:
                try:
                    box["value"] = method(*args)
                except BaseException as exc:  # handed to the caller below
                    box["error"] = exc

            thread = threading.Thread(target=run, name="commprof-control", daemon=True)
            thread.start()
            thread.join(REPLY_S)
            if thread.is_alive():
                self._plane.gone = True
                raise Unreachable(f"rank 0's store did not answer {name} within {REPLY_S:g} s")
            if "error" in box:
                raise box["error"]
            return box["value"]

        return call
