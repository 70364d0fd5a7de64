"""One rank of the calibrated phase-recorder test: a compute phase of known length and a comm op whose
completion is known, because rank 1 joins it a known time after rank 0 starts (and says when it did:
a loaded machine oversleeps, so the truth is the measured join, not the requested one).

Rank 0 prints one JSON line per case: the truth and what Phases reported. Started by
tests/test_phases.py as 2 real gloo processes.

    case "blocking": compute C, then a blocking all_reduce that completes at D  -> comm D-C, exposed D-C, overlap 0
    case "overlap":  async all_reduce issued, compute C (> D), wait            -> comm D, overlap D, exposed ~0
    case "partial":  async all_reduce issued, compute C (< D), wait            -> comm D, overlap C, exposed D-C
"""

import json
import sys
import threading
import time

import torch

from commprof.base.world import discover
from commprof.comm import end_process, init_comm
from commprof.record.phases import Phases

MS = 1_000_000


def spin(ms: float) -> None:
    end = time.perf_counter_ns() + ms * MS
    while time.perf_counter_ns() < end:
        pass


def forward(phases: Phases, ms: float) -> tuple[int, int, int, int]:
    """The forward phase, `ms` of spinning. Returns stamps just inside and just outside the phase: the
    recorder's compute must lie between the two durations (a loaded machine can pause the rank at the
    phase's edges, and then the phase really lasted longer than the spin)."""
    outside_0 = time.perf_counter_ns()
    with phases.phase("forward"):
        inside_0 = time.perf_counter_ns()
        spin(ms)
        inside_1 = time.perf_counter_ns()
    return inside_0, inside_1, outside_0, time.perf_counter_ns()


def wake_late(spin_ms: float, wake_ms: float) -> float:
    """The control for an async op's completion stamp, taken in the same run: how late (ms) a Python thread
    that wakes at `wake_ms` gets to stamp while the main thread spins for `spin_ms` — the GIL and a core
    that gloo's completion callback needs too, on a machine as busy as it is now."""
    stamped = []
    began = time.perf_counter_ns()

    def wake() -> None:
        time.sleep(wake_ms / 1e3)
        stamped.append(time.perf_counter_ns())

    thread = threading.Thread(target=wake)
    thread.start()
    spin(spin_ms)
    thread.join()
    return max(0.0, (stamped[0] - began) / MS - wake_ms)


def main() -> None:
    # gloo stamps an async op's completion in a Python callback, which waits for the GIL while `spin`
    # holds it: up to two switch intervals (2 × 5 ms) late by default. Real compute (torch kernels)
    # releases the GIL; a short interval gives this Python spin the same property.
    sys.setswitchinterval(0.0002)
    comm = init_comm(discover(), backend="gloo", timeout_s=60)
    phases = Phases(comm.recorder)
    cases = {"blocking": (60, 150, False), "overlap": (150, 80, True), "partial": (60, 150, True)}
    for name, (compute_ms, join_ms, async_op) in cases.items():
        for repeat in range(5):
            buf = torch.ones(1024)
            comm.control_barrier()
            began = time.perf_counter_ns()  # both ranks share CLOCK_MONOTONIC: comparable stamps
            if comm.rank == 1:
                time.sleep(join_ms / 1e3)
                joined = time.perf_counter_ns()  # a loaded machine oversleeps: the truth is when it joined
                comm.all_reduce(buf)
                comm.gather_object(joined, dst=0)
                continue
            phases.begin(repeat)
            if async_op:
                before_issue = time.perf_counter_ns()
                handle = comm.all_reduce(buf, async_op=True)
                after_issue = time.perf_counter_ns()
                edges = forward(phases, compute_ms)
                before_wait = time.perf_counter_ns()
                handle.wait()
                # comm − exposed is the time from the op's issue to the wait's start: bracketed by these;
                # the op starts before the phase does, by at most issue_to_phase_max
                gaps = {"issued_ms": (after_issue - began) / MS,
                        "issue_to_phase_max_ms": (edges[0] - before_issue) / MS,
                        "issue_to_wait_min_ms": (before_wait - after_issue) / MS,
                        "issue_to_wait_max_ms": (before_wait - before_issue) / MS,
                        "wake_late_ms": wake_late(compute_ms, join_ms)}
            else:
                gaps = {}
                edges = forward(phases, compute_ms)
                comm.all_reduce(buf)
            split = phases.end()
            joined = comm.gather_object(None, dst=0)[1]
            assert torch.equal(buf, torch.full((1024,), 2.0))
            inside_0, inside_1, outside_0, outside_1 = edges
            print(json.dumps({"case": name, "repeat": repeat, "compute_ms": compute_ms,
                              "join_ms": (joined - began) / MS, "forward_min_ms": (inside_1 - inside_0) / MS,
                              "forward_max_ms": (outside_1 - outside_0) / MS,
                              "forward_end_ms": (outside_1 - began) / MS,
                              "comm_minus_exposed_ms": (split.comm_ns - split.exposed_comm_ns) / MS,
                              "comm_outside_compute_ms": (split.comm_ns - split.overlap_ns) / MS, **gaps,
                              **{k.replace("_ns", "_ms"): v / MS for k, v in split._asdict().items()
                                 if isinstance(v, int)}}), flush=True)
    comm.control_barrier()
    comm.close()


if __name__ == "__main__":
    end_process(main() or 0)  # not sys.exit: see commprof.comm.end_process
