"""nccl-tests' own spellings in `commprof bench`: the numbers of -a, `-r all`, -c's check count, and the flags
of nccl-tests' threads-and-GPUs-per-process model: accepted where their value asks for what commprof does anyway
(AS_HERE), refused otherwise with one line that says what to use instead.

    commprof bench all_reduce -b 8 -e 64K -f 2 -a 1 -c 1 -m 2 -z 0 -F out.csv --nproc 2   # all_reduce_perf's flags
    commprof bench broadcast -r all --nproc 2          # every rank in turn is the root, each its own rows
    commprof bench all_reduce -b 8 -e 128M -f 2 -g 1   # -g 1, -t 1, -p 0, -N 1, -C 0, -G 0, …: what runs anyway
    commprof bench all_reduce -g 2                     # error: -g 2: one GPU per rank: use --nproc 2

Exercised by: `pytest tests/test_nccl_tests_flags.py`.
"""

from __future__ import annotations

import argparse

from commprof.base import flags
from commprof.base.errors import UsageError

AVERAGE = {"0": "rank0", "1": "avg", "2": "min", "3": "max"}
"""-a's numbers in nccl-tests (0 = rank 0's own time, 1 = the average over ranks, 2 = min, 3 = max) and
commprof's names for them."""


def _ranks(what: str):
    def why(value: str) -> str:
        n = value.strip()
        return f"one {what} per rank: use --nproc {n if n.isascii() and n.isdigit() and int(n) > 1 else 'N'}"
    return why


REFUSED = {
    ("-t", "--nthreads"): _ranks("thread"),
    ("-g", "--ngpus"): _ranks("GPU"),
    ("-p", "--parallel_init"): lambda v: "every rank is a process of its own, none initialises threads: drop -p",
    ("-G", "--cudagraph"): lambda v: "each op is issued by torch.distributed, not replayed from a CUDA graph: "
                                     "drop -G",
    ("-N", "--run_cycles"): lambda v: "one cycle per run: run the command again, or a grid (docs/studies.md)",
    ("-C", "--report_cputime"): lambda v: "the time is CPU time on gloo and MPI and CUDA events on NCCL "
                                          "(docs/bench.md): drop -C",
    ("-R", "--local_register"): lambda v: "torch.distributed does not register buffers: drop -R",
    ("-S", "--report_timestamps"): lambda v: "every iteration's time is in --json (times_us), when it ran in "
                                             "--trace DIR: use those",
    ("-M", "--memory_report"): lambda v: "bench reports no GPU memory: drop -M",
    ("-y", "--stream_null"): lambda v: "ops run on torch's current stream: drop -y",
    ("-x", "--cta_policy"): lambda v: "NCCL's CTA policy is not reachable through torch.distributed: drop -x",
    ("-D", "--device_implementation"): lambda v: "NCCL's device API is not reachable through torch.distributed: "
                                                 "drop -D",
    ("-V", "--device_cta_count"): lambda v: "NCCL's device API is not reachable through torch.distributed: "
                                            "drop -V",
}
"""nccl-tests' flags that have no meaning here, and why, from the value given."""

AS_HERE = {"-t": "1", "-g": "1", "-p": "0", "-N": "1", "-C": "0", "-R": "0", "-S": "0", "-M": "0", "-y": "0",
           "-G": "0", "-D": "0"}
"""The value of each of those flags that asks for what commprof does anyway (nccl-tests' default): one thread
and one GPU per process, no parallel init, one cycle, CUDA events or host time as commprof chooses, no
registration, timestamps, memory report, null stream, CUDA graph or device API. The common
`all_reduce_perf -b 8 -e 128M -f 2 -g 1` runs as it is."""


def add_flags(p: argparse.ArgumentParser) -> None:
    """-m, -z, -T, -J and the refused flags (-F is --csv's short form, in bench's own parser)."""
    p.add_argument("-m", "--agg_iters", type=int, default=1,
                   help="ops per iteration, issued back to back and timed together (default 1)")
    p.add_argument("-z", "--blocking", type=int, choices=(0, 1), default=0,
                   help="1: wait on each op before the next, and a barrier after each iteration (default 0)")
    p.add_argument("-T", dest="timeout", type=float, default=argparse.SUPPRESS, help="--timeout's nccl-tests form")
    p.add_argument("-J", "--output_file", dest="json", metavar="PATH", default=argparse.SUPPRESS,
                   help="--json's nccl-tests form (commprof's JSON, see docs/bench.md)")
    for options in REFUSED:
        p.add_argument(*options, dest=_dest(options), metavar="N", help=argparse.SUPPRESS)


def _dest(options: tuple[str, str]) -> str:
    return "nccl_" + options[1].lstrip("-")


def refuse(args: argparse.Namespace) -> None:
    """UsageError naming the first refused flag given."""
    for options, why in REFUSED.items():
        value = getattr(args, _dest(options), None)
        if value is not None and value.strip() != AS_HERE.get(options[0]):
            shown = value if value.isprintable() and 0 < len(value) <= 40 else repr(value[:40])
            raise UsageError(f"{options[0]} {shown}: {why(value)}")


def average(value: str) -> str:
    """-a: avg, min, max or rank0, or nccl-tests' 0-3."""
    agg = AVERAGE.get(value.strip(), value)
    if agg not in AVERAGE.values():
        raise UsageError(f"-a {value!r}: give 0 (rank 0), 1 (avg), 2 (min), 3 (max) or avg, min, max, rank0")
    return agg


def root(value: str) -> tuple[int, bool]:
    """-r: (root, every root in turn) from a rank or `all`."""
    if value.strip() == "all":
        return 0, True
    try:
        rank = int(value)
    except ValueError:
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise UsageError(f"--root {shown!r}: give a rank or all") from None
    flags.at_least("--root", rank, 0)
    return rank, False
