"""The life of one commprof job, the same for every command that runs on ranks:

    args ─ build_config (once per process) ─┬─ launcher: local_ranks, check_world, launch.launch(argv)
                                            └─ rank: check_world, Comm, RankLife.begin (watchdog, env, trace),
                                               work → RankLife.gather (trace, results) → report (rank 0) → code

A command is a `Command`: it turns its flags into a frozen config and fills in the work one rank does and
the report rank 0 makes of every rank's result. `commprof profile` is a `Job` whose rank runs a user's
script, which makes its own process group (profile/rank.py): its rank begins the same RankLife when that
group exists (adopted, however the script made it) and gathers through it before the group goes. Everything
else — who launches, which rank speaks, the watchdog and its salvage, the trace, the env block, the shutdown
order — is here, once. `args` stops at `build_config`; below it everything reads the config. Exercised by: `pytest
tests/test_bench_cli.py tests/test_run_cli.py tests/test_failures.py`.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

from commprof.base import job
from commprof.base.backends import slots
from commprof.base.errors import UsageError
from commprof.base.flags import JobConfig
from commprof.base.world import World, bind_cores, check_room, discover, usable_cores
from commprof.launcher import launch

if TYPE_CHECKING:
    import torch

    from commprof.comm.failure.watchdog import Watchdog
    from commprof.record.contention import Contention


@dataclass
class Rank:
    """What a command's work sees of the job on one rank."""

    world: World
    comm: Any
    """The world's Comm; None for a single process that runs without one (run --strategy single)."""
    device: torch.device
    env: dict | None
    """The job's environment block (every rank's piece merged), on rank 0; None on the others."""
    watchdog: Watchdog | None
    contention: Contention | None = None
    """On rank 0: what else used this host's cores since the work began (record/contention.py)."""
    trace_dir: str | None = None
    """The folder this rank traced into (--trace's, or a private one for the findings); None: untraced."""

    def on_failure(self, fn: Callable[[int, str], None]) -> None:
        """Call `fn(code, message)` before a failing job ends this rank: write what was measured."""
        if self.watchdog is not None:
            self.watchdog.on_failure(fn)


class Job(Protocol):
    """What the launcher needs of a command that runs on ranks: its config, how many ranks, and what one rank
    does. `commprof profile` is a Job whose rank runs a user's script (profile/rank.py)."""

    def build_config(self, args: argparse.Namespace) -> JobConfig:
        """Every flag checked that can be without the world size; raises UsageError."""

    def local_ranks(self, cfg: JobConfig, slots: int) -> int:
        """Ranks to start on this host when nothing launched this process: --nproc, or a default from
        `slots`, the ranks this host runs without oversubscribing (cores, or GPUs for nccl)."""

    def check_world(self, cfg: JobConfig, world_size: int) -> None:
        """What depends on the world size; raises UsageError."""

    def rank_bytes(self, cfg: JobConfig) -> int:
        """Host memory one rank's buffers will take beyond the rank itself (bench's, at its largest size), for
        the launcher's check that the host holds the ranks (world.check_room); 0 when unknown."""
        return 0

    def run_rank(self, cfg: JobConfig, world: World, slots: int) -> int:
        """One rank, from start to exit code (every rank returns the job's code)."""


class Command(Job, Protocol):
    """A Job whose rank this module runs: the command fills in the work one rank does and the report rank 0
    makes of every rank's result (bench, run, which subclass it for these two)."""

    findings = False
    """True for a command whose report makes findings from every rank's op spans: it traces, into a private
    folder when --trace is not given (record/trace_folder.py)."""

    def run_rank(self, cfg: JobConfig, world: World, slots: int) -> int:
        return run_rank(self, cfg, world, slots)

    def without_comm(self, cfg: JobConfig, world: World) -> bool:
        """True when this process works alone, without a Comm."""

    def work(self, cfg: JobConfig, rank: Rank) -> Any:
        """This rank's part; returns what rank 0's report gets from it."""

    def report(self, cfg: JobConfig, rank: Rank, results: list) -> int:
        """Rank 0: tables and files from every rank's result; returns the job's exit code."""


def configure(command: Job, args: argparse.Namespace) -> tuple[JobConfig, int]:
    """The config and the number of local ranks to start, as checked before any rank starts; raises
    UsageError, changes nothing."""
    cfg, nproc, _ = _plan(command, args)
    return cfg, nproc


