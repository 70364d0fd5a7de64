"""The transformer pieces GPT-2 and BERT share: config, embeddings, attention, MLP, block.

One `Block` serves both: `causal=True, pre_ln=True` is GPT-2's decoder block, `causal=False,
pre_ln=False` is BERT's encoder block. Attention is `F.scaled_dot_product_attention`, which picks a
fused kernel where the device has one. No dropout anywhere, so runs with different rank counts stay
numerically comparable. Exercised by: `pytest tests/unit/test_models.py -k "gpt2 or bert"`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes of a GPT-2- or BERT-style model."""

    n_layer: int
    """Number of blocks."""
    n_head: int
    """Attention heads per block; must divide d_model."""
    d_model: int
    """Width of the residual stream; the MLP is 4× wider."""
    vocab_size: int
    """Number of token ids (65 for character-level Tiny Shakespeare)."""
    seq_len: int
    """Longest sequence the learned position embedding covers."""

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_head {self.n_head}")


class Embeddings(nn.Module):
    """Token plus learned position embedding, optionally followed by a LayerNorm (BERT has one)."""

    def __init__(self, config: TransformerConfig, *, norm: bool) -> None:
        super().__init__()
        self.seq_len = config.seq_len
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.seq_len, config.d_model)
        self.norm = nn.LayerNorm(config.d_model) if norm else nn.Identity()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than the model's seq_len {self.seq_len}")
        return self.norm(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused q/k/v projection."""

    def __init__(self, d_model: int, n_head: int, *, causal: bool) -> None:
        super().__init__()
        self.n_head = n_head
        self.causal = causal
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    """d → 4d → GELU → d."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """Attention then MLP, each with a residual connection and a LayerNorm.

    pre_ln (GPT-2): x + f(LN(x)). post_ln (original BERT): LN(x + f(x)).
    """

    def __init__(self, config: TransformerConfig, *, causal: bool, pre_ln: bool) -> None:
        super().__init__()
        self.pre_ln = pre_ln
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = SelfAttention(config.d_model, config.n_head, causal=causal)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_ln:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


def init_weights(module: nn.Module, *, std: float = 0.02) -> None:
    """GPT-2/BERT initialisation: N(0, std) for linear and embedding weights, zero biases.

    Draws from the global RNG only, so `torch.manual_seed` before building fixes every weight.
    """
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
