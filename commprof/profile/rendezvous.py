"""A profiled script's rendezvous under any launcher, and the watchdog's own client of its store.

    rendezvous.set_env(world)                  # before the script runs: torchrun's variables, whoever launched
    comm.control = control_plane(comm)          # once the script's group exists

Exercised by: `pytest tests/test_profile_cli.py tests/test_profile_failures.py`.
"""

from __future__ import annotations

import os

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from commprof.base.world import World
from commprof.comm import rendezvous_address
from commprof.comm.failure.control import ControlPlane


def set_env(world: World) -> None:
    """torchrun's variables, so the script's env:// rendezvous works under mpiexec and srun too."""
    addr, port = rendezvous_address(world)
    os.environ.update(RANK=str(world.rank), WORLD_SIZE=str(world.world_size), LOCAL_RANK=str(world.local_rank),
                      LOCAL_WORLD_SIZE=str(world.local_world_size), MASTER_ADDR=addr, MASTER_PORT=str(port))


def control_plane(world) -> ControlPlane | None:
    """A client of its own to the script's rendezvous store (a TCPStore), for the watchdog; None for one rank
    or a store of another kind (file://), where the watchdog still times every op."""
    if world.world_size < 2:
        return None
    store = c10d._get_default_store()
    while hasattr(store, "underlying_store"):  # env:// under torchrun, and every group, wrap it in prefixes
        store = store.underlying_store
    if not isinstance(store, dist.TCPStore):
        return None
    try:
        return ControlPlane.connect(host=store.host, port=store.port, rank=world.rank, world_size=world.world_size,
                                    within_s=world.timeout_s or 0.0)
    except Exception:
        return None
