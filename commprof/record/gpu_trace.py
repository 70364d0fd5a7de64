"""GPU stream spans for `--trace DIR` on CUDA: every range commprof pushes and every op it times, placed
where the device's stream executed them, on the trace's (host) time axis.

Each NVTX range gets a CUDA event recorded on the current stream at its push and at its pop; ops
already carry theirs (the CUDA clock's stamps, commprof/record/clock.py). Device times become host
times through one anchor taken when the trace starts: with the device idle, host stamps t0 and t1
bracket the recording of one event, so it happened at (t0 + t1)/2 ± (t1 − t0)/2 on the host clock,
and every later event is the anchor plus `elapsed_time`. Events are read only once the stream has
passed them (`query()`) at the trace's flushes, so tracing never synchronizes the device inside a run;
the last ones are waited for when the trace closes. The two clocks drift apart (an H100's ran 26 ppm off
the host's: 115 µs after 4.4 s), so the close takes a second anchor and rescales the stream spans between
the two (TraceRecorder.close): each is then off by at most the two anchors' bounds.

The trace shows them as thread "stream: ranges" (one span per NVTX range, from when the stream
reached the push to when it reached the pop: the projection Nsight's nvtx_gpu_proj_sum reports) and
threads "stream: comm (<group>)" (every op from its start event to its end event). Exercised by:
`pytest tests/unit/test_gpu_stream_spans.py` (stand-in events on CPU); on a GPU by
`pytest tests/test_gpu_trace.py` and `commprof run --strategy ddp --backend nccl --nproc 2 --trace DIR`.
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
        self._event, self._synchronize, self._now = event, synchronize, now
        self.pending: list[tuple] = []
        self._anchor, self.anchor_ns, self.bound_ns = self._bracket()
        """The anchor event, its host ns, and the most that can be off (the residual of every GPU stamp)."""

    def _bracket(self) -> tuple:
        """An event recorded with the device idle, its host ns (the middle of two host stamps around it),
        and half their distance: how far off that can be."""
        self._synchronize()  # nothing queued ahead of it
        t0 = self._now()
        event = self.mark()
        event.synchronize()
        t1 = self._now()
        return event, (t0 + t1) // 2, (t1 - t0) // 2

    def rate(self) -> tuple[float, int]:
        """Host ns per device ns since the anchor, from a second anchor taken now (the device idle: at the
        trace's close), and that rate's bound on a span's place at the end. The device's clock and the host's
        drift apart: tens of ppm, so a single anchor places spans late in a run off by more than its bound."""
        event, host, bound = self._bracket()
        device = self._anchor.elapsed_time(event) * 1e6
        if device <= 0:
            return 1.0, self.bound_ns
        return (host - self.anchor_ns) / device, self.bound_ns + bound

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
