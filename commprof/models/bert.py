"""A BERT-style encoder for masked-language modelling (task "mlm").

Token + learned position embeddings with a LayerNorm, post-LN blocks with bidirectional attention (the
original BERT layout), and the MLM head: dense, GELU, LayerNorm, decoder to the vocabulary (untied from
the token embedding, so every parameter belongs to exactly one FSDP unit: embeddings, each block,
head). No token-type embedding and no pooler: MLM needs neither. Presets:

- `bert`: 12 layers, 9 heads of 64, d_model 576 — 48.31M parameters at vocab 65 and seq_len 64
  (48.42M at seq_len 256), the size of the custom-FSDP study's BERT (46.7M).
- `bert-tiny`: 2 layers, 2 heads, d_model 32 — about 30K parameters, for tests.

Exercised by: `pytest tests/unit/test_models.py -k bert`.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from commprof.models.spec import ModelSpec
from commprof.models.transformer import Block, Embeddings, TransformerConfig, init_weights

BERT = TransformerConfig(n_layer=12, n_head=9, d_model=576, vocab_size=65, seq_len=64)
"""The `bert` preset."""
BERT_TINY = TransformerConfig(n_layer=2, n_head=2, d_model=32, vocab_size=65, seq_len=64)
"""The `bert-tiny` preset."""


class MLMHead(nn.Module):
    """Dense + GELU + LayerNorm, then the decoder to vocabulary logits: the last FSDP unit."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.act = nn.GELU()
        self.ln = nn.LayerNorm(config.d_model)
        self.decoder = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.ln(self.act(self.dense(x))))


class BertModel(nn.Module):
    """[B, T] token ids (some of them masked by the data) → [B, T, vocab] logits at every position."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = Embeddings(config, norm=True)
        self.blocks = nn.ModuleList(Block(config, causal=False, pre_ln=False) for _ in range(config.n_layer))
        self.head = MLMHead(config)
        init_weights(self)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(*, preset: TransformerConfig, vocab_size: int, seq_len: int) -> ModelSpec:
    """`preset` resized to `vocab_size` tokens and `seq_len` positions."""
    net = BertModel(replace(preset, vocab_size=vocab_size, seq_len=seq_len))
    units = (net.embed, *net.blocks, net.head)
    return ModelSpec(module=net, task="mlm", units=units, kind="text", layers=units)
