"""What a model-zoo entry hands to a run: the module, its loss convention, its wrap units, its input;
and what the zoo knows of a model before it is built: the data it trains on.

`ModelSpec` and `ModelEntry` are re-exported by `commprof.models`; the builders in this package return
a `ModelSpec`. Exercised by: `pytest tests/unit/test_models.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    """A built model and what a training loop needs to know about it."""

    module: nn.Module
    """The whole network; `module(x)` returns logits."""
    task: str
    """Loss convention: "classify" (logits [B, C] vs int labels [B]), "lm" (logits [B, T, V] vs next
    tokens [B, T]) or "mlm" (logits [B, T, V] vs labels [B, T], -100 = ignore)."""
    units: tuple[nn.Module, ...]
    """FSDP wrap units: disjoint submodules of `module` in forward execution order, each a contiguous
    stage of the network. Parameters in no unit form the root unit. Frozen parameters may sit anywhere."""
    kind: str
    """Input the model takes: "image" ([B, C, H, W] floats) or "text" ([B, T] token ids)."""
    layers: tuple[nn.Module, ...] = ()
    """The network as a chain, `module(x) == layers[-1](…layers[0](x))`: what pipeline stages cut."""
    head: tuple[nn.Linear, ...] = ()
    """The classifier's Linear layers in forward order with only elementwise ops between them (what
    tensor parallelism splits in an image model); empty when the model has none."""


@dataclass(frozen=True)
class ModelEntry:
    """One name in the zoo."""

    build: Callable[..., ModelSpec]
    """Keyword-only builder. Image models take num_classes, in_channels, image_size, frozen_backbone,
    head_width;
    text models take vocab_size, seq_len. `commprof.models.build_model` validates and dispatches."""
    kind: str
    """"image" or "text"."""
    description: str
    """One line for --list-models, with the parameter count at default sizes."""
    masked_lm: bool = False
    """Text models: trains on masked-LM data (BERT: some tokens masked, labels only at those, -100
    elsewhere) instead of next-token prediction. Sets the data task before the model is built."""
    image_size: int = 32
    """Image models: height = width of the synthetic images made for it when --image-size is not given
    (a real data set keeps its own)."""
    in_channels: int = 3
    """Image models: channels of the synthetic images made for it when --in-channels is not given (a
    real data set keeps its own)."""
