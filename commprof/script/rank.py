"""One rank of `commprof profile`: the script run under interposition, every rank's figures gathered before
its process group goes, and rank 0's report.

    install → the script (runpy, as __main__) ─┬─ its destroy_process_group(): gather first, then destroy
                                               └─ its end with the group alive: gather, destroy
            → rank 0: tables, --json; every rank: the script's own exit code

The script's exceptions are its own: the first rank to fail shows the traceback (from the script's frames
down), the job exits 1. A peer that stalls or dies reaches the others as commprof's one-line error (their
collectives run through Comm, under --timeout unless the script set a timeout of its own).
Exercised by: `pytest tests/test_profile_cli.py`.
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from commprof import job
from commprof.backends import slots
from commprof.comm import _rendezvous, ddp_reducer, functional, interpose, join
from commprof.errors import CommprofError, UsageError
from commprof.profile import hooks, trace
from commprof.profile.clock import CpuClock
from commprof.profile.recorder import OpRecorder
from commprof.profile.volume import step_volume
from commprof.report import files
from commprof.report.env import local_env, merge_env
from commprof.world import World, usable_cores


def run_rank(cfg, world: World) -> int:
    """This rank's exit code: the script's, or 1 when it raised, or 2 when it never made a process group."""
    _rendezvous_env(world)
    torch.set_num_threads(max(1, usable_cores() // world.local_world_size))
    job.check_in(world.rank, world.world_size, timeout_s=cfg.timeout_s)
    join("profile")  # the process ends through comm.end_process: see there why
    session = Session(cfg, world)
    try:
        code = session.run()
    finally:
        session.close()
    return code


def _rendezvous_env(world: World) -> None:
    """torchrun's variables, so the script's env:// rendezvous works under mpiexec and srun too."""
    addr, port = _rendezvous(world)
    os.environ.update(RANK=str(world.rank), WORLD_SIZE=str(world.world_size), LOCAL_RANK=str(world.local_rank),
                      LOCAL_WORLD_SIZE=str(world.local_world_size), MASTER_ADDR=addr, MASTER_PORT=str(port))


