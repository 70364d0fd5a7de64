"""GPU stream spans in the trace (commprof/record/gpu_trace.py) from real CUDA events: `commprof run
--strategy ddp --backend nccl --trace DIR` puts every range on the stream's thread no earlier than the host
pushed it, and the ops on a stream thread of their own. The same code with stand-in events on CPU is
tests/unit/test_gpu_stream_spans.py."""

import pytest
from spawn import commprof

from commprof.record import trace


def spans_on(events, thread):
    tid = next(e["tid"] for e in events if e.get("name") == "thread_name" and e["args"]["name"] == thread)
    return [e for e in events if e["ph"] == "X" and e["tid"] == tid]


@pytest.mark.gpu
def test_a_cuda_run_has_stream_spans_after_their_launches(tmp_path):
    out = tmp_path / "trace"
    proc = commprof("run", "--strategy", "ddp", "--backend", "nccl", "--nproc", "1", "--steps", "4", "--warmup", "1",
                    "--batch-size", "32", "--eval-samples", "0", "--trace", str(out))
    assert proc.returncode == 0, proc.stderr
    events = trace.load(out / "rank0.trace.json")
    bound_us = next(e for e in events if e.get("name") == "gpu_clock_sync")["args"]["anchor_bound_ns"] / 1e3
    cpu, gpu = spans_on(events, "training"), spans_on(events, "stream: ranges")
    assert [e["name"] for e in gpu] == [e["name"] for e in sorted(cpu, key=lambda e: e["ts"] + e["dur"])]
    by_name = {}
    for e in cpu:
        by_name.setdefault(e["name"], []).append(e)
    for e in gpu:  # the stream reaches a range no earlier than the host pushed it
        host = by_name[e["name"]].pop(0)
        assert e["ts"] >= host["ts"] - bound_us - 5, (e, host)
    assert len(spans_on(events, "stream: comm (world)")) >= 3  # an all_reduce (or more) per measured step
