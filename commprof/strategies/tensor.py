"""`tensor`: Megatron-LM tensor parallelism — every weight matrix of attention and MLP split over the
tp ranks of a replica, which all see the same batch and meet in one all_reduce per split layer pair.

    commprof run --strategy tensor --model gpt2-tiny --nproc 2
    commprof run --strategy tensor --model gpt2-tiny --nproc 4 --dp 2 --tp 2

A pair of linears A then B, with only elementwise ops between them, splits without talking in the
middle: A column-parallel (each rank computes some of A's outputs — in attention, its own heads), B
row-parallel (each rank multiplies its slice of B's inputs, giving a partial sum of B's output). Two
autograd Functions carry the bytes (Megatron's f and g): `copy_to_tp` before A is the identity forward
and all-reduces the input's gradient backward (each rank's partial from its columns); `reduce_from_tp`
after B all-reduces the partial sums forward and is the identity backward. B's bias is added once,
after the sum. Per transformer block and micro-batch: 2 all_reduces forward + 2 backward of
batch × seq × d_model. Image models split the classifier's linears in (column, row) pairs; an unpaired
last one stays whole. Embeddings, LayerNorms and output heads are replicated: their inputs and output
gradients are the same on every tp rank, so are their gradients. Every rank builds the whole model
from the seed and keeps its slices, so it starts from `single`'s weights exactly. With --dp > 1 every
gradient this rank holds is averaged over the replicas by one flat all_reduce after backward.
Exercised by: `pytest tests/unit/test_tensor_degrees.py tests/unit/test_fake_comm_models.py tests/test_tensor.py`.
"""

from __future__ import annotations

from functools import wraps

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import set_checkpoint_early_stop

from commprof.base.errors import UsageError
from commprof.models.transformer import Block
from commprof.parallel.grid import average_gradients, build_grid, degrees, replica_volume
from commprof.strategies.base import AUTOCAST, StepResult, Strategy, trainable


class CopyToTP(torch.autograd.Function):
    """f: identity forward; backward sums the input's gradient over the tp ranks."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone(memory_format=torch.contiguous_format)  # autograd may still hold the original
        ctx.comm.all_reduce(grad)
        return grad, None


class ReduceFromTP(torch.autograd.Function):
    """g: forward sums the row-parallel partial outputs over the tp ranks; identity backward."""

    @staticmethod
    def forward(ctx, x, comm):
        out = x.clone(memory_format=torch.contiguous_format)
        comm.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


copy_to_tp, reduce_from_tp = CopyToTP.apply, ReduceFromTP.apply


def _param(t: torch.Tensor, like: nn.Parameter) -> nn.Parameter:
    """A slice of `like` as a parameter of its own (a copy, so the full tensor can be freed)."""
    return nn.Parameter(t.detach().clone(memory_format=torch.contiguous_format), requires_grad=like.requires_grad)


class ColumnParallelLinear(nn.Module):
    """This rank's rows of a Linear's weight (its share of the outputs); input gradient all-reduced."""

    def __init__(self, weight, bias, *, like: nn.Linear, comm) -> None:
        super().__init__()
        self.weight = _param(weight, like.weight)
        self.bias = _param(bias, like.bias) if bias is not None else None
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_tp(x, self.comm), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's columns of a Linear's weight (its share of the inputs); output all-reduced, then
    the replicated bias added once."""

    def __init__(self, weight, *, like: nn.Linear, comm) -> None:
        super().__init__()
        self.weight = _param(weight, like.weight)
        self.bias = _param(like.bias, like.bias) if like.bias is not None else None
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tp(F.linear(x, self.weight), self.comm)
        # in the matmul's dtype, as F.linear would have added it under autocast
        return y if self.bias is None else y + self.bias.to(y.dtype)


