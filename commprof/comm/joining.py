"""A rank's way into its job, the same for every command: its injected start-up faults, its check-in with the
job folder, and its rendezvous under the start-up deadline, rank 0's TCPStore bound to the job's address.

    joining = Joining(world, timeout_s=60)       # COMMPROF_FAULT's at=start faults fire here
    joining.check_in()                           # every rank's pid in the job folder (base/job.py)
    joining.meet(init, store=(addr, port))       # under the deadline (base/deadline.py): the at=init faults,
                                                 # rank 0's store (comm/store.py), then init(store)

`init_comm` (comm/__init__.py) takes the three steps in a row, its Comm made in `init`. `commprof profile`
checks in before the script runs and meets its peers when the script calls init_process_group
(intercept/groups.py: torch's own init in `init`, with the script's timeout and `env_store()`).
Exercised by: `pytest tests/test_failures.py -k start_up` and `pytest tests/test_profile_failures.py`.
"""

from __future__ import annotations

import os
from typing import Callable, TypeVar

from commprof.base import deadline, job
from commprof.base.world import World
from commprof.comm.failure.faults import Injector
from commprof.comm.store import open_store

T = TypeVar("T")


class Joining:
    """One rank joining its job: made as the rank starts, before it touches the network."""

    def __init__(self, world: World, *, timeout_s: float) -> None:
        self.world = world
        self.timeout_s = timeout_s
        """--timeout: how long the check-in and the rendezvous may take, where a call names no timeout of its own."""
        self.fault = Injector.for_rank(world.rank)
        """This rank's injected faults (COMMPROF_FAULT), or None; the at=start ones have fired."""
        if self.fault is not None:
            self.fault.start()

    def check_in(self) -> None:
        """Leave this rank's pid in the job folder and wait for every rank's: before MPI_Init or a rendezvous,
        both of which hold the interpreter, so that no watchdog could see a stopped peer there."""
        job.check_in(self.world.rank, self.world.world_size, timeout_s=self.timeout_s)

    def meet(self, init: Callable[[object], T], *, what: str = "the rendezvous", timeout_s: float | None = None,
             store: tuple[str, int] | None = None, faults_first: bool = False) -> T:
        """`init(store)` under the start-up deadline — `what` named in its line, `timeout_s` (default --timeout)
        + its slack — after the at=init faults: `store` is rank 0's TCPStore at that address, opened here,
        or None where `init` makes its own. `faults_first`: fire the at=init faults before the deadline
        starts, as `profile` does: a rank stopped there is then named by a peer's deadline, not its own."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        if faults_first:
            self._init_faults()
        with deadline.guard(what, timeout_s=timeout_s, rank=self.world.rank):
            if not faults_first:
                self._init_faults()
            opened = None if store is None else open_store(*store, rank=self.world.rank,
                                                           world_size=self.world.world_size, timeout_s=timeout_s)
            return init(opened)

    def env_store(self) -> tuple[str, int] | None:
        """Where commprof serves the store for an env:// rendezvous: the job's address, when the variables are
        the job's (as `profile` set them, profile/rendezvous.py) and no torchrun agent serves one already."""
        env = os.environ
        if (env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and env.get("RANK") == str(self.world.rank)
                and env.get("WORLD_SIZE") == str(self.world.world_size) and "MASTER_PORT" in env):
            return env["MASTER_ADDR"], int(env["MASTER_PORT"])
        return None

    def _init_faults(self) -> None:
        if self.fault is not None:
            self.fault.start("init")
