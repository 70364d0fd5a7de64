"""GPU stream spans in the trace (commprof/record/gpu_trace.py), on CPU: CUDA events cannot be made
here, so HostEvent stands in for torch.cuda.Event — its "device" time is the host clock when it was
recorded, and `query()` says False until the test lets the stream pass it. What is checked is commprof's
own part: the anchor, the conversion to the trace's time axis, spans held back until the stream has
passed them (no synchronize inside a run), waited for at close, the rescaling of a drifting device clock,
the threads they land on and the flows. tests/test_gpu_trace.py checks the real events on a GPU."""

import time

from commprof.record import trace
from commprof.record.annotate import ANNOTATOR, Range
from commprof.record.gpu_trace import StreamSpans


class HostEvent:
    """torch.cuda.Event's interface, with the host clock as the device's."""

    passed = True
    """False: the stream has not reached any event yet (query() answers False)."""

    def record(self):
        self.t = time.perf_counter_ns()

    def query(self):
        return HostEvent.passed

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) / 1e6


class CudaClock:
    kind = "cuda"


class OneRankComm:
    rank, clock, members = 0, CudaClock(), [0]


def recorder(tmp_path, event=HostEvent):
    clocks = {"epoch_ns": time.perf_counter_ns(), "ranks": [
        {"rank": 0, "host": "h", "measured_offset_ns": 0, "bound_ns": 0, "applied_offset_ns": 0, "residual_ns": 0}]}
    rec = trace.TraceRecorder(tmp_path / "rank0.trace.json", rank=0, world_size=1, clocks=clocks)
    rec.attach_gpu(StreamSpans(event=event, synchronize=lambda: None))
    return rec


def spans_on(events, thread):
    tid = next(e["tid"] for e in events if e.get("name") == "thread_name" and e["args"]["name"] == thread)
    return [e for e in events if e["ph"] == "X" and e["tid"] == tid]


def slack_us(began_ns: int, slept_ns: int) -> float:
    """How long the block since `began_ns` took beyond its sleeps, in µs: the most a host stamp and the stand-in
    event recorded beside it can be apart (a thread descheduled between them, on a busy machine)."""
    return max(0.0, (time.perf_counter_ns() - began_ns - slept_ns) / 1000)


def test_ranges_and_ops_land_on_stream_threads_where_their_events_were(tmp_path):
    rec = recorder(tmp_path)
    ANNOTATOR.trace = rec
    began = time.perf_counter_ns()
    try:
        with Range(ANNOTATOR.label("iteration 1", "iteration")):
            with Range(ANNOTATOR.label("backward", "compute")):
                start = HostEvent()
                start.record()
                time.sleep(0.002)
                end = HostEvent()
                end.record()
                rec.op(("all_reduce", 4096, 2, start, end, False, "dp"), OneRankComm())
    finally:
        ANNOTATOR.trace = None
    tolerance = 200 + slack_us(began, 2_000_000)
    rec.close()
    events = trace.load(rec.path)
    cpu = {e["name"]: e for e in spans_on(events, "training")}
    gpu = {e["name"]: e for e in spans_on(events, "stream: ranges")}
    assert sorted(gpu) == sorted(cpu) == ["backward", "iteration 1"]
    for name, span in gpu.items():  # stand-in events are recorded right beside the host stamps
        assert abs(span["ts"] - cpu[name]["ts"]) < tolerance and abs(span["dur"] - cpu[name]["dur"]) < tolerance
        assert span["cat"] == cpu[name]["cat"]
    op, = spans_on(events, "stream: comm (dp)")
    assert op["name"] == "all_reduce (dp)" and op["args"] == {"bytes": 4096, "group_size": 2, "seq": 0}
    assert 2000 <= op["dur"] < 50_000  # µs: the 2 ms between the op's two events
    back = gpu["backward"]
    assert back["ts"] <= op["ts"] and op["ts"] + op["dur"] <= back["ts"] + back["dur"]
    assert not [e for e in events if e["ph"] in "stf"]  # flows join ranks: the merged file draws them
    assert not any(e.get("args", {}).get("name") == "comm (dp)" for e in events)  # not on the host thread
    meta = next(e for e in events if e.get("name") == "gpu_clock_sync")
    assert 0 <= meta["args"]["anchor_bound_ns"] < 10_000_000


def test_spans_wait_until_the_stream_has_passed_them(tmp_path):
    rec = recorder(tmp_path)
    HostEvent.passed = False
    ANNOTATOR.trace = rec
    try:
        for k in range(3):
            with Range(ANNOTATOR.label(f"iteration {k}", "iteration")):
                pass
        rec.flush()  # the stream is behind: nothing of it yet, and no waiting for it
        held = len(rec.gpu.pending)
        events = trace.load(rec.path)
        assert held == 3 and not any(e.get("args", {}).get("name") == "stream: ranges" for e in events)
        HostEvent.passed = True
        rec.flush()
        assert not rec.gpu.pending and len(spans_on(trace.load(rec.path), "stream: ranges")) == 3
        HostEvent.passed = False
        with Range(ANNOTATOR.label("iteration 3", "iteration")):
            pass
    finally:
        ANNOTATOR.trace = None
        HostEvent.passed = True
    rec.close()  # waits for the rest
    names = [e["name"] for e in spans_on(trace.load(rec.path), "stream: ranges")]
    assert names == ["iteration 0", "iteration 1", "iteration 2", "iteration 3"]


RATE = 0.95
"""The stand-in device clock's rate against the host's."""


class SlowEvent(HostEvent):
    """A device whose clock runs 5 % slow against the host's."""

    def elapsed_time(self, other):
        return (other.t - self.t) / 1e6 * RATE


def test_a_device_clock_drifting_from_the_hosts_is_rescaled_at_close(tmp_path):
    began = time.perf_counter_ns()
    rec = recorder(tmp_path, SlowEvent)
    ANNOTATOR.trace = rec
    try:
        for k in range(5):
            with Range(ANNOTATOR.label(f"iteration {k}", "iteration")):
                time.sleep(0.02)
    finally:
        ANNOTATOR.trace = None
    rec.close()
    took_ns = time.perf_counter_ns() - began
    slack = slack_us(began, 100_000_000)
    events = trace.load(rec.path)
    cpu, gpu = spans_on(events, "training"), spans_on(events, "stream: ranges")
    assert [e["name"] for e in gpu] == [e["name"] for e in cpu]
    # 5 % of the ~100 ms since the anchor would put the last span ~5 ms early; rescaled, it lands with its push
    # (within what the run took beyond its sleeps: a host stamp and its event may be that far apart)
    for host, stream in zip(cpu, gpu):
        assert abs(stream["ts"] - host["ts"]) < 200 + slack and abs(stream["dur"] - host["dur"]) < 200 + slack, \
            (host, stream, slack)
    rate = next(e for e in events if e.get("name") == "gpu_clock_rate")["args"]
    assert abs(rate["drift_ppm"] - 1e6 * (1 / RATE - 1)) < 500 + 1e9 * slack / took_ns and rate["bound_ns"] >= 0
