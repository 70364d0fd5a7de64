"""Element types as the ranks use them: each name commprof/base/backends.py knows (torch's names; nccl-tests'
short ones are aliases there) mapped to its torch dtype. Exercised by: `pytest tests/test_bench_cli.py`.
"""

from __future__ import annotations

import torch

from commprof.base import backends
from commprof.base.backends import ALIASES, REDUCE_OPS, parse_ops

__all__ = ["DTYPES", "ALIASES", "REDUCE_OPS", "dtype_name", "parse_ops"]

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in backends.DTYPES}
"""Each dtype name (commprof/base/backends.py) -> its torch dtype."""


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32."""
    return str(dtype).removeprefix("torch.")
