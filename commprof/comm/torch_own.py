"""torch's own `distributed_c10d` functions, kept as they were before anything rebinds them, and a way to
run torch's code as torch's own while a script is interposed.

comm/interpose.py rebinds names of `torch.distributed.distributed_c10d` itself, so that a call by that
module's name, and torch's own helpers that call those names (`all_gather_object` calls `all_gather`,
`broadcast_object_list` calls `broadcast`), reach Comm. Comm's own calls into torch must not: TorchComm
calls the functions kept here, and whatever runs inside `own()` on a thread — Comm's object exchanges,
whose torch bodies call the module's rebound names, and a call interpose leaves to torch — finds torch's
own functions behind every rebound name.

    with torch_own.own():
        dist.gather_object(obj, out, dst=0, group=group)   # its inner all_gather and gather: torch's own

Exercised by: `pytest tests/test_interpose.py`.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from types import SimpleNamespace

from torch.distributed import distributed_c10d as _module

c10d = SimpleNamespace(**{name: value for name, value in vars(_module).items()
                          if callable(value) and not name.startswith("__")})
"""distributed_c10d's functions and classes as torch defined them (taken when commprof is imported, before
anything of commprof's rebinds one): `c10d.all_reduce(...)` is torch's all_reduce whatever the module's name
is bound to now."""

_STATE = threading.local()


@contextmanager
def own():
    """While inside, on this thread, every rebound name of distributed_c10d calls torch's own function."""
    _STATE.depth = getattr(_STATE, "depth", 0) + 1
    try:
        yield
    finally:
        _STATE.depth -= 1


def active() -> bool:
    """Whether this thread is inside `own()`."""
    return getattr(_STATE, "depth", 0) > 0
