"""An async op's handle: a wait() that returns finds the op in the op log, even where the backend's completion
callback, on a thread of its own, stamped the op's end and is still logging it as the wait begins.
Exercised by: `pytest tests/unit/test_handle.py`.
"""

from __future__ import annotations

import threading
import time

import torch
from support.fake_comm import FakeWorld

LOGGING_S = 0.3
"""How long the completion callback takes to put the op in the log: long beside the wait's start."""


def test_a_wait_returns_only_once_the_callback_has_logged_the_op():
    comm = FakeWorld(1).comms[0]
    append = comm._append

    def slow_append(entry):  # the callback thread between its end stamp and the log
        time.sleep(LOGGING_S)
        append(entry)

    def on_a_thread(work, done, name):  # as gloo's future: completion on a thread of the backend's
        threading.Thread(target=done, args=(time.perf_counter_ns(),)).start()
        return None, None

    comm._append, comm._watch_completion = slow_append, on_a_thread
    handle = comm.all_reduce(torch.ones(4), async_op=True)
    time.sleep(LOGGING_S / 6)  # the callback has (most likely) stamped the end and is logging
    began = time.monotonic()
    handle.wait()
    logged = [op for op in comm.recorder.ops if op[0] == "all_reduce"]
    assert len(logged) == 1, (logged, time.monotonic() - began)
