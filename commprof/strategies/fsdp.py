"""`fsdp`: ZeRO-3 — parameters, gradients and optimizer state all sharded, per wrapped unit.

    commprof run --strategy fsdp --model gpt2 --nproc 2 --prefetch

The model's units (resnet stages, transformer blocks, …; the rest of the parameters form a root unit)
each keep only a 1/world_size shard of their flat parameter vector between uses. The unit's parameters
are views into a full buffer whose storage is allocated and all-gathered just before the unit's
forward, released after it, all-gathered again just before the unit's backward (a hook on its output's
gradient) and released once every gradient of the unit has arrived, when the flat gradient is
reduce-scattered (async) so each rank keeps the reduced gradient of its shard only. The root unit is
gathered once per step and kept until backward is done. With --prefetch, the next unit's all_gather
is issued as soon as the current one starts (forward order in forward, reverse order in backward).
Communication per step: all_gather of every unit's bytes twice (the root's once), reduce_scatter once.
Frozen parameters are not sharded (they need no gradient exchange) and stay on every rank.
Exercised by: `pytest tests/unit/test_fake_comm_strategies.py` and `pytest tests/test_strategies.py -k cnn`.
"""

from __future__ import annotations

import torch

from commprof.parallel.flat import FlatShards
from commprof.parallel.sizes import tensor_bytes
from commprof.strategies.base import Strategy, trainable


class Unit:
    """One wrapped module: its flat shard, its full buffer (storage freed when unused), its ops."""

    def __init__(self, module, params, *, rank: int, world_size: int, root: bool) -> None:
        self.module, self.root = module, root
        self.flat = FlatShards(params, rank=rank, world_size=world_size)
        self.full = self.flat.empty()
        for p, view in zip(params, self.flat.views(self.full)):
            p.data = view
        self.full_bytes = self.full.untyped_storage().nbytes()
        self.gathered = True
        self.gather_handle = None
        self.grads_seen = 0
        self.grad_sum = None
        """This rank's reduced gradient shard, summed over micro-batches."""
        self.free()

    def free(self) -> None:
        self.full.untyped_storage().resize_(0)
        self.gathered = False

    def gather(self, comm, async_op: bool) -> None:
        """Re-allocate the full buffer and all-gather the shards into it."""
        if self.gathered or self.gather_handle is not None:
            return
        self.full.untyped_storage().resize_(self.full_bytes)
        with torch.no_grad():
            handle = comm.all_gather(self.full, self.flat.shard.detach(), async_op=async_op)
        if async_op:
            self.gather_handle = handle
        else:
            self.gathered = True

    def ready(self, comm) -> None:
        """Make sure the full parameters are here (wait on a prefetch, or gather now)."""
        if self.gather_handle is not None:
            self.gather_handle.wait()
            self.gather_handle = None
            self.gathered = True
        self.gather(comm, async_op=False)


