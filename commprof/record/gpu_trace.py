"""GPU stream spans for `--trace DIR` on CUDA: every range commprof pushes and every op it times, placed
where the device's stream executed them, on the trace's (host) time axis.

Each NVTX range gets a CUDA event recorded on the current stream at its push and at its pop; ops
already carry theirs (the CUDA clock's stamps, commprof/record/clock.py). Device times become host
times through one anchor taken when the trace starts: with the device idle, host stamps t0 and t1
bracket the recording of one event, so it happened at (t0 + t1)/2 ± (t1 − t0)/2 on the host clock,
and every later event is the anchor plus `elapsed_time`. Events are read only once the stream has
passed them (`query()`) at the trace's flushes, so tracing never synchronizes the device inside a run;
the last ones are waited for when the trace closes.

The trace shows them as thread "stream: ranges" (one span per NVTX range, from when the stream
reached the push to when it reached the pop: the projection Nsight's nvtx_gpu_proj_sum reports) and
threads "stream: comm (<group>)" (every op from its start event to its end event). Exercised by:
`pytest tests/test_gpu_trace.py` (stand-in events on CPU); on a GPU by
`commprof run --strategy ddp --backend nccl --nproc 2 --trace DIR`.
"""

from __future__ import annotations

import time
from typing import Callable


class StreamSpans:
    """Pending (what, start event, end event) triples, turned into host ns once the stream passed them."""

    def __init__(self, event: Callable | None = None, synchronize: Callable | None = None,
                 now: Callable[[], int] = time.perf_counter_ns) -> None:
        if event is None:
            import torch

            event, synchronize = (lambda: torch.cuda.Event(enable_timing=True)), torch.cuda.synchronize
        self._event = event
        self.pending: list[tuple] = []
        synchronize()  # nothing queued ahead of the anchor
        t0 = now()
        self._anchor = self.mark()
        self._anchor.synchronize()
        t1 = now()
        self.anchor_ns, self.bound_ns = (t0 + t1) // 2, (t1 - t0) // 2
        """Host ns of the anchor event, and the most it can be off (the residual of every GPU stamp)."""

    def mark(self):
        """An event recorded now on the current stream."""
        event = self._event()
        event.record()
        return event

    def host_ns(self, event) -> int:
        return self.anchor_ns + round(self._anchor.elapsed_time(event) * 1e6)

    def ready(self, final: bool = False) -> list[tuple]:
        """(what, start ns, end ns) of every pending triple the stream has passed, in the order they
        were added; `final` waits for the rest."""
        done, keep = [], []
        for item in self.pending:
            what, start, end = item
            if final:
                end.synchronize()
            elif not end.query():
                keep.append(item)
                continue
            done.append((what, self.host_ns(start), self.host_ns(end)))
        self.pending = keep
        return done
