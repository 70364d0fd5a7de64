"""`pipeline-gpipe` and `pipeline-1f1b`: the model's layer chain cut into stages, one rank each, the
batch split into micro-batches, activations and their gradients moved between neighbours by send/recv.

    commprof run --strategy pipeline-gpipe --model gpt2 --nproc 4 --micro-batches 8
    commprof run --strategy pipeline-1f1b --model gpt2-tiny --nproc 4 --dp 2 --stages 2

Stage s receives its input from stage s−1 (blocking recv: the time it waits is the pipeline bubble),
runs its layers, and sends the output on (isend: it computes on while the bytes travel); backward
mirrors it with the gradient of that output. Each boundary b→b+1 is its own two-rank group, so the
op log and the volume table say which boundary every byte crossed. With --dp > 1, each stage's
gradients are averaged over the replicas by one flat all_reduce before the step. Every rank builds the
whole model from the seed (identical weights everywhere) and trains only its stage's layers.
Exercised by: `pytest tests/unit/test_fake_comm_models.py tests/test_pipeline.py`.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch

from commprof.base.errors import UsageError
from commprof.parallel.grid import average_gradients, build_grid, degrees, replica_volume
from commprof.parallel.partition import balanced_starts, describe, explicit_starts, param_costs, time_costs
from commprof.parallel.schedule import bubble_fraction, gpipe, one_f_one_b, peak_in_flight
from commprof.strategies.base import AUTOCAST, StepResult, Strategy, loss_fn, make_optimizer, trainable


def link_label(b: int) -> str:
    return f"pp {b}→{b + 1}"


class PipelineGPipe(Strategy):
    """GPipe: every micro-batch forward, then every micro-batch backward."""

    name = "pipeline-gpipe"
    model_parallel = "pp"
    schedule = staticmethod(gpipe)

    def setup(self) -> None:
        cfg = self.config
        dp, p = degrees(self.world_size, dp=cfg.dp, inner=cfg.pp, flag="--stages")
        if p < 2:
            raise UsageError(f"strategy {self.name} needs at least 2 stages (--stages), got {p}")
        self.grid = build_grid(self.comm, dp=dp, inner=p, label="pp")
        self.stage, self.stages = self.grid.inner_index, p
        self.data_rank, self.data_ranks = self.grid.dp_index, dp
        self.last = self.stage == p - 1
        self.reports_loss = self.last
        self.links = {}
        """Boundary b → the Comm of stages b (rank 0 in it) and b+1 (rank 1) of this replica."""
        for d in range(dp):
            for b in range(p - 1):
                link = self.comm.new_group([d * p + b, d * p + b + 1], label=link_label(b))
                if link is not None:
                    self.links[b] = link
        layers = self.spec.layers
        if cfg.cuts:
            self._cut(explicit_starts(cfg.cuts, p, len(layers)))
        elif cfg.balance == "params":
            self._cut(balanced_starts(param_costs(layers), p))
        else:
            balanced_starts([1.0] * len(layers), p)  # fails now, not at the first step, if p > layers
            self.starts = None  # measured on the first micro-batch
        self._shapes: dict = {}
        self._flat: dict = {}
        self.peak_activation_bytes = 0
        self.micro_activation_bytes: list[int] = []
        self.m = cfg.micro_batches

    def _cut(self, starts: list[int]) -> None:
        self.starts = starts
        layers = self.spec.layers
        ends = [*starts[1:], len(layers)]
        self.stage_module = torch.nn.Sequential(*layers[starts[self.stage]:ends[self.stage]])
        self.params = trainable(self.stage_module)
        # Boundary b carries a gradient back only if some stage at or before b trains something.
        self.needs_grad = [any(p.requires_grad for layer in layers[:ends[b]] for p in layer.parameters())
                           for b in range(self.stages - 1)]
        self._param_storage = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
        mine = {id(t) for t in (*self.stage_module.parameters(), *self.stage_module.buffers())}
        self._owned = {name for name, t in self.model.state_dict(keep_vars=True).items() if id(t) in mine}

    def optimizer_params(self) -> list[torch.Tensor]:
        return self.params if self.starts is not None else trainable(self.model)  # replaced once cut

    def micro_batches(self) -> int:
        return self.config.micro_batches

    def _plan(self, x: torch.Tensor) -> list[tuple]:
        """Partition (once, if by time) and the (shape, dtype) crossing each boundary for input `x`."""
        if self.starts is None:
            costs = time_costs(self.model, self.spec.layers, x) if self.comm.rank == 0 else None
            self._cut(balanced_starts(self.comm.broadcast_object(costs, src=0), self.stages))
            self.optimizer = make_optimizer(self.params, name=self.config.optimizer, lr=self.config.lr)
        key = (tuple(x.shape), x.dtype)
        if key not in self._shapes:
            shapes, was = [], self.model.training
            self.model.eval()  # shapes only: no BatchNorm statistics may move
            with torch.no_grad(), self._autocast():
                h = x
                for b in range(self.stages - 1):
                    for layer in self.spec.layers[self.starts[b]:self.starts[b + 1]]:
                        h = layer(h)
                    shapes.append((tuple(h.shape), h.dtype))
            self.model.train(was)
            self._shapes[key] = shapes
        return self._shapes[key]

    def _autocast(self):
        dtype = AUTOCAST.get(self.config.precision)
        return torch.autocast(self.device.type, dtype=dtype) if dtype else nullcontext()

    def _receive(self, b: int, shape, dtype, src: int) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        self.links[b].recv(buf, src=src)
        return buf

    @contextmanager
    def _saved(self):
        """Distinct storages autograd saves for backward inside the block, parameters excluded."""
        seen: dict[int, int] = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in self._param_storage:
                seen[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield seen

    def train_step(self, micro_batches, phases, *, measure_memory: bool = False) -> StepResult:
        s, m = self.stage, len(micro_batches)
        self.m = m
        shapes = self._plan(micro_batches[0][0])
        stash, sends, sizes = {}, [], {}
        live = total = 0
        for kind, i in self.schedule(m, self.stages, s):
            if kind == "F":
                x, y = micro_batches[i]
                inp = x
                if s > 0:
                    inp = self._receive(s - 1, *shapes[s - 1], src=0).requires_grad_(self.needs_grad[s - 1])
                with phases.phase("forward"), self._autocast(), self._saved() as seen:
                    out = self.stage_module(inp)
                    if self.last:
                        out = loss_fn(self.spec.task, out, y) / m
                for t in (inp, out) if s > 0 else (out,):
                    seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
                sizes[i] = sum(seen.values())
                live += sizes[i]
                self.peak_activation_bytes = max(self.peak_activation_bytes, live)
                stash[i] = (inp, out)
                if not self.last:
                    data = out.detach().contiguous()
                    sends.append((self.links[s].isend(data, dst=1), data))
            else:
                inp, out = stash.pop(i)
                if self.last:
                    total += out.item()
                    with phases.phase("backward"):
                        self.scaler.scale(out).backward()
                elif self.needs_grad[s]:
                    grad = self._receive(s, *shapes[s], src=1)
                    with phases.phase("backward"):
                        torch.autograd.backward(out, grad)
                if s > 0 and self.needs_grad[s - 1]:
                    sends.append((self.links[s - 1].isend(inp.grad, dst=0), inp.grad))
                live -= sizes[i]
        for handle, _ in sends:
            handle.wait()
        self.micro_activation_bytes = [sizes[i] for i in sorted(sizes)]
        average_gradients(self.grid.dp_comm, self.params, self._flat)
        held = self.optimizer_step(phases, measure_memory)
        return StepResult(total if self.last else float("nan"), held)

    def infer(self, x: torch.Tensor) -> torch.Tensor | None:
        shapes, s = self._plan(x), self.stage
        h = x if s == 0 else self._receive(s - 1, *shapes[s - 1], src=0)
        with self._autocast():
            h = self.stage_module(h)
        if not self.last:
            self.links[s].send(h.contiguous(), dst=1)
            return None
        return h

    # ---- accounting ----------------------------------------------------------------------------
    def _boundary_bytes(self, b: int) -> int:
        shape, dtype = self._shapes[next(iter(self._shapes))][b] if self._shapes else ((0,), torch.float32)
        return torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()

    def predict(self) -> dict[str, int]:
        s, m, out = self.stage, self.m, {}
        if s < self.stages - 1:
            out[f"send ({link_label(s)})"] = m * self._boundary_bytes(s)
            if self.needs_grad[s]:
                out[f"recv ({link_label(s)})"] = m * self._boundary_bytes(s)
        if s > 0:
            out[f"recv ({link_label(s - 1)})"] = m * self._boundary_bytes(s - 1)
            if self.needs_grad[s - 1]:
                out[f"send ({link_label(s - 1)})"] = m * self._boundary_bytes(s - 1)
        return {**out, **replica_volume(self.grid.dp_comm, self.params)}

    def group_sizes(self) -> dict[str, int]:
        return {"world": self.world_size, "pp": self.stages, "dp": self.grid.dp,
                **{link_label(b): 2 for b in range(self.stages - 1)}}

    def coords(self) -> dict[str, int]:
        return {"dp": self.grid.dp_index, "pp": self.stage}

    def pipeline_figures(self) -> dict:
        actions = self.schedule(self.m, self.stages, self.stage)
        first = self._shapes[next(iter(self._shapes))] if self._shapes else []
        return {
            "stage": self.stage, "stages": self.stages, "micro_batches": self.m, "schedule": self.name,
            "layers": describe(self.starts, len(self.spec.layers)),
            "boundaries": [{"boundary": link_label(b), "shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
                            "bytes_per_micro": self._boundary_bytes(b), "carries_grad": self.needs_grad[b]}
                           for b, (shape, dtype) in enumerate(first)],
            "predicted_bubble_fraction": bubble_fraction(self.m, self.stages),
            "peak_micro_batches_in_flight": peak_in_flight(actions),
            "activation_bytes_per_micro": self.micro_activation_bytes,
            "peak_activation_bytes": self.peak_activation_bytes,
        }

    def held_bytes(self) -> dict[str, int]:
        return {**super().held_bytes(self.stage_module), "activations": self.peak_activation_bytes}

    def full_state(self) -> dict[str, torch.Tensor]:
        state = self.model.state_dict()
        pieces = self.comm.gather_object({k: state[k].detach().clone() for k in self._owned}, dst=0)
        if pieces is None:
            return {}
        merged = {}
        for piece in pieces:
            merged.update(piece)
        return {k: merged[k] for k in state}


class Pipeline1F1B(PipelineGPipe):
    """1F1B: after p − s − 1 warm-up forwards, alternate one forward and one backward."""

    name = "pipeline-1f1b"
    schedule = staticmethod(one_f_one_b)
