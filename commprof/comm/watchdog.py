"""Watchdog: a rank blocked in one op for longer than --timeout ends the process with one clear line.

MPI has no timeouts of its own and a stalled peer would hang every other rank forever; gloo and
NCCL time out themselves, and this is the backstop for all three. The hot path pays two attribute
stores per op (`Comm.busy`, `Comm.busy_seq`); a daemon thread samples them.
Exercised by: `pytest tests/test_bench_cli.py -k stall`.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from commprof.errors import PeerTimeoutError


class Watchdog:
    """Samples a Comm's busy state; exits the process if one op stays busy past `timeout_s`."""

    def __init__(self, comm, *, timeout_s: float, rank: int, poll_s: float = 0.2) -> None:
        self._comm = comm
        self._timeout_s = timeout_s
        self._rank = rank
        self._poll_s = min(poll_s, timeout_s / 4)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commprof-watchdog", daemon=True)

    def __enter__(self) -> "Watchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()

    def _run(self) -> None:
        seen_seq, since = -1, 0.0
        while not self._stop.wait(self._poll_s):
            busy, seq = self._comm.busy, self._comm.busy_seq
            now = time.monotonic()
            if busy is None or seq != seen_seq:
                seen_seq, since = seq, now
                continue
            if now - since > self._timeout_s:
                err = PeerTimeoutError(
                    f"rank {self._rank}: {busy} did not complete within {self._timeout_s:g} s "
                    "(--timeout): a peer rank stalled or died")
                sys.stderr.write(f"commprof: error: {err}\n")
                sys.stderr.flush()
                os._exit(err.exit_code)
