"""The script's default process group, from its birth to its death: made by the script's init_process_group
with commprof's defaults and the job's rendezvous, adopted however it was made, told of before it goes.

    group = groups.DefaultGroup(joining, backend="gloo", adopt=adopt, dying=dying)
    group.install()      # adopt(pg, timeout_s) once the default group exists; dying() before it is destroyed
    group.uninstall()

Born: `init_process_group`, by torch.distributed's and distributed_c10d's names, gets the job's backend and
--timeout where the script names none, and meets its peers through the rank's Joining (comm/joining.py): under
the start-up deadline, an env:// rendezvous on rank 0's store bound to the job's address.
Adopted: a script may make its default group without calling `init_process_group` by those names:
`init_device_mesh` calls the function it imported from distributed_c10d when it was loaded, and so may any
library that imported it before commprof rebound the name. Every one of them ends in distributed_c10d's
`_update_default_pg(pg)`, which it looks up at call time: wrapped here, the group is adopted — watched, traced,
gathered from at the end — however it was made.
Dying: `destroy_process_group()` of the default group calls `dying()` while the group still exists (`profile`
gathers every rank's figures over it then).

Exercised by: `pytest tests/test_profile_compiled.py` (its fsdp_tp mode: a 2-D mesh from init_device_mesh alone)
and `pytest tests/test_profile_cli.py tests/test_profile_failures.py`.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from commprof.intercept.opaque import opaque


class DefaultGroup:
    """The default group's hooks: installed once, removed by uninstall, whatever was installed."""

    def __init__(self, joining=None, *, backend: str | None = None, adopt=None, dying=None) -> None:
        self.joining = joining
        """The rank's Joining (comm/joining.py): the script's init_process_group meets its peers through it;
        None leaves init_process_group torch's own."""
        self.backend = backend
        """The backend the group gets where the script names none (None: torch's choice)."""
        self.adopt = adopt
        """Called with the default group and its timeout once torch has made it, however it was made."""
        self.dying = dying
        """Called before the default group is destroyed, while it exists."""
        self.timeout_s = joining.timeout_s if joining is not None else None
        """The group's timeout: the script's own where it gave one to init_process_group, else --timeout."""
        self._saved: dict = {}

    def install(self) -> None:
        if self._saved:
            return
        if self.adopt is not None:
            self._saved.update(update=c10d._update_default_pg)
            c10d._update_default_pg = opaque(self._update)
        # both names: a library may call distributed_c10d's (one that imported it earlier holds torch's own, and
        # its group is adopted all the same: _update above)
        if self.joining is not None:
            self._saved.update(init=(dist.init_process_group, c10d.init_process_group))
            dist.init_process_group = c10d.init_process_group = self._init
        if self.dying is not None:
            self._saved.update(destroy=(dist.destroy_process_group, c10d.destroy_process_group))
            dist.destroy_process_group = c10d.destroy_process_group = self._destroy

    def uninstall(self) -> None:
        if "update" in self._saved:
            c10d._update_default_pg = self._saved.pop("update")
        if "init" in self._saved:
            dist.init_process_group, c10d.init_process_group = self._saved.pop("init")
        if "destroy" in self._saved:
            dist.destroy_process_group, c10d.destroy_process_group = self._saved.pop("destroy")

    def _init(self, backend=None, init_method=None, timeout=None, *args, **kwargs):
        """The script's init_process_group by torch.distributed's names: commprof's defaults (the job's backend,
        --timeout, a store bound to the job's address) and a deadline on the rendezvous."""
        if backend is None:
            backend = self.backend
        if timeout is None:
            timeout = timedelta(seconds=self.joining.timeout_s)
        self.timeout_s = timeout.total_seconds()
        world = self.joining.world
        # an env:// init whose variables are the job's meets on rank 0's store bound to the job's address, not
        # every interface (comm/store.py)
        plain = init_method in (None, "env://") and not args and "store" not in kwargs
        store_at = self.joining.env_store() if plain else None

        def init(store) -> None:
            method = init_method
            if store is not None:
                kwargs.update(store=store, rank=world.rank, world_size=world.world_size)
                method = None
            self._saved["init"][1](backend, method, timeout, *args, **kwargs)

        # the at=init faults before the deadline starts, as profile has always fired them
        self.joining.meet(init, timeout_s=self.timeout_s, store=store_at, faults_first=True)

    def _update(self, pg) -> None:
        self._saved["update"](pg)
        if pg is not None:
            # what init_process_group records next, recorded first: adopting the group asks for its ranks
            c10d._world.pg_group_ranks.setdefault(pg, {i: i for i in range(pg.size())})
            self.adopt(pg, self.timeout_s)

    def _destroy(self, group=None):
        if group is None and c10d.is_initialized():
            self.dying()
        self._saved["destroy"][1](group)
