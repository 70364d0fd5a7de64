"""bench's results as nccl-tests prints them on stdout, line for line, so that the parsers people keep for
nccl-tests logs read commprof's unchanged: per collective the `# nThread …` parameter line, the `# Using devices`
block (a line per rank), the three column header lines, a row per size with its out-of-place then in-place
columns, and the `# Out of bounds values` / `# Avg bus bandwidth` footer.

    commprof bench all_reduce all_gather -b 8 -e 128M -f 2 --format nccl-tests

Every format string below is nccl-tests' own (NVIDIA/nccl-tests, src/common.cu as of its v2.13 releases: `run()`
prints the header and footer, `TimeTest()` a row's first five columns, `BenchTime()` each mode's four), and the
blank out-of-place columns of a mode that was not measured are what src/util.cu's `writeBenchMarkLineNullBody()`
prints for it. The values are nccl-tests' too: its type names (`float`, `half`, …), `none` for the op of a
collective that does not reduce, root -1 where the collective has none, and `count` as the count passed to the
collective (a rank's share for all_gather, reduce_scatter and all_to_all; the JSON's `count` is the whole size's).

Rendering only, of bench's records (the JSON's `results`), the run's parameters and a line per rank: a pure
function, no process. Exercised by: `pytest tests/unit/test_nccl_text.py` and
`pytest tests/test_bench_cli.py -k nccl`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from commprof.base.measurement import COLLECTIVES

FORMAT = "nccl-tests"
"""bench's --format value for this layout."""

TYPE_NAMES = {"int8": "int8", "uint8": "uint8", "int32": "int32", "int64": "int64", "float16": "half",
              "float32": "float", "float64": "double", "bfloat16": "bfloat16"}
"""commprof's dtype -> nccl-tests' name for it (common.cu, `test_typenames`)."""

NULL_BODY = " " * 32
"""A mode with no result: the width of its four columns, blank (util.cu, `writeBenchMarkLineNullBody()`, which
nccl-tests prints where it measures in-place only). gloo has no out-of-place all_reduce, broadcast or reduce;
torch.distributed no in-place all_to_all or sendrecv."""


class Sweep(Protocol):
    """What the `# nThread` line says of the run: bench's config (commprof/bench/config.py) has these."""

    min_bytes: int
    max_bytes: int
    step_factor: float
    step_bytes: int
    warmup: int
    iters: int
    agg_iters: int
    check: int
    blocking: bool


@dataclass(frozen=True)
class RankLine:
    """One rank's line of the `# Using devices` block."""

    rank: int
    """The rank in the job."""
    pid: int
    """The rank's process id."""
    host: str
    """The host it runs on (its hostname)."""
    device: int
    """The CUDA device index; -1 for a rank whose tensors live in host memory (CUDA's own id for the CPU,
    cudaCpuDeviceId)."""
    bus: int | None
    """The GPU's PCI bus id (nccl-tests' `[0x%02x]`); None for a CPU rank, or where torch does not say it."""
    name: str
    """The GPU's name, or the CPU's model for a CPU rank."""


def render(records: list[dict], sweep: Sweep, ranks: list[RankLine]) -> str:
    """One block per collective (and algorithm) of `records`, in the order they were measured, as each
    nccl-tests binary prints its whole run."""
    runs: dict[tuple, list[dict]] = {}
    for rec in records:
        runs.setdefault((rec["collective"], rec.get("algo", "library")), []).append(rec)
    return "".join(block(recs, sweep, ranks) for recs in runs.values())


def block(records: list[dict], sweep: Sweep, ranks: list[RankLine]) -> str:
    """One collective's run: the header, a row per size (and type, op and root, in measurement order), the
    footer and the empty line nccl-tests ends on; every line ends in a newline."""
    lines = [*header(sweep, ranks), *columns()]
    lines += [row(by_mode) for by_mode in rows(records).values()]
    lines += footer(records)
    return "".join(line + "\n" for line in lines)


def header(sweep: Sweep, ranks: list[RankLine]) -> list[str]:
    """The run's parameters and the ranks (common.cu, `run()`). One thread and one GPU per process: commprof's
    ranks are processes."""
    if sweep.step_bytes > 0 or not sweep.step_factor > 1:
        step, kind = sweep.step_bytes, "bytes"
    else:  # nccl-tests reads -f as an integer; a fractional one (commprof takes -f 1.5) keeps its fraction
        step, kind = sweep.step_factor, "factor"
    step = int(step) if float(step).is_integer() else step
    lines = ["# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %s(%s) warmup iters: %d iters: %d "
             "agg iters: %d validation: %d graph: %d"
             % (1, 1, sweep.min_bytes, sweep.max_bytes, step, kind, sweep.warmup, sweep.iters, sweep.agg_iters,
                sweep.check, 0)]
    if sweep.blocking:
        lines.append("# Blocking Enabled: wait for completion and barrier after each collective ")
    lines += ["#", "# Using devices"]
    lines += [rank_line(r) for r in ranks]
    return lines


