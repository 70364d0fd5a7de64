"""Completion of an async collective whose backend gives no future (gloo's reduce_scatter): a thread of the
Comm's own makes the one wait() on each such work, in issue order, and stamps the op complete when it returns
— where otherwise the op would be complete only when the training thread waits on it, which may be long
after (FSDP waits on its gradients' reduce_scatters after the whole backward, and its op spans then held the
backward). The caller's wait() waits for the thread's, never on the work itself: gloo's reduce_scatter work
copies its chunk into the output inside wait(), so a second wait() copies it again, over whatever the caller
has written there since (FSDP scales its gradients in place: a 3-rank FSDP run then trained off by 5e-3).
Work.wait() releases the GIL, so the thread waits while the training thread runs.

Exercised by: `pytest tests/test_comm.py tests/test_strategies.py`.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable


class Pending:
    """A backend work the waiter thread waits on, standing in for it: wait() returns once that wait has, and
    raises what it raised."""

    def __init__(self, work) -> None:
        self._work = work
        self._over = threading.Event()
        self._error: BaseException | None = None

    def wait(self, timeout=None) -> bool:
        self._over.wait()
        if self._error is not None:
            raise self._error
        return True

    def _settle(self, done: Callable[[int], None]) -> None:
        """The waiter thread's one wait() on the work; `done(perf_counter_ns())` once it completed."""
        try:
            self._work.wait()
        except Exception as exc:  # the caller's wait() raises it, as the backend's own would have
            self._error = exc
        else:
            done(time.perf_counter_ns())  # stamped before the caller can go on
        finally:
            self._work = None  # a torch Work kept past the group's end keeps gloo's threads alive
            self._over.set()


class Waiter:
    """One daemon thread per Comm, started by the first work it is given."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def watch(self, work, done: Callable[[int], None]) -> Pending:
        """The stand-in for `work`, which completes (after the works given before it) with `done` called."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="commprof completion", daemon=True)
            self._thread.start()
        pending = Pending(work)
        self._queue.put((pending, done))
        return pending

    def close(self) -> None:
        """Let the thread end once the works given to it have completed."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread = None

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            item[0]._settle(item[1])
