"""Checks on numeric flag values that `commprof bench` and `commprof run` share: one line naming the flag
and the value, before any rank starts.

Exercised by: `pytest tests/test_fuzz_cli.py`.
"""

from __future__ import annotations

import math

from commprof.errors import UsageError

INT64_MAX = (1 << 63) - 1
"""The largest whole number a flag may be: torch holds counts, sizes and steps in int64."""

MAX_TIMEOUT_S = 1e9
"""The longest --timeout: gloo counts its deadline in int64 nanoseconds, and 1e10 s already overflows
them (the rendezvous then times out at once)."""


def at_least(flag: str, value: int | None, low: int) -> None:
    if value is None:
        return
    if value < low:
        raise UsageError(f"{flag} {value} must be at least {low}")
    if value > INT64_MAX:
        raise UsageError(f"{flag} {value} is over {INT64_MAX}")


def finite(flag: str, value: float | None) -> None:
    """nan and ±inf pass every `<` check unnoticed and fail later, inside a rank."""
    if value is not None and not math.isfinite(value):
        raise UsageError(f"{flag} {value} must be a finite number")


def timeout(value: float) -> None:
    finite("--timeout", value)
    if not 0 < value <= MAX_TIMEOUT_S:
        raise UsageError(f"--timeout {value:g} must be positive and at most {MAX_TIMEOUT_S:g} s")


def refuse_plot(args) -> None:
    """--plot reached a rank: the job was started by torchrun, mpiexec or srun, not by commprof."""
    if getattr(args, "plot", None) is not None:
        raise UsageError("--plot draws with commprof's own launcher: under torchrun, mpiexec or srun write "
                         "--json and run `commprof report FILE --plot DIR`")


def int_list(flag: str, spec: str | None) -> tuple[int, ...]:
    """'2,4,8' -> (2, 4, 8): whole numbers of at least 1, each once, in the order given."""
    if spec is None:
        return ()
    out = []
    for item in spec.split(","):
        try:
            value = int(item.strip())
        except ValueError:
            shown = spec if len(spec) <= 40 else spec[:40] + "…"
            bad = item.strip() if len(item.strip()) <= 40 else item.strip()[:40] + "…"
            raise UsageError(f"{flag} {shown}: {bad!r} is not a whole number") from None
        at_least(flag, value, 1)
        out.append(value)
    return tuple(dict.fromkeys(out))