def column(linear: nn.Linear, index: int, t: int, comm) -> ColumnParallelLinear:
    rows = slice(index * linear.out_features // t, (index + 1) * linear.out_features // t)
    bias = linear.bias[rows] if linear.bias is not None else None
    return ColumnParallelLinear(linear.weight[rows], bias, like=linear, comm=comm)


def row(linear: nn.Linear, index: int, t: int, comm) -> RowParallelLinear:
    cols = slice(index * linear.in_features // t, (index + 1) * linear.in_features // t)
    return RowParallelLinear(linear.weight[:, cols], like=linear, comm=comm)


class TensorParallelAttention(nn.Module):
    """This rank's heads of a SelfAttention: q, k and v rows of those heads, proj columns of them."""

    def __init__(self, attn, index: int, t: int, comm) -> None:
        super().__init__()
        n, d = attn.n_head, attn.qkv.in_features
        self.n_head, self.causal = n // t, attn.causal
        heads = slice(index * self.n_head, (index + 1) * self.n_head)
        # qkv's outputs are laid out (3, n_head, head_dim): take this rank's heads of each of q, k, v.
        weight = attn.qkv.weight.view(3, n, d // n, d)[:, heads].reshape(-1, d)
        bias = attn.qkv.bias.view(3, n, d // n)[:, heads].reshape(-1)
        self.qkv = ColumnParallelLinear(weight, bias, like=attn.qkv, comm=comm)
        self.proj = row(attn.proj, index, t, comm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.n_head, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


def head_pairs(spec) -> list[tuple[nn.Linear, nn.Linear]]:
    """(column, row) pairs of an image model's classifier linears; an odd last one stays whole."""
    head = spec.head
    return [(head[i], head[i + 1]) for i in range(0, len(head) - 1, 2)]


def check_divisible(spec, t: int, model: str) -> None:
    """UsageError unless `t` ranks can split `spec`'s heads (transformers) or column widths (images)."""
    blocks = [m for m in spec.module.modules() if isinstance(m, Block)]
    if blocks:
        n = blocks[0].attn.n_head
        if n % t:  # heads divide d_model, so t then divides the MLP's 4·d_model as well
            raise UsageError(f"--tp {t} does not divide the {n} attention heads of {model}")
        return
    pairs = head_pairs(spec)
    if not pairs:
        raise UsageError(f"model {model} has no MLP head or attention to split")
    names = {id(m): name for name, m in spec.module.named_modules()}
    for linear, _ in pairs:
        if linear.out_features % t:
            raise UsageError(f"--tp {t} does not divide the {linear.out_features} outputs of "
                             f"{names[id(linear)]} in {model}")


def _replace(root: nn.Module, old: nn.Module, new: nn.Module) -> None:
    """Put `new` wherever `old` is a child inside `root`, so that root(x) runs it."""
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if child is old:
                setattr(parent, name, new)


def _full_recompute(forward):
    """A checkpointed unit's forward that recomputes all of itself in backward (torch stops early by
    default, after the last saved tensor: whether a unit's last all_reduce reruns would then depend on
    the model's layout)."""
    @wraps(forward)
    def run(*args, **kwargs):
        with set_checkpoint_early_stop(False):
            return forward(*args, **kwargs)
    return run


class TensorParallel(Strategy):
    """Megatron tensor parallelism over --tp ranks per replica, data parallel over --dp replicas."""

    name = "tensor"
    model_parallel = "tp"

    def setup(self) -> None:
        cfg = self.config
        dp, t = degrees(self.world_size, dp=cfg.dp, inner=cfg.tp, flag="--tp")
        if t < 2:
            raise UsageError(f"strategy {self.name} needs a tensor-parallel degree of at least 2 (--tp), got {t}")
        check_divisible(self.spec, t, cfg.model)  # before any group exists: every rank fails alike
        self.grid = build_grid(self.comm, dp=dp, inner=t, label="tp")
        self.data_rank, self.data_ranks = self.grid.dp_index, dp
        self.t, self._flat, self._micro = t, {}, []
        self._layout: dict[str, object] = {}
        """State key of a sliced tensor → how slices join: 0 (rows), 1 (columns) or "qkv"."""
        self._rows: list[tuple[RowParallelLinear, int]] = []
        """Every row-parallel layer and its output width: its forward all_reduce."""
        self._cols: list[tuple[int, bool]] = []
        """(input width, input needs a gradient) of every column-parallel layer: its backward all_reduce."""
        self._recomputed: set[int] = set()
        """Row-parallel layers whose forward (all_reduce included) runs again in backward (--checkpoint)."""
        names = {id(m): name for name, m in self.model.named_modules()}
        blocks = [m for m in self.model.modules() if isinstance(m, Block)]
        for block in blocks:
            self._split_block(block, names)
        if not blocks:
            self._split_head(names)
        if cfg.checkpoint:
            self._recompute_all()
        self.params = trainable(self.model)  # the slices (and what stays replicated), not the full linears

    def _split_block(self, block, names: dict) -> None:
        """Attention by heads, MLP by its 4·d hidden units."""
        i, t, comm = self.grid.inner_index, self.t, self.grid.inner_comm
        at, mlp = names[id(block.attn)], names[id(block.mlp)]
        block.attn = TensorParallelAttention(block.attn, i, t, comm)
        block.mlp.fc, block.mlp.proj = column(block.mlp.fc, i, t, comm), row(block.mlp.proj, i, t, comm)
        self._layout.update({f"{at}.qkv.weight": "qkv", f"{at}.qkv.bias": "qkv", f"{at}.proj.weight": 1,
                             f"{mlp}.fc.weight": 0, f"{mlp}.fc.bias": 0, f"{mlp}.proj.weight": 1})
        d = block.attn.proj.weight.shape[0]
        # A block's input comes from the trainable embeddings, so both its splits' inputs need grads.
        self._cols += [(d, True), (d, True)]
        self._rows += [(block.attn.proj, d), (block.mlp.proj, d)]

    def _split_head(self, names: dict) -> None:
        """An image classifier's linears in (column, row) pairs."""
        i, t, comm, net = self.grid.inner_index, self.t, self.grid.inner_comm, self.model
        head = {id(p) for linear in self.spec.head for p in linear.parameters()}
        # The head ends the network: any other trainable parameter is upstream of its first input.
        upstream = any(p.requires_grad and id(p) not in head for p in net.parameters())
        for k, (a, b) in enumerate(head_pairs(self.spec)):
            new = row(b, i, t, comm)
            _replace(net, a, column(a, i, t, comm))
            _replace(net, b, new)
            self._layout.update({f"{names[id(a)]}.weight": 0, f"{names[id(a)]}.bias": 0,
                                 f"{names[id(b)]}.weight": 1})
            self._cols.append((a.in_features, upstream or k > 0))
            self._rows.append((new, b.out_features))
            for p in (*a.parameters(), *b.parameters()):  # the spec still refers to the full linears:
                p.data = p.data.new_empty(0)  # keep only the slices in memory

    def _recompute_all(self) -> None:
        """Checkpointed units holding split layers recompute all of themselves, all_reduces included.
        (A split linear that was a unit of its own is a new module now, no longer checkpointed.)"""
        for unit in self.spec.units:
            split = [m for m in unit.modules() if isinstance(m, RowParallelLinear)]
            if split:
                unit.forward = _full_recompute(unit.forward)
                self._recomputed.update(id(m) for m in split)

    def train_step(self, micro_batches, phases, *, measure_memory: bool = False) -> StepResult:
        self._micro = [tuple(x.shape) for x, _ in micro_batches]  # what predict() counts from
        return super().train_step(micro_batches, phases, measure_memory=measure_memory)

    def backward_done(self, phases) -> None:
        average_gradients(self.grid.dp_comm, self.params, self._flat)

    def infer(self, x: torch.Tensor) -> torch.Tensor | None:
        out = self.model(x)  # every tp rank takes part in the all_reduces inside
        return out if self.grid.inner_index == 0 else None  # counted once per replica

    # ---- accounting ----------------------------------------------------------------------------
    def predict(self) -> dict[str, int]:
        out = {}
        param = self.params[0].element_size()
        low = AUTOCAST.get(self.config.precision)
        y = torch.empty((), dtype=low).element_size() if low else param  # a matmul's output
        # Column inputs: transformers' come out of a LayerNorm on the fp32 residual stream; an image
        # head's out of a conv or linear, in the matmul's dtype.
        x = param if self.spec.kind == "text" else y
        per_sample = sum(w * y * (2 if id(m) in self._recomputed else 1) for m, w in self._rows) + \
            sum(w * x for w, needs in self._cols if needs)
        positions = sum(s[0] * (s[1] if self.spec.kind == "text" else 1) for s in self._micro)
        if positions:
            out["all_reduce (tp)"] = positions * per_sample
        return {**out, **replica_volume(self.grid.dp_comm, self.params)}

    def group_sizes(self) -> dict[str, int]:
        return {"world": self.world_size, "tp": self.t, "dp": self.grid.dp}

    def coords(self) -> dict[str, int]:
        return {"dp": self.grid.dp_index, "tp": self.grid.inner_index}

    def full_state(self) -> dict[str, torch.Tensor]:
        """The unsplit state_dict on rank 0 (slices of replica 0's tp ranks joined), {} elsewhere."""
        state = self.model.state_dict()
        mine = {k: state[k].detach().clone() for k in self._layout} if self.grid.dp_index == 0 else {}
        pieces = self.comm.gather_object(mine, dst=0)
        if pieces is None:
            return {}
        pieces = pieces[:self.t]  # ranks 0 … t−1: replica 0
        full = {}
        for k, v in state.items():
            how = self._layout.get(k)
            if how is None:  # replicated: rank 0's own copy is everyone's
                full[k] = v.detach().clone()
            elif how == "qkv":  # (3 · heads · head_dim, …): join the heads of q, of k and of v
                full[k] = torch.cat([p[k].view(3, -1, *p[k].shape[1:]) for p in pieces], 1).flatten(0, 1)
            else:
                full[k] = torch.cat([p[k] for p in pieces], how)
        return full
