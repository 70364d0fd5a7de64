"""Character-level language modelling on a local UTF-8 text file (e.g. Tiny Shakespeare's input.txt).

--data-dir is the text file itself, or a folder holding input.txt. The vocabulary is the sorted set of
characters in the whole file, so the held-out split never meets an unknown character. The first 90% of
the characters are for training, the last 10% held out. Samples are non-overlapping windows: sample i
is characters [i·T, i·T + T + 1), x its first T, y its last T (the next character at each position),
so N = (characters - 1) // T and one epoch reads every character once.

Exercised by: `pytest tests/unit/test_data.py -k text`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from commprof.base.errors import UsageError
from commprof.data.base import Batch, Source


class CharText(Source):
    """Next-character prediction over non-overlapping windows of a token sequence."""

    kind = "text"
    task = "lm"

    def __init__(self, *, name: str, tokens: torch.Tensor, vocab: str, seq_len: int,
                 heldout: Source | None = None):
        self.name = name
        self.tokens = tokens
        """Every character of this split as an id into `vocab`, int64."""
        self.vocab = vocab
        """Character of each token id."""
        self.num_classes = len(vocab)
        self.seq_len = seq_len
        self.num_samples = (len(tokens) - 1) // seq_len
        self.heldout = heldout

    def get(self, indices: torch.Tensor) -> Batch:
        indices = self._check(indices)
        window = self.tokens[indices[:, None] * self.seq_len + torch.arange(self.seq_len + 1)]
        return Batch(x=window[:, :-1], y=window[:, 1:])

    def decode(self, ids: torch.Tensor) -> str:
        """The text of a sequence of token ids."""
        return "".join(self.vocab[i] for i in ids.tolist())


def open_text(data_dir: str, *, seq_len: int, num_samples: int | None) -> CharText:
    """The training split (its first `num_samples` windows if given), the last 10% as held-out split."""
    path = Path(data_dir).expanduser()
    if path.is_dir():
        path = path / "input.txt"
    if not path.is_file():
        raise UsageError(f"text: {path} not found; give --data-dir a UTF-8 text file (or a folder holding "
                         f"input.txt)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"text: cannot read {path} as UTF-8: {e}") from None
    # One uint32 code point per character, so np.unique yields the sorted vocabulary and the ids at once.
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    vocab_codes, ids = np.unique(codes, return_inverse=True)
    vocab = "".join(map(chr, vocab_codes.tolist()))
    tokens = torch.from_numpy(ids.astype(np.int64).reshape(-1))
    split = len(tokens) - len(tokens) // 10
    train, test = tokens[:split], tokens[split:]
    if (len(train) - 1) // seq_len < 1:
        raise UsageError(f"text: {path} is too short: its first 90% holds {len(train)} characters, "
                         f"fewer than seq_len + 1 = {seq_len + 1}")
    if num_samples is not None:
        available = (len(train) - 1) // seq_len
        if not 0 < num_samples <= available:
            raise UsageError(f"text: asked for {num_samples} samples; {path} gives {available} windows "
                             f"of {seq_len}")
        train = train[:num_samples * seq_len + 1]
    heldout = None
    if (len(test) - 1) // seq_len >= 1:
        heldout = CharText(name="text", tokens=test, vocab=vocab, seq_len=seq_len)
    return CharText(name="text", tokens=train, vocab=vocab, seq_len=seq_len, heldout=heldout)
