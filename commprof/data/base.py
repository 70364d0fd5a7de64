"""What every data source hands out: a `Batch` of inputs and targets, and the `Source` interface.

A source maps sample indices to samples, the same way on every rank and every run: which indices a rank
asks for is decided in `commprof.data.sampling`, never here.

Exercised by: `pytest tests/unit/test_data.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Batch:
    """Inputs and targets of a batch of samples, in the order their indices were given."""

    x: torch.Tensor
    """Image: float32 [n, C, H, W], normalised. Text: int64 token ids [n, T]."""
    y: torch.Tensor
    """Image: int64 class [n]. Text: int64 [n, T], the next token (lm), or the original token at masked
    positions and -100 elsewhere (mlm)."""

    def __len__(self) -> int:
        return self.x.shape[0]


class Source:
    """A finite, indexable training set; `get` is a pure function of the indices."""

    name: str
    """synthetic-image, synthetic-text, mnist, cifar10, cifar100 or text."""
    kind: str
    """image or text."""
    task: str
    """classify (image), lm (next token) or mlm (masked tokens)."""
    num_samples: int
    """Number of training samples N; valid indices are 0 … N-1."""
    num_classes: int
    """Image: number of classes. Text: size of the model's vocabulary, which for mlm includes the mask
    token."""
    in_channels: int = 0
    """Image channels C (0 for text)."""
    image_size: int = 0
    """Image height and width (0 for text)."""
    seq_len: int = 0
    """Tokens per sample T (0 for images)."""
    mask_id: int | None = None
    """Token id written at masked positions (mlm only): num_classes - 1."""
    heldout: Source | None = None
    """The held-out split, read or generated like this one; None where there is none."""

    def get(self, indices: torch.Tensor) -> Batch:
        """The samples at `indices` (int64 [n]); sample i is the same whatever else is in the batch."""
        raise NotImplementedError

    def __len__(self) -> int:
        return self.num_samples

    def _check(self, indices: torch.Tensor) -> torch.Tensor:
        indices = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= self.num_samples):
            raise IndexError(f"{self.name}: indices must lie in [0, {self.num_samples})")
        return indices

    def __repr__(self) -> str:
        shape = (f"{self.in_channels}x{self.image_size}x{self.image_size}" if self.kind == "image"
                 else f"T={self.seq_len}")
        return f"<{self.name} {self.task} N={self.num_samples} classes={self.num_classes} {shape}>"
