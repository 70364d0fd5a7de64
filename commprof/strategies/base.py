"""What every training strategy shares: the loss, one step's skeleton, and the accounting hooks.

A strategy owns the model replica (or shard) of one rank and runs one optimizer step on that rank's
shard of the global batch:

    step = strategy.train_step(micro_batches, phases, measure_memory=last)
    step.loss          # this rank's loss (a float, or a 0-d tensor read after the run)
    step.held_bytes    # {"params": …, "grads": …, "optimizer": …} if measure_memory, else None

Every phase sits in `phases.phase(...)`, every byte goes through `self.comm`. Subclasses fill in
`backward_done` (gradient communication), `optimizer_params` (what the optimizer updates),
`after_step` (e.g. all-gather updated shards), `predict` (analytic payload bytes per step) and, where
they keep buffers of their own, `held_bytes` (what the rank's memory holds).

Memory is a return value of the step that measured it: a rank holds the most right after the optimizer
step, before the gradients are dropped, and only the step itself sees that moment. Counting walks every
tensor inside the "step" phase, so the caller asks for it on one step (the loop: the last) and every
other step returns None. `held_bytes()` says what is counted; `optimizer_step` calls it at that moment.
Exercised by: `pytest tests/test_strategies.py` and `pytest tests/unit/test_fake_comm_models.py -k frozen`.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from commprof.parallel.precision import LossScaler
from commprof.parallel.sizes import tensor_bytes

# torch.autocast's dtype per --precision; fp32 runs without autocast.
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def loss_fn(task: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean loss over the local batch: cross entropy on class logits or on every (unmasked) token."""
    if task == "classify":
        return F.cross_entropy(output.float(), target)
    return F.cross_entropy(output.float().reshape(-1, output.shape[-1]), target.reshape(-1), ignore_index=-100)


