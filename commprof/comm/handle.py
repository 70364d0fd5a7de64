"""An async op in flight (`Comm`'s `async_op=True` calls return one): when it completes, on which thread, its
span in the op log, the NVTX `wait` range while a caller blocks on it, and the end of its in-flight range.
Exercised by: `pytest tests/test_comm.py tests/test_phases.py`.
"""

from __future__ import annotations

import threading
import time

from commprof.base.errors import CommprofError
from commprof.record.annotate import ANNOTATOR


class Handle:
    """An async op in flight. CPU: the op completes when the backend's future says so — unless the caller
    is already blocked in `wait()` by then, in which case it completes when `wait()` returns, as a
    synchronous op does (so a wait never outlasts its op: exposed ≤ comm); MPI has no future, so always
    at `wait()`. Blocking in `wait()` is an NVTX `wait` range. CUDA: the span runs from an event recorded
    at issue to one recorded on a stream that waits on the op, from a callback chained on its future
    (`complete_on_stream`) — when the device finished it, without synchronizing; an op with no future ends
    at an event recorded right after `wait()` has made the current stream depend on it."""

    def __init__(self, comm, name: str, nbytes: int, work, start, flight: tuple | None = None) -> None:
        self._comm, self._name, self._nbytes, self._work = comm, name, nbytes, work
        self._start = start
        self._flight = flight
        """(end_range, range id) of the op's in-flight NVTX range, until it is ended; None without one."""
        self._lock = threading.Lock()
        self._end = None
        """Completion, once logged."""
        self._waiting = False
        self._waited = False
        done = self.complete_on_stream if comm.clock.kind == "cuda" else self._completed
        wait_on, self.backend_future = comm._watch_completion(work, done, name)
        """The backend's own future of the op (a torch Work's), until it is waited on; None where it has none."""
        self._work = wait_on or work

    def _completed(self, end) -> None:
        """The backend's future fired (its own thread)."""
        with self._lock:  # logged under the lock: a wait() that finds the op ended then finds it logged too
            if self._waiting or self._end is not None:
                return
            self._end = end
            self._land()
            self._log(end, True)

    def complete_on_stream(self) -> None:
        """CUDA, from a callback chained on the op's future (`get_future().then`), which runs with current
        streams that wait on the op: the op ends at an event recorded there. Chained at issue
        (TorchComm._watch_completion) and by DDP's routed reducer. A wait() already begun logs instead."""
        with self._lock:  # as _completed: logged before a wait() can see it ended
            if self._waiting or self._end is not None:
                return
            self._end = end = self._comm._now()
            self._land()
            self._log(end, None)

    def _land(self) -> None:
        """End the in-flight range: called once, by whichever of the future, the stream callback and wait()
        completes the op, right after its end stamp."""
        flight, self._flight = self._flight, None
        if flight is not None:
            flight[0](flight[1])

    def _log(self, end, host: bool | None) -> None:
        """`host`: the op log's HOST field — True, host ns; None, CUDA events of an op on a stream of its own."""
        comm = self._comm
        comm._log((self._name, self._nbytes, comm.world_size, self._start, end, host, comm.label))

    def is_completed(self) -> bool:
        """Whether the op has completed, as far as this rank has seen."""
        return self._waited or self._end is not None

    def get_future(self):
        """A future for callers that chain on the op (before wait()): on CPU it completes once the op is in
        the op log, on CUDA it is the backend's (complete_on_stream chains on it); None where the backend has
        none for this op (an MPI request, gloo's send and recv)."""
        return self.logged(self.backend_future)

    def logged(self, future):
        """`future` (the backend's, or None) chained so that on CPU it completes only after the op is logged.
        Callbacks on one future run in the order they were added, but one added once it has completed runs
        at once on the caller's thread, while the backend's thread may still wait for the GIL to run the
        completion callback added at issue: a caller woken that way (DDP's reducer) could end the iteration
        before the op is in its log, and the op would then be counted in the next one, or in none."""
        if future is None or self._comm.clock.kind == "cuda":
            return future
        return future.then(self._logged)

    def _logged(self, future):
        self._completed(time.perf_counter_ns())  # nothing if the backend's callback or a wait() logged it first
        return future.value()

    def wait(self) -> None:
        if self._waited:
            return
        comm = self._comm
        hit = comm._labels.get(("wait " + self._name, 0, None))
        if hit is None:
            hit = comm._label("wait " + self._name, 0, None)
        with self._lock:
            self._waiting = True
            done = self._end
        annotate = ANNOTATOR.active
        if annotate:
            ANNOTATOR.push(hit[0])
        comm.busy_seq += 1
        comm.busy = self._name
        try:
            start = time.perf_counter_ns()
            comm._wait(self._work)
            end = time.perf_counter_ns()
            if done is None and self._flight is not None and comm.clock.kind != "cuda":  # it completes at `end`,
                self._land()  # as logged below
            # The backend's work goes now, not with this handle: a torch Work kept past comm.close() keeps
            # gloo's context and its threads alive (see comm.end_process).
            self._work, self.backend_future, self._waited = None, None, True
        except CommprofError:
            raise
        except Exception as exc:  # the backend's words as one line naming the op, as for blocking ops
            raise comm.failure(self._name, exc) from exc
        finally:
            comm.busy = None
            if annotate:
                ANNOTATOR.pop()
            if done is None and not self._waited and self._flight is not None:  # the wait failed: the op is
                self._land()  # over for this rank
        if comm.clock.kind == "cuda":
            comm.recorder.waits.append((self._name, start, end))
            if done is None:
                self._end = comm._now()
                self._land()
                self._log(self._end, None)
            return
        if done is None:  # still in flight when the wait began: it completed when the wait returned
            self._end = done = end
            # self._log(end, True), inlined: a call less on every async op
            comm._log((self._name, self._nbytes, comm.world_size, self._start, end, True, comm.label))
        comm.recorder.waits.append((self._name, start, done if done < end else end))
