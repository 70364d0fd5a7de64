"""The annotator's Kineto sink in one process, without a job: attached only while torch's profiler runs and
cleared after it, a range pushed before the profiler and popped inside it leaving nothing behind, one user
annotation per range and per ProfilerStep of the measured iterations."""

import json
from collections import Counter

import torch

from commprof.record.annotate import ANNOTATOR, MEASURED
from commprof.run import kineto


def test_sink_attached_only_while_profiling_and_ranges_balanced(tmp_path):
    """In one process: the annotator's Kineto sink is set inside the profiler and cleared after it, a range
    opened before the profiler and closed inside it leaves nothing behind, `measured` is not repeated."""
    active_before = ANNOTATOR.active
    outer, inner = ANNOTATOR.label("iteration 9", "iteration"), ANNOTATOR.label("forward", "compute")
    measured = ANNOTATOR.label(MEASURED, "iteration")
    ANNOTATOR.push(outer)
    with kineto.profiler(str(tmp_path), None, torch.device("cpu"), steps=3, warmup=1) as prof:
        assert ANNOTATOR.kineto is not None and ANNOTATOR.active
        ANNOTATOR.pop()  # `outer`, pushed before the profiler: nothing in Kineto to close
        for t in range(3):
            if t == 1:
                ANNOTATOR.push(measured)
            with_range = ANNOTATOR.label(f"iteration {t}", "iteration")
            ANNOTATOR.push(with_range)
            ANNOTATOR.push(inner)
            torch.ones(4).add_(1)
            ANNOTATOR.pop()
            ANNOTATOR.pop()
            kineto.step(prof)
    ANNOTATOR.pop()  # measured, after the profiler
    assert ANNOTATOR.kineto is None and ANNOTATOR.active == active_before
    (path,) = tmp_path.glob("rank0.*.pt.trace.json")
    doc = json.loads(path.read_text())
    names = Counter(e["name"] for e in doc["traceEvents"] if e.get("cat") == "user_annotation")
    assert names == Counter({"ProfilerStep#1": 1, "ProfilerStep#2": 1, "iteration 1": 1, "iteration 2": 1,
                             "forward": 2})