def trainable(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def make_optimizer(params, *, name: str, lr: float):
    """SGD with momentum 0.9, or Adam: both elementwise, so a sharded optimizer equals a full one."""
    if not params:  # a pipeline stage of frozen layers only
        return NoOptimizer()
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    return torch.optim.Adam(params, lr=lr)


class NoOptimizer:
    """What a rank with nothing to train steps: nothing."""

    state: dict = {}

    def step(self) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step hands back to its caller."""

    loss: float | torch.Tensor
    """This rank's loss, averaged over its micro-batches (NaN on a rank that computes none: reports_loss); a
    0-d tensor where it is still on the device, read once the run is over (reading it is a host wait)."""
    held_bytes: dict[str, int] | None = None
    """`Strategy.held_bytes()` taken right after the optimizer step, before the gradients are dropped:
    the rank's peak between steps. None unless the step was asked to measure memory."""


class Strategy:
    """One rank's share of data-parallel training. Subclasses name the communication."""

    name = "base"
    needs_comm = True
    model_parallel: str | None = None
    """"pp" or "tp" for strategies that split the model (they take --stages / --tp and --dp)."""
    reports_loss = True
    """Whether this rank's train_step returns the loss (a pipeline's last stage only)."""
    backends: tuple[str, ...] = ("gloo", "nccl", "mpi")

    def __init__(self, *, spec, comm, config) -> None:
        self.spec = spec
        self.model = spec.module
        self.comm = comm
        self.config = config
        self.world_size = comm.world_size if comm is not None else 1
        self.params = trainable(self.model)
        self.device = next(self.model.parameters()).device
        self.scaler = LossScaler(comm=comm, enabled=config.precision == "fp16")
        self.data_rank, self.data_ranks = (comm.rank, comm.world_size) if comm is not None else (0, 1)
        """Which shard of the global batch this rank trains on, of how many (model-parallel ranks share)."""
        self.setup()
        self.optimizer = make_optimizer(self.optimizer_params(), name=config.optimizer, lr=config.lr)

    # ---- what subclasses fill in --------------------------------------------------------------
    def setup(self) -> None:
        """Build buffers and hooks once, before the optimizer exists."""

    def optimizer_params(self) -> list[torch.Tensor]:
        return self.params

    def sync_context(self, last_micro: bool):
        """Context for one micro-batch's forward and backward; comm hooks stay quiet unless it is the last."""
        return nullcontext()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model's output for one micro-batch (a wrapper's, where the strategy wraps the model)."""
        return self.model(x)

    def backward(self, loss: torch.Tensor, phases) -> None:
        """One micro-batch's backward, inside its "backward" phase."""
        with phases.phase("backward"):
            loss.backward()

    def backward_done(self, phases) -> None:
        """Gradient communication still owed after the last backward; leaves averaged grads."""

    def after_step(self, phases) -> None:
        """Work after the optimizer step (e.g. all-gather the updated parameter shards)."""

    def predict(self) -> dict[str, int]:
        """Analytic payload bytes per step, per op name, from the parameter count."""
        return {}

    def predicted_volume(self) -> dict[str, int]:
        """predict(), plus what every strategy shares: fp16's overflow flag (LossScaler.predict)."""
        out = dict(self.predict())
        for op, nbytes in self.scaler.predict().items():
            out[op] = out.get(op, 0) + nbytes
        return out

    def micro_batches(self) -> int:
        """Micro-batches the loop splits this rank's batch into (pipelines: --micro-batches)."""
        return self.config.grad_accum

    def group_sizes(self) -> dict[str, int]:
        """Ranks per group label of the ops this strategy issues (see commprof.record.volume)."""
        return {"world": self.world_size}

    def coords(self) -> dict[str, int]:
        """This rank's place on the rank grid, e.g. {"dp": 1, "pp": 0}; data parallel: {"dp": rank}."""
        return {"dp": self.data_rank}

    def pipeline_figures(self) -> dict | None:
        """Pipeline strategies: stage, boundaries, activation bytes and bubble prediction; else None."""
        return None

    def infer(self, x: torch.Tensor) -> torch.Tensor | None:
        """Logits for held-out inputs, or None on a rank that does not count them (every rank calls it)."""
        return self.model(x)

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole model's state_dict (every rank calls it; sharded strategies gather)."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def held_bytes(self, module: torch.nn.Module | None = None) -> dict[str, int]:
        """Bytes this rank keeps between steps: parameters (of `module`, default the model), gradients,
        optimizer state."""
        module = module if module is not None else self.model
        params = tensor_bytes(p for p in module.parameters())
        grads = tensor_bytes(p.grad for p in module.parameters() if p.grad is not None)
        state = tensor_bytes(v for s in self.optimizer.state.values() for v in s.values()
                             if torch.is_tensor(v) and v.dim() > 0)
        own = {id(p) for p in module.parameters()}
        state += tensor_bytes(p for p in self.optimizer_params() if id(p) not in own)  # shard copies
        return {"params": params, "grads": grads, "optimizer": state}

    # ---- one optimizer step -------------------------------------------------------------------
    def train_step(self, micro_batches, phases, *, measure_memory: bool = False) -> StepResult:
        """Forward + backward over each micro-batch, gradient comm, optimizer step: the loss, and what
        the rank holds if `measure_memory`."""
        total = 0.0  # summed where the loss is, so that no step waits on the device to read it
        n = len(micro_batches)
        dtype = AUTOCAST.get(self.config.precision)
        for i, (x, y) in enumerate(micro_batches):
            with self.sync_context(i == n - 1):  # DDP's no_sync must see the forward too
                with phases.phase("forward"):
                    with torch.autocast(self.device.type, dtype=dtype) if dtype else nullcontext():
                        loss = loss_fn(self.spec.task, self.forward(x), y) / n
                self.backward(self.scaler.scale(loss), phases)
            total = total + loss.detach().double()  # as a Python float sum of them adds
        self.backward_done(phases)
        return StepResult(total, self.optimizer_step(phases, measure_memory))

    def optimizer_step(self, phases, measure_memory: bool) -> dict[str, int] | None:
        """Unscale and check (fp16), step, drop the gradients; `held_bytes()` if `measure_memory`."""
        held = None
        with phases.phase("step"):
            if self.scaler.unscale_and_check(self.optimizer_params()):
                self.optimizer.step()
            if measure_memory:  # before the gradients are dropped: what the step holds at its peak
                held = self.held_bytes()
            self.optimizer.zero_grad(set_to_none=True)
            self.model.zero_grad(set_to_none=True)
        self.after_step(phases)
        return held
