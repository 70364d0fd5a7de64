"""Byte sizes in and out: '64K' -> 65536 for the CLI, 65536 -> '64 KiB' for labels; link rates in.

K/M/G/T are binary (1024-based), as in nccl-tests' -b/-e (T is commprof's: a size no host holds is refused
before launch, world.check_room). Exercised by: `pytest tests/unit/test_units_stats.py` and
`pytest tests/unit/test_cli_grammar.py`.
"""

from __future__ import annotations

import re
from decimal import Decimal

from commprof.base.errors import UsageError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

MAX_SIZE = (1 << 63) - 1
"""The largest size a buffer can have: element counts are int64 in torch and in MPI's large-count calls."""


def parse_size(text: str, flag: str | None = None) -> int:
    """'8', '64K', '16M', '1G', '1.5M', '64KiB' -> bytes; `flag` (-b, …) is named in the error."""
    of = f" of {flag}" if flag else ""
    # ASCII: under IGNORECASE a Unicode pattern's K also matches the Kelvin sign, and \d any script's digits.
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE | re.ASCII)
    if not match:
        raise UsageError(f"cannot read size {text!r}{of}: use a number of bytes with an optional K, M, G or T suffix")
    # Decimal, not float: a float turns a long digit string into inf and rounds past 2**53.
    size = Decimal(match.group(1)) * _UNITS[match.group(2).upper()]
    if size > MAX_SIZE:
        raise UsageError(f"size {text!r}{of} is over {MAX_SIZE} bytes")
    return int(size)


RATES = {"": 1.0, "GB/s": 1.0, "MB/s": 1e-3, "TB/s": 1e3, "Gbit/s": 1 / 8, "Mbit/s": 1e-3 / 8, "Tbit/s": 1e3 / 8}
"""A link's rate in GB/s (10^9 bytes a second, as busbw) per unit; bytes are B and bits are bit, spelled
out, since 'Gb/s' and 'Gbps' are read both ways."""


def parse_rate(text: str, flag: str) -> float:
    """'25', '25GB/s', '100Gbit/s', '400 Mbit/s' -> GB/s; a bare number is GB/s."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z/]*)\s*", text, re.ASCII)
    shown = text if len(text) <= 40 else text[:40] + "…"
    if not match or match.group(2) not in RATES:
        raise UsageError(f"cannot read rate {shown!r} of {flag}: use GB/s, e.g. 25, 25GB/s or 200Gbit/s")
    rate = float(match.group(1)) * RATES[match.group(2)]
    if not 0 < rate < float("inf"):
        raise UsageError(f"{flag} {shown}: the rate must be positive and finite")
    return rate


def format_bytes(n: int) -> str:
    """65536 -> '64 KiB'; exact multiples print without decimals."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"