def _plan(command: Job, args: argparse.Namespace) -> tuple[JobConfig, int, int]:
    cfg = command.build_config(args)
    _check_outputs(cfg)
    have = slots(cfg.backend)
    nproc = command.local_ranks(cfg, have)
    command.check_world(cfg, nproc)
    _check_faults(nproc)
    rank_bytes = getattr(command, "rank_bytes", None)  # a Job need not say (run, profile: their script's)
    check_room(nproc, oversubscribe=args.oversubscribe, per_rank_bytes=rank_bytes(cfg) if rank_bytes else 0)
    return cfg, nproc, have


def main(command: Job, args: argparse.Namespace) -> int:
    """Launch the ranks, or be one: the exit code of the job, or of this rank."""
    world = discover()
    if world.launched:
        cfg = command.build_config(args)
        _check_outputs(cfg)
        command.check_world(cfg, world.world_size)
        _check_faults(world.world_size, say=world.rank == 0 and job.folder() is None)
        _huge_pages(cfg)
        if cfg.bind_cores:
            bind_cores(world)
        return command.run_rank(cfg, world, slots(cfg.backend))
    cfg, nproc, have = _plan(command, args)
    if cfg.bind_cores and nproc > usable_cores():
        raise UsageError(f"--bind-cores: {nproc} ranks and {usable_cores()} core(s) to share: at least one a rank")
    if nproc > 1 or cfg.backend == "mpi":
        return launch.launch(list(cfg.out.argv), nproc=nproc, backend=cfg.backend, oversubscribed=nproc > have,
                             timeout_s=cfg.timeout_s, json_path=cfg.out.json, trace_dir=cfg.out.trace,
                             huge_pages=cfg.huge_pages, served=_serves(cfg))
    _huge_pages(cfg)
    if cfg.bind_cores:
        bind_cores(world)
    return command.run_rank(cfg, world, have)


def _serves(cfg: JobConfig) -> bool:
    """A rank serves an endpoint the host must reach: --live's, unless --metrics-port off."""
    live = getattr(cfg, "live", None)
    return live is not None and live.address is not None


def _check_outputs(cfg: JobConfig) -> None:
    """Every file the job writes, --live's too, checked before any rank starts (base/files.py)."""
    live = getattr(cfg, "live", None)
    cfg.out.check(None if live is None else {"--live-log": live.log, "--metrics-targets": live.targets})


def _check_faults(world_size: int, say: bool = True) -> None:
    """COMMPROF_FAULT (comm/failure/faults.py) checked before any rank starts; torch is loaded only when it is set
    (comm/ imports it, and the launcher checks flags without it)."""
    if os.environ.get("COMMPROF_FAULT"):
        import sys

        from commprof.comm.failure import faults

        for line in faults.check(world_size):  # said once: by the launcher, or rank 0 under another's
            if say:
                sys.stderr.write(f"commprof: {line}\n")


def _huge_pages(cfg: JobConfig) -> None:
    """--huge-pages in this process, a rank: torch reads the variable at its first large CPU allocation,
    which comes later."""
    if cfg.huge_pages:
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"


