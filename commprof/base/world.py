"""Who am I: rank, world size and local rank, read from whatever launched this process.

Recognised launchers, first match wins:
  commprof --nproc N / torchrun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
  mpiexec (Open MPI)              OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
  mpiexec (MPICH / Hydra, PMI)    PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
  srun (Slurm)                    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE, SLURM_JOB_NODELIST
With none of them the process is a world of one, not launched.

Exercised by: `pytest tests/unit/test_world_discovery.py`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

from commprof.base.errors import UsageError


@dataclass(frozen=True)
class World:
    """This process's place among the ranks of one job."""

    rank: int
    """Global rank, 0 … world_size-1."""
    world_size: int
    """Number of ranks in the job."""
    local_rank: int
    """Rank among the processes on this host."""
    local_world_size: int
    """Number of ranks on this host (used to detect oversubscription)."""
    launcher: str
    """'commprof', 'torchrun', 'mpiexec', 'srun' or 'none'."""
    master_addr: str | None = None
    """Rendezvous host for torch.distributed; None when it must be exchanged over MPI."""
    master_port: int | None = None
    """Rendezvous port for torch.distributed."""

    @property
    def launched(self) -> bool:
        """True when some launcher started this process as one rank of a job."""
        return self.launcher != "none"


def discover(env: Mapping[str, str] | None = None) -> World:
    """Read the World from the environment of this process (or `env`)."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        launcher = env.get("COMMPROF_LAUNCHER", "torchrun")
        return _make(env, launcher, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    if "OMPI_COMM_WORLD_RANK" in env:
        return _make(env, "mpiexec", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
    if "PMI_RANK" in env:
        return _make(env, "mpiexec", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        world = _make(env, "srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")
        if world.master_addr is None and "SLURM_JOB_NODELIST" in env:
            port = int(env.get("SLURM_JOB_ID", "0")) % 10000 + 20000
            world = World(**{**world.__dict__, "master_addr": first_host(env["SLURM_JOB_NODELIST"]),
                             "master_port": world.master_port or port})
        return world
    return World(rank=0, world_size=1, local_rank=0, local_world_size=1, launcher="none")


def _make(env: Mapping[str, str], launcher: str, rank: str, size: str, local_rank: str, local_size: str) -> World:
    world_size = _int(env, size)
    if world_size < 1:
        raise UsageError(f"{size}={world_size} must be at least 1")
    r = _int(env, rank)
    if not 0 <= r < world_size:
        raise UsageError(f"{rank}={r} is outside 0..{world_size - 1}")
    port = env.get("MASTER_PORT")
    return World(
        rank=r,
        world_size=world_size,
        local_rank=_int(env, local_rank, default=r),
        # Slurm writes e.g. "4(x2)" for uneven nodes: the leading count is this node's.
        local_world_size=_int(env, local_size, default=world_size),
        launcher=launcher,
        master_addr=env.get("MASTER_ADDR"),
        master_port=int(port) if port else None,
    )


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None:
        if default is None:
            raise UsageError(f"environment variable {name} is missing")
        return default
    match = re.match(r"\s*(\d+)", raw)
    if not match:
        raise UsageError(f"environment variable {name}={raw!r} is not a whole number")
    return int(match.group(1))


def first_host(nodelist: str) -> str:
    """First host of a Slurm node list: 'gpu[03-05,09],cpu1' -> 'gpu03'."""
    head = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not head:
        raise UsageError(f"cannot read a host from SLURM_JOB_NODELIST={nodelist!r}")
    prefix, ranges = head.group(1), head.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def bind_cores(world: World) -> list[int]:
    """Bind this rank (its thread now, so every thread it starts after) to its share of the cores it may run
    on: local rank r of n gets the r-th of n equal runs; returns them. Before torch starts a thread: one
    started earlier keeps the old mask."""
    cores = sorted(os.sched_getaffinity(0))
    share = len(cores) // world.local_world_size
    if share == 0:
        raise UsageError(f"--bind-cores: {world.local_world_size} ranks on this host and {len(cores)} core(s) "
                         "to share: at least one a rank")
    mine = cores[world.local_rank * share:(world.local_rank + 1) * share]
    os.sched_setaffinity(0, mine)
    return mine


def usable_cores() -> int:
    """Cores this process may run on (affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


RANKS_PER_CORE = 4
"""Local ranks a core may carry before a job counts as asking for more than this host holds: 4 ranks a core
still runs a correctness test (2 cores, 4 ranks here), and past it each rank's share of a core is too small for
any timing to mean anything; --oversubscribe starts more on purpose."""
RANK_BYTES = 280 << 20
"""The private memory one rank needs before it has any buffer: an idle gloo rank of torch 2.14 on CPU holds
280 MiB of its own (Private_Dirty of /proc/self/smaps_rollup; the rest of its 510 MiB resident set is libraries
every rank shares)."""


def available_memory() -> int | None:
    """Bytes this host can still give its processes (MemAvailable), or None where /proc/meminfo says nothing."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_room(nproc: int, *, oversubscribe: bool, per_rank_bytes: int = 0) -> None:
    """Refuse to start `nproc` local ranks this host cannot hold: more than its memory holds at RANK_BYTES each
    (plus `per_rank_bytes`, the buffers each will allocate), whatever is asked; more than RANKS_PER_CORE a core
    unless `oversubscribe`. Raises UsageError before anything starts."""
    memory = available_memory()
    need = RANK_BYTES + per_rank_bytes
    if memory is not None and nproc * need > memory:
        each = f"{_gib(RANK_BYTES)} a rank" + (f" and {_gib(per_rank_bytes)} of buffers" if per_rank_bytes else "")
        raise UsageError(f"{nproc} rank(s) need about {_gib(nproc * need)} ({each}) and this host has "
                         f"{_gib(memory)} available: start fewer ranks, or ask for smaller buffers")
    cores = usable_cores()
    if nproc > RANKS_PER_CORE * cores and not oversubscribe:
        raise UsageError(f"--nproc {nproc}: this host has {cores} core(s), room for {RANKS_PER_CORE * cores} ranks "
                         f"({RANKS_PER_CORE} a core); --oversubscribe starts them anyway")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"
