"""Functional collectives (`torch.distributed._functional_collectives`: what DTensor redistribution, tensor
parallel layers and `torch.compile`d code call) counted as they run, so a profile can say they were there.

They return tensors that complete later, through ops dispatched to c10d from C++, so Comm cannot time them;
counting the Python calls is what can be done honestly. Calls made inside a compiled graph never reach
Python and stay uncounted.

    functional.install(counter)   # counter["functional all_reduce"] += 1 per call, the call unchanged
    functional.uninstall()

Exercised by: `pytest tests/test_profile_cli.py -k functional`.
"""

from __future__ import annotations

from functools import wraps

import torch.distributed._functional_collectives as funcol

NAMES = ("all_reduce", "all_reduce_coalesced", "all_gather_tensor", "all_gather_tensor_autograd",
         "all_gather_single", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
         "reduce_scatter_tensor_autograd", "reduce_scatter_single", "reduce_scatter_tensor_coalesced",
         "all_to_all_single", "all_to_all_single_autograd", "broadcast", "permute_tensor")
"""The public functional collectives counted (those this torch has)."""

_SAVED: dict = {}


def install(counter) -> None:
    """Count every call of a functional collective in `counter` under "functional <name>"."""
    for name in NAMES:
        original = getattr(funcol, name, None)
        if original is None or name in _SAVED:
            continue
        _SAVED[name] = original
        setattr(funcol, name, _counted(original, counter, f"functional {name}"))


def _counted(original, counter, key: str):
    @wraps(original)
    def call(*args, **kwargs):
        counter[key] += 1
        return original(*args, **kwargs)
    return call


def uninstall() -> None:
    for name, original in _SAVED.items():
        setattr(funcol, name, original)
    _SAVED.clear()
