"""`commprof run --torch-profiler DIR`: the PyTorch profiler (Kineto) around the training loop, one trace
per rank (DIR/rank<r>.<time>.pt.trace.json), so Holistic Trace Analysis can read the same run.

HTA groups ranks by the trace's `distributedInfo` (backend, rank, world_size): Kineto writes it when
torch.distributed is initialised (gloo, NCCL); for MPI, which commprof drives through mpi4py, commprof
adds it. One profiler step per iteration (ProfilerStep#k), warm-up included. commprof's own ranges
are in NVTX and `--trace`, not in this file. Exercised by: `pytest tests/test_kineto.py`.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import torch
import torch.distributed as dist


@contextmanager
def profiler(directory: str | None, comm, device: torch.device, steps: int):
    """torch.profiler.profile over `steps` iterations writing one trace per rank (None without a
    directory). A schedule makes step() mark ProfilerStep#k; every step is active."""
    if directory is None:
        yield None
        return
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    rank = comm.rank if comm is not None else 0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=0, warmup=0, active=steps, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(directory, worker_name=f"rank{rank}")) as prof:
        if comm is not None and not dist.is_initialized():  # metadata counts only while profiling
            info = {"backend": comm.backend, "rank": comm.rank, "world_size": comm.world_size}
            prof.add_metadata_json("distributedInfo", json.dumps(info))
        yield prof


def step(prof) -> None:
    """End one iteration for the profiler (a no-op without one)."""
    if prof is not None:
        prof.step()
