"""The flags every job takes, declared once for bench, run and profile (where its ranks run, how long one
may wait, where the job writes), the JobConfig they fill (the part of every command's config the launcher
and the life cycle read), and the checks on numeric flag values the commands share: one line naming the
flag and the value, before any rank starts.

Exercised by: `pytest tests/unit/test_cli_grammar.py tests/test_bench_cli.py`.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

from commprof.base.backends import BACKENDS, DEVICES
from commprof.base.errors import UsageError
from commprof.base.files import Outputs

TIMEOUT_S = 300.0
"""--timeout's default, the same for every command: how long one rank may wait on its peers in one op, or
in the rendezvous, before the job ends (exit 3). Long enough for the slowest wait a healthy job makes — a
first step that builds NCCL's communicators, loads its data and compiles; bench's largest size on a slow
link — and still half of torch's own default for NCCL (10 min; gloo's is 30), so a stall is named within
five minutes."""

INT64_MAX = (1 << 63) - 1
"""The largest whole number a flag may be: torch holds counts, sizes and steps in int64."""

MAX_TIMEOUT_S = 1e9
"""The longest --timeout: gloo counts its deadline in int64 nanoseconds, and 1e10 s already overflows
them (the rendezvous then times out at once)."""


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """What every command that starts ranks takes (add_job_flags): bench's, run's and profile's configs
    extend it, and the launcher and the life cycle (launcher/lifecycle.py) read only this of them."""

    backend: str
    """gloo, nccl or mpi (--backend). profile: the backend an `init_process_group()` that names none gets;
    mpi there means ranks started by mpiexec, the script's group still torch's."""
    nproc: int | None = None
    """Local ranks to start (--nproc); None: the command's default (one per core or GPU, or what its
    model-parallel degrees need)."""
    timeout_s: float = TIMEOUT_S
    """How long a rank may wait on its peers in one op or in the rendezvous before the job ends (--timeout).
    profile: the process group's timeout unless the script sets one."""
    huge_pages: bool = False
    """torch's large CPU buffers on transparent huge pages in every rank (--huge-pages, THP_MEM_ALLOC_ENABLE=1
    before torch allocates); False: the allocator as the environment has it."""
    bind_cores: bool = False
    """Each rank bound to its own share of its host's cores (--bind-cores), before torch starts a thread;
    False: unbound, as torchrun leaves ranks. Unbound CPU ranks lend each other their cores: one that waits
    on a peer frees its core."""
    out: Outputs = field(default_factory=Outputs)
    """Files the job writes (--json, --trace, --debug-dump, …) and the command line it was started with."""


def job_config(args: argparse.Namespace, backend: str) -> dict:
    """JobConfig's fields from add_job_flags' parsed flags (checked: check_job_flags), with the backend the
    command settled on; a command's config takes them as `**job_config(args, backend)`."""
    check_job_flags(args)
    return dict(backend=backend, nproc=args.nproc, timeout_s=args.timeout, huge_pages=args.huge_pages,
                bind_cores=args.bind_cores, out=Outputs.from_args(args))


def add_job_flags(p: argparse.ArgumentParser, *, nproc: str, json: str, timeout: str = "") -> None:
    """--backend, --nproc, --timeout, --json, --trace, --debug-dump, --huge-pages and --bind-cores, as every
    command that starts ranks takes them. `nproc`: what --nproc defaults to; `json`: what --json holds;
    `timeout`: a word on --timeout of the command's own."""
    p.add_argument("--backend", choices=BACKENDS, help="default: nccl with CUDA, else gloo; mpi: ranks started "
                                                       "by mpiexec")
    p.add_argument("--nproc", type=int, help=f"local ranks to start (default: {nproc}); at most 4 a core and what "
                                               "the memory holds")
    p.add_argument("--oversubscribe", action="store_true",
                   help="start more than 4 ranks a core (as mpirun's --oversubscribe; the memory bound stays)")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S,
                   help=f"seconds a rank may wait on its peers (default {TIMEOUT_S:g}){timeout}")
    p.add_argument("--json", metavar="PATH", help=json)
    p.add_argument("--trace", metavar="DIR", help="Chrome/Perfetto trace: DIR/rank<r>.trace.json + DIR/trace.json")
    p.add_argument("--debug-dump", metavar="DIR",
                   help="on a failure, each rank's last ops as DIR/rank<r>.flight.json, and as fr_trace_rank_<r> "
                        "for `python -m torch.distributed.flight_recorder.fr_trace DIR -p fr_trace_rank_` "
                        "(default: beside --json)")
    p.add_argument("--huge-pages", action="store_true",
                   help="torch's large CPU buffers on transparent huge pages (THP_MEM_ALLOC_ENABLE=1), as a tuned "
                        "job sets it (default: the allocator as the environment has it; the JSON's env.allocator "
                        "says which)")
    p.add_argument("--bind-cores", action="store_true",
                   help="each rank bound to its own share of this host's cores, as mpirun --bind-to core does "
                        "(default: unbound, as torchrun leaves them; the JSON's env says each rank's cores)")


def add_device_flag(p: argparse.ArgumentParser) -> None:
    """--device, for the commands whose tensors commprof makes (bench, run); a profiled script places its own."""
    p.add_argument("--device", choices=DEVICES,
                   help="where the tensors live (default: cuda for nccl, else cpu); gloo moves CUDA tensors too, "
                        "so ranks can share one GPU")


def add_link_flag(p: argparse.ArgumentParser) -> None:
    """--link-rate, for the commands whose findings judge ops against the link they cross (run, profile)."""
    p.add_argument("--link-rate", metavar="RATE",
                   help="the link the ranks' ops cross: one rate (e.g. 100Gbit/s, 25GB/s), a rate per level as "
                        "predict's --fabric takes it (intra=…;inter=…), or a bench JSON; the findings name the ops "
                        "that reach less than half of it")


def add_plot_flag(p: argparse.ArgumentParser, *, launcher: bool) -> None:
    """--plot DIR, PNG figures into a folder: bench's and run's (`launcher`: drawn by commprof's own launcher,
    refused on ranks started by another, refuse_plot) and report's, from a JSON. predict's --plot is one file
    of its own meaning."""
    p.add_argument("--plot", metavar="DIR",
                   help="PNG plots into DIR" + (" (with commprof's own launcher)" if launcher else ""))


def check_job_flags(args: argparse.Namespace) -> None:
    """The checks on add_job_flags' numbers."""
    at_least("--nproc", args.nproc, 1)
    timeout(args.timeout)


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
