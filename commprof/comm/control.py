"""The control plane: a side channel between the ranks of one job that still works when the data plane is
stuck — a torch.distributed TCPStore (rank 0 serves it from a thread of its own), spoken to only by the
watchdog thread, never on the measured path.

On gloo/NCCL it is a second client of the rendezvous store; on MPI rank 0 serves a new one and tells the
others where over MPI, once, at start. Keys (all under `commprof/`):
  failure        the first rank to see a failure claims it (compare-and-set: one winner)
  state/<rank>   each rank's flight-recorder snapshot, posted once a failure is claimed
  verdict        the winner's conclusion — exit code and one line — that every rank exits with
  ack/<rank>     a rank has read the verdict (the winner waits for these before it exits)
  done/<rank>    a rank ended well and stopped watching (rank 0 waits for these before the store goes)
Exercised by: `pytest tests/test_failures.py`.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

PREFIX = "commprof/"
STORE_TIMEOUT_S = 5.0
"""A store op that takes longer means rank 0 (the store's host) is stopped or gone."""


class ControlPlane:
    """Claim, exchange snapshots and agree on a verdict, over a TCPStore client of this rank's own."""

    def __init__(self, store, *, rank: int, world_size: int) -> None:
        self._store = store
        self.rank = rank
        self.world_size = world_size

    @classmethod
    def connect(cls, *, host: str, port: int, rank: int, world_size: int, serve: bool = False) -> "ControlPlane":
        """A client of the store at host:port; `serve` (rank 0 on MPI) starts the store first."""
        import torch.distributed as dist

        store = dist.TCPStore(host, port, world_size, serve, timeout=timedelta(seconds=STORE_TIMEOUT_S),
                              wait_for_workers=False)
        return cls(store, rank=rank, world_size=world_size)

    @property
    def port(self) -> int:
        return self._store.port

    def claim(self, code: int, message: str) -> bool:
        """True when this rank is the first to claim a failure for the job."""
        mine = json.dumps({"rank": self.rank, "code": code, "message": message})
        return self._store.compare_set(PREFIX + "failure", "", mine).decode() == mine

    def claimed(self) -> dict | None:
        """The claimed failure, if any rank has claimed one."""
        if not self._store.check([PREFIX + "failure"]):
            return None
        return json.loads(self._store.get(PREFIX + "failure"))

    def post_state(self, snap: dict) -> None:
        self._store.set(f"{PREFIX}state/{self.rank}", json.dumps(snap))

    def states(self, *, within_s: float) -> dict[int, dict]:
        """Every rank's posted snapshot, waiting at most `within_s` for the ones not posted yet."""
        out: dict[int, dict] = {}
        deadline = time.monotonic() + within_s
        while True:
            for r in range(self.world_size):
                key = f"{PREFIX}state/{r}"
                if r not in out and self._store.check([key]):
                    out[r] = json.loads(self._store.get(key))
            if len(out) == self.world_size or time.monotonic() > deadline:
                return out
            time.sleep(0.05)

    def post_verdict(self, code: int, message: str) -> None:
        self._store.set(PREFIX + "verdict", json.dumps({"code": code, "message": message}))

    def verdict(self, *, within_s: float) -> dict | None:
        """The claimant's verdict; acknowledged, so the claimant (maybe the store's host) may then exit."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self._store.check([PREFIX + "verdict"]):
                verdict = json.loads(self._store.get(PREFIX + "verdict"))
                self._store.set(f"{PREFIX}ack/{self.rank}", "1")
                return verdict
            time.sleep(0.05)
        return None

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
