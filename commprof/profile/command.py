"""`commprof profile`: run an unchanged training script on every rank with commprof underneath it, and report
its iterations as `commprof run` reports its own strategies — the compute/comm split, volume per op and per
group, tables, JSON, Chrome trace and NVTX.

    commprof profile --nproc 2 -- train.py --epochs 1
    commprof profile --nproc 4 --json out.json --trace tr -- train.py
    torchrun --nproc-per-node 2 -m commprof profile -- train.py      (or mpiexec -n 2, srun)

The script runs as `python train.py` would (its own arguments, output, exit code and import path; `__main__`), and
initialises its process group itself (`init_process_group()` with env:// works under every launcher:
commprof fills in the rendezvous). What is seen and what is not: commprof/intercept/interpose.py and
commprof/intercept/ddp_reducer.py; how iterations and phases are found: commprof/record/hooks.py.
Exercised by: `pytest tests/test_profile_cli.py`.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from commprof.base import flags
from commprof.base.backends import default_backend, require_cuda
from commprof.base.errors import UsageError
from commprof.base.flags import JobConfig
from commprof.base.world import World
from commprof.launcher import lifecycle
from commprof.live.config import LiveConfig, add_live_flags, live_config
from commprof.perfmodel.fabric import Fabric, link_flag


@dataclass(frozen=True)
class ProfileConfig(JobConfig):
    """What `commprof profile` was asked to do."""

    script: str
    """The script's path, as given."""
    script_args: tuple[str, ...]
    """The script's own arguments (its sys.argv[1:])."""
    warmup: int
    """Iterations not measured (--warmup, 4 by default): the first, after which DDP rebuilds its buckets, and
    those after it, aligned (record/aligned.py): each collective's parties meet before it, and the median of
    their transfers prices the ops a straggler late at every step makes late (findings/whatif.py)."""
    steps_per_epoch: int | None
    """Iterations per epoch, for volume per epoch; None: every iteration the script ran is the epoch."""
    global_batch: int | None
    """Samples per iteration across ranks, for throughput in samples/s; None: iterations/s only."""
    ddp_reducer: bool = True
    """Route DistributedDataParallel's reducer (its bucket all-reduces) through Comm, by the process group
    it is given (intercept/ddp_reducer.py); False leaves them unseen in C++."""
    link: Fabric | None = None
    """The link the ops cross (--link-rate: a rate, a fabric spec or a bench JSON): the findings name the ops
    below half of its rate."""
    live: LiveConfig | None = None
    """--live: windows of steps exported while the job runs (docs/live.md); None: the figures at the end only."""


def add_parser(subparsers, summary: str) -> None:
    p = subparsers.add_parser("profile", help=summary, description="""\
Run your training script, unchanged, on every rank with commprof underneath it, and report its iterations
as `commprof run` reports its own: the compute/communication split per iteration and rank, the volume per
op and process group, tables, --json, --trace (Chrome/Perfetto) and NVTX ranges. The script runs as
`python train.py` would, with its own arguments and exit code, and initialises its process group itself
(init_process_group() with env:// works under every launcher). Volume is per epoch with --steps-per-epoch,
else over the whole run.

examples:
  commprof profile --nproc 2 -- train.py --epochs 1
  commprof profile --nproc 4 --json out.json --trace tr \\
      --steps-per-epoch 1563 -- train.py
  torchrun --nproc-per-node 2 -m commprof profile -- train.py  # or srun
""")
    p.add_argument("--warmup", type=int, default=4,
                   help="iterations not measured (default 4: 1-3 aligned, to price a straggler's late ops)")
    p.add_argument("--steps-per-epoch", type=int, help="iterations per epoch (default: all the script ran)")
    p.add_argument("--global-batch", type=int, help="samples per iteration, all ranks (for samples/s)")
    p.add_argument("--ddp-reducer", action=argparse.BooleanOptionalAction, default=True,
                   help="DDP's bucket all-reduces through Comm (default on; off: they stay unseen in C++)")
    flags.add_job_flags(p, nproc="one per core or GPU, at least 2", json="every figure per rank per iteration",
                        timeout="; the script's own timeout=, if it gives one, wins")
    flags.add_link_flag(p)
    add_live_flags(p)
    p.add_argument("script", help="the training script (give -- before it when it takes flags)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's own arguments")
    p.set_defaults(func=main)


def build_config(args: argparse.Namespace) -> ProfileConfig:
    if not os.path.isfile(args.script):
        raise UsageError(f"script {args.script!r} does not exist" if not os.path.exists(args.script)
                         else f"script {args.script!r} is not a file")
    backend = args.backend or default_backend()
    if backend == "nccl":
        require_cuda()
    flags.at_least("--warmup", args.warmup, 0)
    for flag, value in (("--steps-per-epoch", args.steps_per_epoch), ("--global-batch", args.global_batch)):
        if value is not None:
            flags.at_least(flag, value, 1)
    job = flags.job_config(args, backend)
    rest = list(args.script_args)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    return ProfileConfig(script=args.script, script_args=tuple(rest), warmup=args.warmup,
                         steps_per_epoch=args.steps_per_epoch, global_batch=args.global_batch,
                         ddp_reducer=args.ddp_reducer, link=link_flag(args.link_rate), live=live_config(args),
                         **job)


class _Profile:
    """profile's part of the job's life cycle (commprof/launcher/lifecycle.py): the launcher's, as bench's and run's;
    a rank runs the script (profile/rank.py), which makes its own process group."""

    build_config = staticmethod(build_config)
    def local_ranks(self, cfg: ProfileConfig, slots: int) -> int:
        return cfg.nproc if cfg.nproc is not None else max(2, slots)

    def check_world(self, cfg: ProfileConfig, world_size: int) -> None:
        pass  # the script decides what it can run on

    def run_rank(self, cfg: ProfileConfig, world: World, slots: int) -> int:
        from commprof.profile.rank import run_rank

        return run_rank(cfg, world)


COMMAND = _Profile()


def main(args: argparse.Namespace) -> int:
    return lifecycle.main(COMMAND, args)
