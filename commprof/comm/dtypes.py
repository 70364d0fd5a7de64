"""Names of element types and reduce ops, shared by the CLI, the Comm backends and the reports.

Names follow torch (float32, bfloat16, …); nccl-tests' short names (float, half, double, …) are
accepted as aliases. Exercised by: `pytest tests/test_bench_cli.py`.
"""

from __future__ import annotations

import torch

from commprof.errors import UsageError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
    "int8": torch.int8,
    "uint8": torch.uint8,
}

ALIASES = {"float": "float32", "half": "float16", "double": "float64", "bf16": "bfloat16",
           "fp32": "float32", "fp16": "float16", "fp64": "float64"}

REDUCE_OPS = ("sum", "prod", "min", "max", "avg")


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32."""
    return str(dtype).removeprefix("torch.")


def parse_dtypes(spec: str) -> list[torch.dtype]:
    """'float32,int8' or 'all' -> torch dtypes, in the order given, each once (float,float32 is one)."""
    if spec == "all":
        return list(DTYPES.values())
    out = []
    for raw in spec.split(","):
        name = ALIASES.get(raw.strip(), raw.strip())
        if name not in DTYPES:
            raise UsageError(f"unknown dtype {raw!r}: choose from {', '.join(DTYPES)} or all")
        out.append(DTYPES[name])
    return list(dict.fromkeys(out))


def parse_ops(spec: str) -> list[str]:
    """'sum,max' or 'all' -> reduce op names, in the order given, each once."""
    if spec == "all":
        return list(REDUCE_OPS)
    ops = [op.strip() for op in spec.split(",")]
    for op in ops:
        if op not in REDUCE_OPS:
            raise UsageError(f"unknown reduce op {op!r}: choose from {', '.join(REDUCE_OPS)} or all")
    return list(dict.fromkeys(ops))