class FSDP(Strategy):
    """Fully sharded data parallel on Comm."""

    name = "fsdp"

    def setup(self) -> None:
        rank, k = self.comm.rank, self.world_size
        seen: set[int] = set()
        self.units: list[Unit] = []
        for module in self.spec.units:
            params = [p for p in trainable(module) if id(p) not in seen]
            seen.update(id(p) for p in params)
            if params:
                self.units.append(Unit(module, params, rank=rank, world_size=k, root=False))
        rest = [p for p in self.params if id(p) not in seen]
        self.root = Unit(self.model, rest, rank=rank, world_size=k, root=True) if rest else None
        self._pending: list[tuple[Unit, object, torch.Tensor]] = []
        self._in_backward = False
        self._order = {u: i for i, u in enumerate(self.units)}
        for unit in self.units:
            unit.module.register_forward_pre_hook(lambda m, a, u=unit: self._pre_forward(u))
            unit.module.register_forward_hook(lambda m, a, out, u=unit: self._post_forward(u, out))
        for unit in self.all_units():
            for p in unit.flat.params:
                p.register_post_accumulate_grad_hook(lambda p, u=unit: self._on_grad(u))
        if self.root is not None:
            self.model.register_forward_pre_hook(lambda m, a: self.root.ready(self.comm))

    def all_units(self) -> list[Unit]:
        return self.units + ([self.root] if self.root is not None else [])

    def optimizer_params(self):
        return [u.flat.shard for u in self.all_units()]

    # ---- forward ------------------------------------------------------------------------------
    def _pre_forward(self, unit: Unit) -> None:
        unit.ready(self.comm)
        if self.config.prefetch and not self._in_backward:
            nxt = self._order[unit] + 1
            if nxt < len(self.units):
                self.units[nxt].gather(self.comm, async_op=True)

    def _post_forward(self, unit: Unit, out) -> None:
        if self._in_backward:  # activation recomputation inside backward: keep the parameters
            return
        unit.free()
        first = out[0] if isinstance(out, (tuple, list)) else out
        if torch.is_grad_enabled() and torch.is_tensor(first) and first.requires_grad:
            first.register_hook(lambda grad, u=unit: self._pre_backward(u, grad))

    # ---- backward -----------------------------------------------------------------------------
    def _pre_backward(self, unit: Unit, grad):
        self._in_backward = True
        unit.ready(self.comm)
        if self.config.prefetch:
            prev = self._order[unit] - 1
            if prev >= 0:
                self.units[prev].gather(self.comm, async_op=True)
        return grad

    def _on_grad(self, unit: Unit) -> None:
        unit.grads_seen += 1
        if unit.grads_seen == len(unit.flat.params):
            self._reduce(unit)

    def _reduce(self, unit: Unit) -> None:
        """Reduce-scatter the unit's gradient (async) and drop the full gradient and parameters."""
        full_grad = unit.flat.grads()
        for p in unit.flat.params:
            p.grad = None
        shard = full_grad.new_empty(unit.flat.shard_numel)
        handle = self.comm.reduce_scatter(shard, full_grad, async_op=True)
        self._pending.append((unit, handle, shard, full_grad))
        unit.grads_seen = -1  # reduced for this micro-batch
        if not unit.root:
            unit.free()

    def _micro_done(self) -> None:
        for unit in self.all_units():  # units that got no gradient: reduce zeros, same ops everywhere
            if unit.grads_seen != -1:
                self._reduce(unit)
        for unit, handle, shard, _full in self._pending:
            handle.wait()
            unit.grad_sum = shard if unit.grad_sum is None else unit.grad_sum.add_(shard)
        self._pending = []
        for unit in self.all_units():
            unit.grads_seen = 0
            if unit.gather_handle is not None:  # a prefetch nobody used
                unit.ready(self.comm)
            unit.free()
        self._in_backward = False

    def sync_context(self, last_micro: bool):
        return _AfterBackward(self._micro_done)

    def backward_done(self, phases) -> None:
        for unit in self.all_units():
            unit.flat.shard.grad = unit.grad_sum.div_(self.world_size)
            unit.grad_sum = None

    def predict(self) -> dict[str, int]:
        micro = self.config.grad_accum
        gathers = sum(2 * u.flat.nbytes() for u in self.units)
        gathers += self.root.flat.nbytes() if self.root is not None else 0
        scatters = sum(u.flat.nbytes() for u in self.all_units())
        return {"all_gather": micro * gathers, "reduce_scatter": micro * scatters}

    def full_state(self) -> dict[str, torch.Tensor]:
        for unit in self.all_units():
            unit.gather(self.comm, async_op=False)
        state = super().full_state()
        for unit in self.all_units():
            unit.free()
        return state

    def held_bytes(self) -> dict[str, int]:
        params = sum(u.full.untyped_storage().nbytes() + u.flat.shard.nbytes for u in self.all_units())
        sharded = {id(p) for u in self.all_units() for p in u.flat.params}
        params += tensor_bytes(p for p in self.model.parameters() if id(p) not in sharded)
        grads = tensor_bytes(u.flat.shard.grad for u in self.all_units() if u.flat.shard.grad is not None)
        state = tensor_bytes(v for s in self.optimizer.state.values() for v in s.values()
                             if torch.is_tensor(v) and v.dim() > 0)
        return {"params": params, "grads": grads, "optimizer": state}


class _AfterBackward:
    """Runs `fn` when a micro-batch's backward block exits (inside the backward phase)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.fn()
        return False
