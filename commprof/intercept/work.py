"""The Work an interposed async call returns: torch's Work type over Comm's Handle, so that the script's wait
is Comm's, timed (libraries test `isinstance(w, dist.Work)` before waiting; FSDP2 does).

Exercised by: `pytest tests/test_interpose.py`.
"""

from __future__ import annotations

import torch
from torch.distributed import distributed_c10d as c10d

from commprof.intercept.opaque import opaque


class Work(c10d.Work):
    """What an async call returns: a torch Work (libraries test `isinstance(w, dist.Work)` before waiting;
    FSDP2 does) over Comm's Handle, so the wait is Comm's, timed."""

    def __init__(self, handle, after=None) -> None:
        super().__init__()
        self._handle, self._after = handle, after
        self._future = handle.backend_future  # taken now: the handle lets its backend work go once waited on

    def wait(self, timeout=None) -> bool:
        self._handle.wait()
        # torch's work goes with the wait, as Handle's does: one kept past destroy_process_group keeps
        # gloo's threads alive and the process aborts at exit
        if self._future is not None and not self._future.done():
            self._future.wait()
        self._future = None
        if self._after is not None:
            after, self._after = self._after, None
            after()
        return True

    def is_completed(self) -> bool:
        return self._handle.is_completed()

    def get_future(self):
        if self._future is None:
            if self._handle.is_completed():  # waited on: an already completed future
                done = torch.futures.Future()
                done.set_result(None)
                return done
            raise RuntimeError("this backend's work has no future")
        return self._handle.logged(self._future)  # on CPU, what chains on it runs once the op is in the log


opaque(Work)  # waited on from C++ (torch's wait_tensor) while compiled code runs



def work(handle, after=None):
    """None for a synchronous call (after has run); a Work for an async one."""
    if handle is None:
        if after is not None:
            after()
        return None
    return Work(handle, after)

