"""The `env` object of every report: versions, backend, world size, hosts, devices, oversubscription.

`local_env()` runs on each rank; rank 0 merges the gathered pieces with `merge_env()`.
Exercised by: `pytest tests/test_bench_cli.py`.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from importlib import metadata

import torch

from commprof import __version__


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def allocator() -> dict:
    """What decides where torch's buffers live, as rank 0 has it: huge pages change a large op's time (TLB
    misses) and the compute around it. `huge_pages`: torch's CPU allocator puts buffers of 2 MiB and more on
    transparent huge pages (THP_MEM_ALLOC_ENABLE=1, commprof's --huge-pages); `transparent_hugepage`: the
    kernel's mode (always, madvise or never; None where it cannot be read)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        mode = None
    thp = os.environ.get("THP_MEM_ALLOC_ENABLE")
    return {"huge_pages": thp == "1" and mode != "never", "THP_MEM_ALLOC_ENABLE": thp, "transparent_hugepage": mode,
            "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}


def local_env(device: torch.device) -> dict:
    """What this rank can say about itself."""
    if device.type == "cuda":
        name = f"{device} {torch.cuda.get_device_name(device)}"
    else:
        name = f"cpu {platform.processor() or platform.machine()}"
    return {"host": socket.gethostname(), "device": name, "pid": os.getpid(), "cores": _cores()}


def _cores() -> list[int] | None:
    """The cores this rank may run on (its affinity: all of the host's unless bound); None where unknown."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return None


def merge_env(pieces: list[dict], *, backend: str, world_size: int, local_world_size: int,
              slots: int, oversubscribed: bool, launcher: str, clock: str, argv: list[str]) -> dict:
    """The report's `env` from every rank's `local_env()`."""
    env = {
        "commprof": __version__,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "numpy": _version("numpy"),
        "rich": _version("rich"),
        "nvtx": _version("nvtx"),
        "mpi4py": _version("mpi4py"),
        "backend": backend,
        "world_size": world_size,
        "ranks_per_host": local_world_size,
        "slots_per_host": slots,
        "oversubscribed": oversubscribed,
        "launcher": launcher,
        "clock": clock,
        "hosts": sorted({p["host"] for p in pieces}),
        "devices": [p["device"] for p in pieces],
        "cores": [p.get("cores") for p in pieces],
        "command": argv,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    env["allocator"] = allocator()
    if backend == "nccl":
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    if backend == "mpi":
        from mpi4py import MPI

        env["mpi_library"] = MPI.Get_library_version().splitlines()[0].strip()
        levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
                  MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
        env["mpi_thread_level"] = levels.get(MPI.Query_thread(), str(MPI.Query_thread()))  # as granted
    return env
