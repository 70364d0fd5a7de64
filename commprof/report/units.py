"""Byte sizes in and out: '64K' -> 65536 for the CLI, 65536 -> '64 KiB' for labels.

K/M/G are binary (1024-based), as in nccl-tests' -b/-e. Exercised by: `pytest tests/test_units.py`.
"""

from __future__ import annotations

import re

from commprof.errors import UsageError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'8', '64K', '16M', '1G', '1.5M', '64KiB' -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise UsageError(f"cannot read size {text!r}: use a number of bytes with an optional K, M or G suffix")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def format_bytes(n: int) -> str:
    """65536 -> '64 KiB'; exact multiples print without decimals."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"
