"""`commprof run --torch-profiler DIR`: the PyTorch profiler (Kineto) around the training loop, one trace
per rank (DIR/rank<r>.<time>.pt.trace.json), so Holistic Trace Analysis and Perfetto can read the same run.

The trace holds the measured iterations only: ProfilerStep#k is commprof's `iteration k`, k ≥ --warmup,
and the last warm-up iteration is the profiler's own warm-up step. Inside each, commprof's ranges
(iteration, data/forward/backward/step, every op and wait, algorithm steps) are user annotations — what
torch.profiler.record_function records — around torch's own ops (`gloo:all_reduce`, `aten::…`).

HTA groups ranks by the trace's `distributedInfo` (backend, rank, world_size): Kineto writes it when
torch.distributed is initialised (gloo, NCCL); for MPI, which commprof drives through mpi4py, commprof
adds it. Exercised by: `pytest tests/unit/test_kineto_sink.py tests/test_kineto.py`.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager

import torch
import torch.distributed as dist

from commprof.record.annotate import ANNOTATOR, MEASURED


class Ranges:
    """The annotator's Kineto sink: each range commprof pushes becomes a user annotation on the thread that
    pushed it. torch.autograd's enter/exit pair records what record_function does at a third of its cost
    (no context-manager object, no dispatcher call)."""

    def __init__(self) -> None:
        self._local = threading.local()  # on a GPU, autograd's device threads push ranges of their own
        self._enter = torch.autograd._record_function_with_args_enter
        self._exit = torch.autograd._record_function_with_args_exit

    def push(self, label) -> None:
        try:
            stack = self._local.stack
        except AttributeError:  # this thread's first range
            stack = self._local.stack = []
        # `measured` spans every measured iteration, across ProfilerStep boundaries, and ends after the
        # profiler does: in this trace the profiled window is the measured one already
        stack.append(None if label.message == MEASURED else self._enter(label.message))

    def pop(self) -> None:
        stack = getattr(self._local, "stack", None)
        if stack:  # an empty stack: the range was pushed before this sink was attached
            handle = stack.pop()
            if handle is not None:
                self._exit(handle)

    def close(self) -> None:
        """End what is still open on this thread (ranges that outlive the profiler)."""
        stack = getattr(self._local, "stack", None) or []
        while stack:
            handle = stack.pop()
            if handle is not None:
                self._exit(handle)


def profile_schedule(*, steps: int, warmup: int):
    """Record iterations warmup … steps-1; the profiler warms up on iteration warmup-1. With no warm-up
    iteration it records every one, unwarmed (torch says so)."""
    from torch.profiler import schedule

    if warmup == 0:
        return schedule(wait=0, warmup=0, active=steps, repeat=1)
    return schedule(skip_first=warmup - 1, wait=0, warmup=1, active=steps - warmup, repeat=1)


@contextmanager
def profiler(directory: str | None, comm, device: torch.device, *, steps: int, warmup: int):
    """torch.profiler.profile over `steps` iterations, the first `warmup` of them unrecorded, writing one
    trace per rank, with commprof's ranges in it (None without a directory: nothing is attached)."""
    if directory is None:
        yield None
        return
    from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

    rank = comm.rank if comm is not None else 0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities, schedule=profile_schedule(steps=steps, warmup=warmup),
                   on_trace_ready=tensorboard_trace_handler(directory, worker_name=f"rank{rank}"))
    if comm is not None and not dist.is_initialized():  # written when recording starts
        info = {"backend": comm.backend, "rank": comm.rank, "world_size": comm.world_size}
        prof.preset_metadata_json("distributedInfo", json.dumps(info))
    ranges = Ranges()
    with prof:
        ANNOTATOR.kineto = ranges
        try:
            yield prof
        finally:
            ANNOTATOR.kineto = None
            ranges.close()


def step(prof) -> None:
    """End one iteration for the profiler (a no-op without one)."""
    if prof is not None:
        prof.step()
