"""Bytes of a run of tensors: what memory figures (`Strategy.held_bytes`) and payload predictions
(`Strategy.predict`, `grid.replica_volume`) count.

Exercised by: `pytest tests/test_strategies.py` (every predicted payload equals the measured one).
"""

from __future__ import annotations


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
