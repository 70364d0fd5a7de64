"""`single`: one process, no communication — the baseline every other strategy must match.

    commprof run --strategy single --model mnist-cnn --batch-size 64

With the same global batch (its --batch-size = the per-rank batch × ranks of the run it is compared
with), `single` and every data-parallel strategy reach the same parameters after the same steps.
Exercised by: `pytest tests/test_strategies.py`.
"""

from __future__ import annotations

from commprof.strategies.base import Strategy


class Single(Strategy):
    """Plain training loop on one rank."""

    name = "single"
    needs_comm = False