def run_rank(command: Command, cfg: JobConfig, world: World, have: int) -> int:
    """One rank from Comm to exit code; rank 0 reports, every rank returns the job's code. `have`: the
    ranks this host runs without oversubscribing."""
    if cfg.backend == "nccl" and world.local_world_size > have:
        raise UsageError(f"nccl needs one GPU per rank: {world.local_world_size} ranks per host, {have} GPU(s)")
    # A rank's imports, here rather than at the top: the launcher never loads torch (seconds) or MPI.
    import torch

    from commprof.comm import init_comm

    torch.set_num_threads(max(1, usable_cores() // world.local_world_size))
    comm = None
    if not command.without_comm(cfg, world):
        comm = init_comm(world, backend=cfg.backend, timeout_s=cfg.timeout_s,
                         oversubscribed=world.local_world_size > have, device=getattr(cfg, "device", None))
    life = RankLife(cfg, world, have, findings=command.findings)
    try:  # closed on every way out but os._exit; the process then ends through comm.end_process
        with life:
            rank = life.begin(comm, device=None if comm is not None else _device(getattr(cfg, "device", None) or "cpu",
                                                                                 world))
            results = life.gather(command.work(cfg, rank))
            code = command.report(cfg, rank, results) if world.rank == 0 else 0
            if comm is not None:
                code = comm.broadcast_object(code, src=0)
    finally:
        life.close()
        if comm is not None:
            comm.close()
    return code


class RankLife:
    """A rank's life around its world Comm, the same for every command: the watchdog, the env block, the
    contention record and the trace begin with `begin`; `gather` closes the trace and brings every rank's
    result to rank 0; leaving it as a context (or `unwatch`) ends the watchdog, which turns an exception that
    leaves the block into the job's verdict. bench and run make their Comm (run_rank); `commprof profile`
    adopts the one its script's process group gives (profile/rank.py), begins when that group exists and
    gathers before it goes."""

    def __init__(self, cfg: JobConfig, world: World, have: int, *, findings: bool) -> None:
        from commprof.record import trace_folder

        self.cfg, self.world, self.have = cfg, world, have
        self.folder = trace_folder.for_rank(cfg.out.trace, world.rank, findings=findings)
        """Where this rank traces (--trace's folder, or a private one for the findings); None: untraced."""
        self.rank: Rank | None = None
        """What the work sees, once begun."""
        self.tracer = None
        self.watchdog: Watchdog | None = None
        """Watching the Comm from `begin` until the block ends (or `unwatch`)."""

    def begin(self, comm, device=None, *, backend: str | None = None) -> Rank:
        """Watch `comm` (None: a process working alone, on `device`), gather the env block to rank 0 and
        start the trace: the Rank the command's work sees."""
        from commprof.base.env import local_env, merge_env
        from commprof.comm.failure.watchdog import Watchdog
        from commprof.record import trace
        from commprof.record.contention import Contention

        world, cfg = self.world, self.cfg
        if comm is not None:
            self.watchdog = Watchdog(comm, timeout_s=comm.timeout_s or cfg.timeout_s, rank=world.rank,
                                      dump_dir=cfg.out.dump_folder()).__enter__()
        device = comm.device if comm is not None else device
        pieces = comm.gather_object(local_env(device), dst=0) if comm is not None else [local_env(device)]
        env = None if pieces is None else merge_env(
            pieces, backend=backend or cfg.backend, world_size=len(pieces), local_world_size=world.local_world_size,
            slots=self.have, oversubscribed=world.local_world_size > self.have, launcher=world.launcher,
            clock=comm.clock.kind if comm is not None else device.type, argv=["commprof", *cfg.out.argv])
        rank = self.rank = Rank(world, comm, device, env, self.watchdog)
        if pieces is not None:  # the job's ranks on rank 0's host: their CPU is the job's own
            rank.contention = Contention([p["pid"] for p in pieces if p["host"] == pieces[0]["host"]])
        if self.folder is not None:
            self.tracer = trace.start(comm, self.folder.path)
            rank.trace_dir = self.folder.path
            rank.on_failure(self._abandon)
        return rank

    def _abandon(self, code: int, message: str) -> None:
        from commprof.record import trace

        if self.tracer is not None:
            tracer, self.tracer = self.tracer, None
            trace.abandon(tracer)
        self.folder.discard()

    def __enter__(self) -> RankLife:
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        """The watchdog ends with the block: on an exception it claims the failure (a CommprofError ends the job
        with its line) or saves what was measured (Ctrl-C, a bug) before the exception goes on."""
        if self.watchdog is None:
            return False
        watchdog, self.watchdog = self.watchdog, None
        return watchdog.__exit__(kind, exc, tb)

    def gather(self, result) -> list | None:
        """Close the trace (rank 0 merges every rank's) and gather every rank's `result`: the list on rank 0,
        None elsewhere."""
        import sys

        from commprof.record import trace

        comm = self.rank.comm
        if self.tracer is not None:
            tracer, self.tracer = self.tracer, None
            merged = trace.finish(comm, tracer, self.folder.path)
            if merged is not None and self.folder.asked:
                # one plain line, never wrapped: a path is copied from it
                sys.stderr.write(f"trace: {merged} ({self.world.world_size} rank(s)); open in ui.perfetto.dev or "
                                 "chrome://tracing\n")
        return comm.gather_object(result, dst=0) if comm is not None else [result]

    def unwatch(self) -> None:
        """Every rank's result is in: the watchdog goes (before a script's group does)."""
        self.__exit__(None, None, None)

    def close(self) -> None:
        if self.folder is not None:
            self.folder.discard()


def _device(kind: str, world: World) -> torch.device:
    import torch

    if kind == "cuda":
        from commprof.comm import require_torch_cuda

        require_torch_cuda()
        device = torch.device("cuda", world.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")
