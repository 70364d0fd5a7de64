"""A GPT-2-style decoder for next-token prediction (task "lm").

Token + learned position embeddings, pre-LN blocks with causal self-attention, a final LayerNorm and
a separate (untied) LM head, so every parameter belongs to exactly one FSDP unit: embeddings, each
block, final. Presets:

- `gpt2`: 12 layers, 6 heads of 72, d_model 432 (GPT-2 small's depth, narrowed) — 27.03M parameters
  at vocab 65 and seq_len 64 (27.11M at seq_len 256), the size of the custom-FSDP study's GPT-2 (27.32M).
- `gpt2-tiny`: 2 layers, 4 heads of 8, d_model 32 — about 30K parameters, for tests (4 heads so that
  `tensor` can split them 2 and 4 ways).

Exercised by: `pytest tests/unit/test_models.py -k gpt2`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import nn

from commprof.models.spec import ModelSpec
from commprof.models.transformer import Block, Embeddings, TransformerConfig, init_weights

GPT2 = TransformerConfig(n_layer=12, n_head=6, d_model=432, vocab_size=65, seq_len=64)
"""The `gpt2` preset."""
GPT2_TINY = TransformerConfig(n_layer=2, n_head=4, d_model=32, vocab_size=65, seq_len=64)
"""The `gpt2-tiny` preset."""


class NormAndHead(nn.Module):
    """The final LayerNorm and LM head: the last FSDP unit."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(x))


class GPT2Model(nn.Module):
    """[B, T] token ids → [B, T, vocab] logits for the next token at every position."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = Embeddings(config, norm=False)
        self.blocks = nn.ModuleList(Block(config, causal=True, pre_ln=True) for _ in range(config.n_layer))
        self.final = NormAndHead(config)
        init_weights(self)
        # GPT-2 scales the projections that write into the residual stream by 1/sqrt(2·n_layer), so
        # the stream's variance does not grow with depth.
        for block in self.blocks:
            for proj in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.final(x)


def build(*, preset: TransformerConfig, vocab_size: int, seq_len: int) -> ModelSpec:
    """`preset` resized to `vocab_size` tokens and `seq_len` positions."""
    net = GPT2Model(replace(preset, vocab_size=vocab_size, seq_len=seq_len))
    units = (net.embed, *net.blocks, net.final)
    return ModelSpec(module=net, task="lm", units=units, kind="text", layers=units)
