"""What one `commprof bench` run measures: a frozen config the CLI builds and validates.

Exercised by: `pytest tests/test_bench_cli.py` and `pytest tests/unit/test_cli_grammar.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from commprof.base.errors import UsageError
from commprof.base.flags import JobConfig

MODES = (False, True)
"""Out-of-place, in-place: the order of nccl-tests' columns."""

FORMATS = ("table", "nccl-tests")
"""What --format prints on stdout: Rich tables and the summary (commprof/report/bench_table.py), or nccl-tests'
own text layout (commprof/report/nccl_text.py)."""

MAX_SIZES = 10_000
"""Most sizes one sweep may have: every rank plans a row per size, collective, dtype and op before
measuring, and `-i 1 -e 1T` would otherwise fill the memory before anything runs."""


@dataclass(frozen=True)
class BenchConfig(JobConfig):
    collectives: tuple[str, ...]
    """Collectives to sweep, in order."""
    device: str = "cpu"
    """Where the tensors live (--device): cuda for nccl; gloo moves either, so ranks can share one GPU."""
    algos: tuple[str, ...] = ("library",)
    """`library` (the backend's own collective) and/or commprof.kernels algorithm names (--algo)."""
    dtypes: tuple[str, ...] = ("float32",)
    """Element types (-d)."""
    ops: tuple[str, ...] = ("sum",)
    """Reduce ops (-o) for the collectives that reduce."""
    explicit: bool = True
    """Dtypes and ops were named one by one (not `all`): a combination the backend lacks is an error,
    not a skipped row."""
    min_bytes: int = 8
    """Smallest size (-b), nccl-tests' size convention."""
    max_bytes: int = 16 << 20
    """Largest size (-e)."""
    step_factor: float = 2.0
    """Multiply the size by this between steps (-f)."""
    step_bytes: int = 0
    """Add this many bytes between steps instead (-i); 0 means use step_factor."""
    iters: int = 20
    """Timed iterations per size (-n)."""
    warmup: int = 5
    """Untimed iterations before them (-w)."""
    check: int = 1
    """Check runs per size and mode (-c), before the warm-up: each initialises the buffers, runs the op once
    and compares with the closed form; 0: no check."""
    agg: str = "avg"
    """How per-rank times combine into the reported time (-a): avg, min or max over ranks, or rank0 (rank
    0's own)."""
    root: int = 0
    """Root rank for broadcast and reduce (-r)."""
    all_roots: bool = False
    """Every rank in turn is the root of broadcast and reduce, each its own rows (-r all)."""
    agg_iters: int = 1
    """Ops per iteration (-m): issued back to back and timed together, the time divided by this."""
    blocking: bool = False
    """Wait on each op before issuing the next, and meet at an untimed barrier after each iteration (-z 1)."""
    group_sizes: tuple[int, ...] = ()
    """Run every collective on groups of each of these many ranks, one size after another
    (--group-sizes); empty: on all the job's ranks."""
    concurrent: bool = False
    """Each group size runs on every disjoint group of that many ranks at once (--concurrent), instead
    of on the first ranks alone while the rest wait."""
    levels: tuple[str, ...] = ()
    """Levels of the host hierarchy measured apart (--groups intra,inter): "intra" runs every collective
    within each host, all hosts at once; "inter" across hosts, one group per local rank, all at once."""
    format: str = "table"
    """What rank 0 prints on stdout (--format): `table`, a Rich table per collective and the summary;
    `nccl-tests`, nccl-tests' own text layout, a block per collective, for the parsers kept for its logs."""

    def sizes(self) -> list[int]:
        """The requested byte sizes, before per-collective rounding."""
        if self.min_bytes > self.max_bytes:
            raise UsageError(f"-b {self.min_bytes} is larger than -e {self.max_bytes}")
        # `not >` so that nan fails too.
        if self.step_bytes <= 0 and not self.step_factor > 1 and self.min_bytes != self.max_bytes:
            raise UsageError(f"-f {self.step_factor:g} must be greater than 1 (or give -i)")
        out, size = [], self.min_bytes
        while size <= self.max_bytes:
            if len(out) == MAX_SIZES:
                step = f"-i {self.step_bytes}" if self.step_bytes > 0 else f"-f {self.step_factor:g}"
                raise UsageError(f"{step} makes more than {MAX_SIZES} sizes from -b {self.min_bytes} "
                                 f"to -e {self.max_bytes}: use a larger step")
            out.append(size)
            if self.step_bytes > 0:
                size += self.step_bytes
                continue
            grown = size * self.step_factor  # a float: compared before int(), which fails on inf
            if grown > self.max_bytes or size == self.max_bytes:
                break
            if int(grown) <= size:  # 1 × 1.5 is still 1: the sweep would stop short of -e
                raise UsageError(f"-f {self.step_factor:g} does not grow size {size} (-b {self.min_bytes}) "
                                 f"toward -e {self.max_bytes}: use a larger -f or -b, or give -i")
            size = int(grown)
        return out