class Session:
    """The script's run on this rank, with commprof underneath."""

    def __init__(self, cfg, world: World) -> None:
        self.cfg, self.world = cfg, world
        self.recorder = OpRecorder(CpuClock())
        self.interposer = interpose.install(self.recorder)
        if cfg.ddp_reducer:
            ddp_reducer.install(self.interposer)
        functional.install(self.interposer.unseen)
        self.tracker = hooks.install(self.recorder, cfg.warmup)
        self.initialised = False
        self.gathered: tuple | None = None
        """(every rank's result, the env block) on rank 0, (None, None) elsewhere, once gathered."""
        self.tracer = None
        self._saved = (dist.init_process_group, dist.destroy_process_group)
        dist.init_process_group = self._init
        dist.destroy_process_group = self._destroy

    # ---- the script's process group ---------------------------------------------------------
    def _init(self, backend=None, init_method=None, timeout=None, *args, **kwargs):
        if backend is None and self.cfg.backend != "mpi":
            backend = self.cfg.backend
        if timeout is None:
            timeout = timedelta(seconds=self.cfg.timeout_s)
        c10d.init_process_group(backend, init_method, timeout, *args, **kwargs)
        self.initialised = True
        world = self.interposer.comm(None)
        world.timeout_s = self.cfg.timeout_s
        if self.cfg.out.trace:
            self.tracer = trace.start(world, self.cfg.out.trace)

    def _destroy(self, group=None):
        if group is None and self.gathered is None and c10d.is_initialized():
            self.gather()
        c10d.destroy_process_group(group)

    # ---- the run ----------------------------------------------------------------------------
    def run(self) -> int:
        script = self.cfg.script
        sys.argv = [script, *self.cfg.script_args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except CommprofError:
            raise
        except KeyboardInterrupt:
            return 130
        except Exception as exc:
            return self._raised(exc)
        if self.gathered is None:
            if not self.initialised:
                raise UsageError(f"{script} never initialised a torch.distributed process group: nothing to "
                                 "profile")
            if code != 0 or not c10d.is_initialized():
                return self._exited(code)
            self.gather()
        results, env = self.gathered
        if results is not None:
            self.report(results, env)
        return self._exited(code)

    def _exited(self, code: int) -> int:
        """The script's own exit status; a non-zero one is the job's (claimed before a peer, left waiting in a
        collective, calls it a lost peer), as `python train.py` or torchrun would end with it."""
        if code != 0 and job.claim(code, f"rank {self.world.rank}: {self.cfg.script} exited with status {code}",
                                   self.world.rank):
            sys.stderr.write(f"commprof: error: rank {self.world.rank}: {self.cfg.script} exited with status "
                             f"{code}\n")
            sys.stderr.flush()
        return code

    def _raised(self, exc: Exception) -> int:
        """The script's own failure: its traceback once in the job (the first rank to fail), exit 1."""
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        if job.claim(1, f"rank {self.world.rank}: {self.cfg.script} raised {type(exc).__name__}: {first}",
                     self.world.rank):
            tb = exc.__traceback__
            script = os.path.abspath(self.cfg.script)
            while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != script:
                tb = tb.tb_next
            sys.stderr.write(f"rank {self.world.rank}: ")
            if tb is None and isinstance(exc, SyntaxError):  # as `python train.py` shows it: no frames
                sys.stderr.writelines(traceback.format_exception_only(type(exc), exc))
            else:
                traceback.print_exception(type(exc), exc, tb if tb is not None else exc.__traceback__)
            sys.stderr.flush()
        return 1

    def gather(self) -> None:
        """Every rank's figures to rank 0 over the script's default group, while it still exists."""
        self.tracker.finish()
        comm = self.interposer.comm(None)
        if self.tracer is not None:
            merged = trace.finish(comm, self.tracer, self.cfg.out.trace)
            self.tracer = None
            if merged is not None:
                sys.stderr.write(f"trace: {merged} ({comm.world_size} rank(s)); open in ui.perfetto.dev\n")
        t = self.tracker
        result = {"rank": self.world.rank, "iterations": t.iterations, "volume_steps": t.volumes,
                  "found": t.index, "outside": step_volume(t.outside), "unseen": dict(self.interposer.unseen),
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        pieces = comm.gather_object(local_env(torch.device("cpu")), dst=0)
        results = comm.gather_object(result, dst=0)
        env = None
        if pieces is not None:
            have = slots(self.cfg.backend)
            env = merge_env(pieces, backend=c10d.get_backend(), world_size=len(pieces),
                            local_world_size=self.world.local_world_size, slots=have,
                            oversubscribed=self.world.local_world_size > have, launcher=self.world.launcher,
                            clock="cpu", argv=["commprof", *self.cfg.out.argv])
        self.gathered = (results, env)

    def report(self, results: list[dict], env: dict) -> None:
        from rich.console import Console

        from commprof.report.script_table import profile_tables
        from commprof.script.results import combine

        doc = combine(self.cfg, results, env)
        out = Console()
        console = out if out.is_terminal else Console(width=200)
        for table in profile_tables(doc):
            console.print(table)
        if self.cfg.out.json:
            files.write_atomic(self.cfg.out.json, json.dumps({"complete": True, **doc}, indent=1) + "\n")

    def close(self) -> None:
        """Hooks off. A process group the script left behind stays: the process ends without finalizing."""
        hooks.uninstall()
        ddp_reducer.uninstall()
        functional.uninstall()
        dist.init_process_group, dist.destroy_process_group = self._saved
        interpose.uninstall()


def _exit_code(code) -> int:
    """sys.exit's argument as the process would turn it into a status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1