def rank_line(r: RankLine) -> str:
    """common.cu, `run()`: `#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s`; a CPU rank says
    `device -1 [cpu]` and its CPU's model, the columns kept. Group 0: one communicator of every rank."""
    bus = "cpu" if r.device < 0 else "?" if r.bus is None else "0x%02x" % r.bus
    return "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s" % (r.rank, 0, r.pid, r.host, r.device, bus,
                                                                      r.name)


def columns() -> list[str]:
    """The column header (common.cu, `run()`), after the `#` that closes the devices' block."""
    return [
        "#",
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
        % ("", "", "", "", ""),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s"
        % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
           "#wrong"),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s"
        % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""),
    ]


def rows(records: list[dict]) -> dict[tuple, dict[bool, dict]]:
    """(type, op, root, size) -> {inplace: record}, in measurement order."""
    out: dict[tuple, dict[bool, dict]] = {}
    for rec in records:
        out.setdefault((rec["dtype"], rec["redop"], rec.get("root"), rec["nbytes"]), {})[rec["inplace"]] = rec
    return out


def count(rec: dict) -> int:
    """nccl-tests' count column: the count passed to the collective (its `paramcount`), a rank's share of the
    size for the collectives that split it (all_gather, reduce_scatter, all_to_all), else the size's."""
    if COLLECTIVES[rec["collective"]].split:
        return rec["count"] // rec.get("group_size", rec["world_size"])
    return rec["count"]


def row(by_mode: dict[bool, dict]) -> str:
    """One size: common.cu's `TimeTest()` prints the first five columns (`%12li  %12li  %8s  %6s  %6s`, the root
    as `%6i`), `BenchTime()` each mode's four, out-of-place first."""
    ref = by_mode.get(False) or by_mode[True]
    root = -1 if ref.get("root") is None else ref["root"]
    # nccl-tests' sendrecv_perf prints its -o op though it reduces nothing; the JSON has none for it
    line = "%12li  %12li  %8s  %6s  %6s" % (ref["nbytes"], count(ref), TYPE_NAMES.get(ref["dtype"], ref["dtype"]),
                                          ref["redop"] or "none", "%6i" % root)
    for inplace in (False, True):
        rec = by_mode.get(inplace)
        line += NULL_BODY if rec is None else body(rec)
    return line


def body(rec: dict) -> str:
    """One mode's time, algbw, busbw and #wrong (common.cu, `BenchTime()`); #wrong is N/A under -c 0."""
    if rec["wrong"] is None:
        return "  %7s  %6.2f  %6.2f  %5s" % (time_str(rec["time_us"]), rec["algbw_GBps"], rec["busbw_GBps"], "N/A")
    return "  %7s  %6.2f  %6.2f  %5g" % (time_str(rec["time_us"]), rec["algbw_GBps"], rec["busbw_GBps"],
                                        float(rec["wrong"]))


def time_str(us: float) -> str:
    """common.cu, `BenchTime()`'s timeStr: 7 wide, 2 decimals below 100 us, 1 below 10,000 us, none above."""
    if us >= 10000.0:
        return "%7.0f" % us
    if us >= 100.0:
        return "%7.1f" % us
    return "%7.2f" % us


def out_of_bounds(records: list[dict]) -> int:
    """nccl-tests counts each rank's checks that found a wrong value (common.cu, `CheckData()`); commprof's records
    hold the wrong values summed over the ranks, so this counts the results (size and mode) that had one: 0
    exactly where nccl-tests' count is."""
    return sum(1 for rec in records if rec["wrong"])


def avg_busbw(records: list[dict]) -> float:
    """common.cu, `run()`: the mean busbw over every result printed, each size's modes apiece (`bw[0] /=
    bw_count[0]`), 0-byte rows included."""
    return sum(rec["busbw_GBps"] for rec in records) / len(records)


def footer(records: list[dict]) -> list[str]:
    """common.cu, `run()`'s last lines: out-of-bounds count, mean busbw (NCCL_TESTS_MIN_BW unset: `%g ` and an
    empty verdict), `#`, and ncclGetLastError()'s empty string on a line of its own."""
    wrong = out_of_bounds(records)
    return ["# Out of bounds values : %d %s" % (wrong, "FAILED" if wrong else "OK"),
            "# Avg bus bandwidth    : %g %s" % (avg_busbw(records), ""),
            "#",
            ""]
