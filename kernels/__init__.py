"""commprof.kernels: hand-written collective algorithms built only on point-to-point send/recv
through a `commprof.comm.Comm`, so every step is timed, counted and NVTX-wrapped like any other op,
and each step sits in its own NVTX range (`<algorithm>::…::step<k>`).

Every algorithm is one module with the same small interface (as nccl-tests' collectives are):

  COLLECTIVE, NAME      which collective it implements, and its name (`commprof bench --algo NAME`)
  run(comm, …)          the collective, with the signature of the Comm method of the same name
  expected(inputs, rank, op, root)   what rank `rank` must end with (kernels.reference)
  sent_bytes(n, rank, count, itemsize, root)   bytes rank `rank` sends in one call
  steps(n, nbytes)      communication steps on the critical path
  cost(n, nbytes, alpha, beta)   the latency–bandwidth (α–β) model of one call, in seconds
  MODES                 (optional) in-place flags it runs; both by default

`count` and `nbytes` follow nccl-tests: the whole vector for all_reduce and broadcast, world_size ×
the per-rank chunk for all_gather, reduce_scatter and all_to_all. Installed as the subpackage
`commprof.kernels`. Exercised by: `pytest tests/unit/test_algorithm_models.py tests/test_kernels.py`.
"""

from __future__ import annotations

import importlib
from functools import partial
from types import ModuleType

from commprof.base.backends import FLOATING

__all__ = ["ALGORITHMS", "CATALOG", "LIBRARY", "names", "implements", "find", "modes", "bind", "unsupported"]

LIBRARY = "library"
"""The backend's own collective (`--algo library`, the default)."""

CATALOG: dict[str, dict[str, str]] = {
    "all_reduce": {
        "ring": "all_reduce_ring",
        "recursive_doubling": "all_reduce_recursive_doubling",
        "rabenseifner": "all_reduce_rabenseifner",
        "binary_tree": "all_reduce_binary_tree",
    },
    "all_gather": {
        "ring": "all_gather_ring",
        "recursive_doubling": "all_gather_recursive_doubling",
        "bruck": "all_gather_bruck",
    },
    "reduce_scatter": {
        "ring": "reduce_scatter_ring",
        "recursive_halving": "reduce_scatter_recursive_halving",
    },
    "broadcast": {
        "binomial_tree": "broadcast_binomial_tree",
        "chain": "broadcast_chain",
    },
    "all_to_all": {
        "pairwise": "all_to_all_pairwise",
    },
}
"""Collective -> algorithm name -> module name: what the launcher checks --algo against, before any rank
loads torch and the modules themselves."""


def __getattr__(name: str):
    if name == "ALGORITHMS":  # collective -> algorithm name -> module, loaded when first asked for
        loaded = globals()["ALGORITHMS"] = {c: {a: find(c, a) for a in by_name} for c, by_name in CATALOG.items()}
        return loaded
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def names() -> list[str]:
    """Every algorithm name, each once, in CATALOG order."""
    return list(dict.fromkeys(name for by_name in CATALOG.values() for name in by_name))


def implements(collective: str, name: str) -> bool:
    """Whether algorithm `name` implements `collective`."""
    return name in CATALOG.get(collective, {})


def find(collective: str, name: str) -> ModuleType | None:
    """The module implementing `collective` as `name`, or None."""
    module = CATALOG.get(collective, {}).get(name)
    return importlib.import_module(f"{__name__}.{module}") if module else None


def unsupported(dtype: str, op: str | None) -> str | None:
    """Why the hand-written algorithms cannot reduce `dtype` (a name) with `op`, or None."""
    if op == "avg" and dtype not in FLOATING:
        return "avg of integers has no single rounding rule"
    return None


def modes(module: ModuleType) -> tuple[bool, ...]:
    """In-place flags the algorithm runs (out-of-place first, as nccl-tests' columns)."""
    return getattr(module, "MODES", (False, True))


class AlgorithmComm:
    """A Comm whose `<collective>` method runs a hand-written algorithm on it; everything else
    (rank, world_size, send, recorder, …) is the Comm's own. The bench's prepared cases call it
    exactly as they call a Comm."""

    def __init__(self, comm, module: ModuleType) -> None:
        self._comm = comm
        setattr(self, module.COLLECTIVE, partial(module.run, comm))

    def __getattr__(self, name: str):
        return getattr(self._comm, name)


def bind(comm, module: ModuleType) -> AlgorithmComm:
    """`comm`, with `module`'s collective run by `module`."""
    return AlgorithmComm(comm, module)
