"""Dynamic loss scaling for fp16 training, agreed across ranks.

fp16 gradients underflow unless the loss is scaled up before backward; the scale halves when a step
produced inf/NaN (the step is skipped) and doubles after `growth_interval` clean steps. With sharded
gradients (zero2, fsdp) each rank sees only its shard, so the "found inf" flag is all-reduced (max)
through the Comm — 4 bytes per step, counted like any other op — and every rank skips together.
Exercised by: `pytest tests/test_run_cli.py -k mixed_precision`.
"""

from __future__ import annotations

import torch


class LossScaler:
    """Scales the loss, unscales the gradients and decides whether the optimizer may step."""

    def __init__(self, *, comm, enabled: bool, init_scale: float = 2.0 ** 16, growth_interval: int = 2000) -> None:
        self.comm = comm if comm is not None and comm.world_size > 1 else None
        self.enabled = enabled
        self.scale_value = init_scale
        self.growth_interval = growth_interval
        self._clean = 0
        self.skipped = 0
        """Steps skipped for inf/NaN gradients."""

    def predict(self) -> dict[str, int]:
        """Payload bytes per step: the found-inf flag's all_reduce, where there are peers to agree with."""
        return {"all_reduce": 4} if self.enabled and self.comm is not None else {}

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value if self.enabled else loss

    def unscale_and_check(self, params) -> bool:
        """Unscale the gradients of `params`; False (skip the step) if any rank saw inf or NaN."""
        if not self.enabled:
            return True
        grads = [p.grad for p in params if p.grad is not None]
        found = torch.zeros(1, dtype=torch.float32, device=grads[0].device if grads else "cpu")
        for g in grads:
            g.mul_(1.0 / self.scale_value)
            found.add_((~torch.isfinite(g)).any().float())
        if self.comm is not None:
            self.comm.all_reduce(found, op="max")
        if found.item() > 0:
            self.scale_value /= 2.0
            self._clean = 0
            self.skipped += 1
            return False
        self._clean += 1
        if self._clean % self.growth_interval == 0:
            self.scale_value *= 2.0
        return True
