"""Completion of an async collective whose backend gives no future (gloo's reduce_scatter): a thread of the
Comm's own waits on each such work, in issue order, and stamps the op complete when its wait returns — where
otherwise the op would be complete only when the training thread waits on it, which may be long after (FSDP
waits on its gradients' reduce_scatters after the whole backward, and its op spans then held the backward).
Work.wait() releases the GIL, so the thread waits while the training thread runs.

Only collectives: a second waiter on gloo's send or receive would take the one completion it signals and
leave the training thread's own wait() blocked for ever, so a p2p op without a future is still complete at
wait(). Exercised by: `pytest tests/test_comm.py`.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable


class Waiter:
    """One daemon thread per Comm, started by the first work it is given."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def watch(self, work, done: Callable[[int], None]) -> None:
        """Call `done(perf_counter_ns())` once `work` has completed (after the works given before it)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="commprof completion", daemon=True)
            self._thread.start()
        self._queue.put((work, done))

    def _run(self) -> None:
        while True:
            work, done = self._queue.get()
            try:
                work.wait()
            except Exception:  # the training thread's own wait() says what went wrong, as it would have
                continue
            done(time.perf_counter_ns())
