"""The latency–bandwidth (α–β, Hockney) model of one point-to-point exchange, fitted to the sendrecv
sweep of the same run: t(m) = α + β·m for m bytes sent (and received) by every rank at once.

The fit minimises the relative error Σ((α + β m)/t − 1)², so 8-byte and 64-MiB points weigh
alike (a plain least-squares fit would let the largest sizes decide α, often below zero). Both
parameters are kept non-negative. The kernels' `cost(n, nbytes, alpha, beta)` turn it into a
prediction for each algorithm. Exercised by: `pytest tests/unit/test_algorithm_models.py tests/test_bench_algo.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted α–β model."""

    alpha_s: float
    """Per-message latency α (seconds)."""
    beta_s_per_byte: float
    """Per-byte time β (seconds per byte); 1/β is the fitted bandwidth."""
    points: int
    """Sizes the fit used."""
    max_rel_err: float
    """Largest |model − measured| / measured over those sizes."""

    def predict_s(self, nbytes: float) -> float:
        return self.alpha_s + self.beta_s_per_byte * nbytes

    def as_record(self) -> dict:
        return {"alpha_us": self.alpha_s * 1e6, "beta_ns_per_B": self.beta_s_per_byte * 1e9,
                "bandwidth_GBps": (1 / self.beta_s_per_byte / 1e9) if self.beta_s_per_byte else None,
                "points": self.points, "max_rel_err": self.max_rel_err}


def fit(points: list[tuple[int, float]]) -> AlphaBeta | None:
    """Fit (nbytes, seconds) pairs; None without two distinct positive sizes with positive times."""
    pts = [(m, t) for m, t in points if m > 0 and t > 0]
    if len({m for m, _ in pts}) < 2:
        return None
    m = np.array([p[0] for p in pts], dtype=np.float64)
    t = np.array([p[1] for p in pts], dtype=np.float64)
    rows = np.stack([np.ones_like(m), m], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(rows, np.ones_like(t), rcond=None)
    if beta < 0:  # latency alone explains the sizes measured
        alpha, beta = float(np.sum(1 / t) / np.sum(1 / t ** 2)), 0.0
    elif alpha < 0:  # bandwidth alone
        alpha, beta = 0.0, float(np.sum(m / t) / np.sum((m / t) ** 2))
    err = float(np.max(np.abs((alpha + beta * m) / t - 1)))
    return AlphaBeta(alpha_s=float(alpha), beta_s_per_byte=float(beta), points=len(pts), max_rel_err=err)
