"""The script's default process group, seen as torch makes it, whoever asked for it.

    groups.install(adopt)    # adopt(pg) once the default group exists
    groups.uninstall()

A script may make its default group without calling `torch.distributed.init_process_group` by that name:
`init_device_mesh` calls the function it imported from distributed_c10d when it was loaded, and so may any
library that imported it before commprof rebound the name. Every one of them ends in distributed_c10d's
`_update_default_pg(pg)`, which it looks up at call time: wrapped here, the group is adopted — watched, traced,
gathered from at the end — however it was made.

Exercised by: `pytest tests/test_profile_compiled.py` (its fsdp_tp mode: a 2-D mesh from init_device_mesh alone).
"""

from __future__ import annotations

from torch.distributed import distributed_c10d as c10d

from commprof.intercept.opaque import opaque

_SAVED: dict = {}


def install(adopt) -> None:
    """Call `adopt(pg)` each time torch makes `pg` the default group (nothing when `adopt` is None)."""
    if _SAVED or adopt is None:
        return
    _SAVED.update(update=c10d._update_default_pg)

    def update(pg) -> None:
        _SAVED["update"](pg)
        if pg is not None:
            # what init_process_group records next, recorded first: adopting the group asks for its ranks
            c10d._world.pg_group_ranks.setdefault(pg, {i: i for i in range(pg.size())})
            adopt(pg)

    c10d._update_default_pg = opaque(update)


def uninstall() -> None:
    if _SAVED:
        c10d._update_default_pg = _SAVED.pop("update")
