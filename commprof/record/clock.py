"""Clocks that time communication: perf_counter_ns on CPU, CUDA events on the op's stream on GPU.

A clock hands out opaque time stamps with `now()`; `elapsed_ns(start, end)` turns two of them into
nanoseconds. CUDA stamps are events recorded on the current stream — the stream a synchronous
torch.distributed op is ordered on — and are only read when asked for, so timing an op never
synchronizes the device. Exercised by: `pytest tests/test_comm.py tests/test_gpu_trace.py`.
"""

from __future__ import annotations

import time


class CpuClock:
    """Host wall clock (time.perf_counter_ns): for gloo and MPI, whose ops complete on the calling thread."""

    kind = "cpu"
    now = staticmethod(time.perf_counter_ns)

    @staticmethod
    def elapsed_ns(start: int, end: int) -> int:
        return end - start


class CudaClock:
    """CUDA events recorded on the current stream; resolved lazily, one event wait per read."""

    kind = "cuda"

    def __init__(self) -> None:
        import torch

        self._event = torch.cuda.Event

    def now(self):
        event = self._event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def elapsed_ns(start, end) -> int:
        end.synchronize()
        return round(start.elapsed_time(end) * 1e6)
