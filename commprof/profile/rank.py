"""One rank of `commprof profile`: the script run under interposition, every rank's figures gathered before
its process group goes, and rank 0's report.

    install → the script (runpy, as __main__) ─┬─ its destroy_process_group(): gather first, then destroy
                                               └─ its end with the group alive: gather, destroy
            → rank 0: tables, --json; every rank: the script's own exit code

The rank checks in with its job before the script runs; the script's init_process_group meets its peers under
the start-up deadline (comm/joining.py). The interception (intercept/) sees the script's default group born and
destroyed and calls back here: once it exists — made by init_process_group under any name, or by DeviceMesh —
(`_adopt`), and before it goes (`_dying`). Once it exists the rank begins the life cycle bench and run have
(lifecycle.RankLife: watchdog, env block, trace), and gathers through it before the group goes. The watchdog
(comm/failure/watchdog.py) watches it as it watches `commprof run`: its collectives run through Comm, so a stall
past --timeout (or the script's own timeout), a backend error, the script's exception or its non-zero exit is
claimed on a control plane beside the script's rendezvous store; the ranks' flight records then tell a desync
(exit 4, naming both calls) from a stalled or dead peer (3), and the rank that failed first speaks for the job —
its traceback from the script's frames down (exit 1), or its exit status. Rank 0 keeps what it measured: its
iterations so far, printed and in --json, marked incomplete.

torch's flight record is on in every rank (TORCH_FR_BUFFER_SIZE, unless the user sized it); rank 0 stamps the wall
clock at each measured iteration's begin and end and reads its record once, after the last, for the report to set
against what commprof counted (torch_record.py).
Exercised by: `pytest tests/test_profile_cli.py tests/test_profile_failures.py`.
"""

from __future__ import annotations

import os
import resource
import runpy
import sys
import time
from collections import deque

import torch
from torch.distributed import distributed_c10d as c10d

from commprof.base import files, job
from commprof.base.backends import slots
from commprof.base.env import local_env, merge_env
from commprof.base.errors import CommprofError, ScriptError, UsageError
from commprof.base.world import World, usable_cores
from commprof.comm import join
from commprof.comm.joining import Joining
from commprof.intercept import Interception
from commprof.launcher.kept import Kept
from commprof.launcher.lifecycle import RankLife
from commprof.live import monitor
from commprof.profile import ending, rendezvous, torch_record
from commprof.record.clock import CpuClock, CudaClock
from commprof.record.contention import note
from commprof.record.recorder import OpRecorder
from commprof.record.volume import step_volume
from commprof.report.progress import StepProgress
from commprof.report.script_table import print_profile


def backend_of(pg) -> str:
    """The backend of the script's group by its name: a group init_device_mesh made (or one made with no
    backend named) is 'undefined' to get_backend; torch keeps its name beside it ('gloo'), or a backend a
    device ('cpu:gloo,cuda:nccl'), of which this job's device's counts."""
    name = str(c10d.get_backend(pg))
    if name == "undefined":
        name = str(getattr(pg, "_get_backend_name", lambda: name)())
    if name == "undefined":
        kinds = dict(part.split(":", 1) for part in str(c10d.get_backend_config(pg)).split(",") if ":" in part)
        name = kinds.get("cuda" if torch.cuda.is_available() else "cpu", name)
    return name


def run_rank(cfg, world: World) -> int:
    """This rank's exit code: the script's, or 1 when it raised, or 2 when it never made a process group."""
    joining = Joining(world, timeout_s=cfg.timeout_s)  # the at=start faults fire here
    rendezvous.set_env(world)
    torch.set_num_threads(max(1, usable_cores() // world.local_world_size))
    joining.check_in()  # before the script runs; it meets its peers when it makes its group (intercept/groups.py)
    join("profile")  # the process ends through comm.end_process: see there why
    session = Session(cfg, world, joining)
    try:
        code = session.run()
    finally:
        session.close()
    return code


class Session:
    """The script's run on this rank, with commprof underneath."""

    def __init__(self, cfg, world: World, joining: Joining) -> None:
        self.cfg, self.world = cfg, world
        self.recorder = OpRecorder(CpuClock())
        """One clock for the ops and the phases: CUDA events once the script's group is NCCL's (_adopt)."""
        self.life = RankLife(cfg, world, slots(cfg.backend), findings=cfg.live is None)
        """The rank's life cycle, bench's and run's (lifecycle.py), begun once the script's group exists. A live
        job (days long) keeps no trace for its findings: its windows make them (live/)."""
        self.live: monitor.Live | None = None
        self.kept: Kept | None = None
        """rank 0: its document while the job goes (commprof/launcher/kept.py)."""
        self.initialised = False
        self.gathered: tuple | None = None
        """(every rank's result, the env block) on rank 0, (None, None) elsewhere, once gathered."""
        # --backend mpi is mpi4py's (comm/mpi_comm.py), not a torch.distributed backend: a script's group that
        # names none is then torch's default
        self.caught = Interception(self.recorder, warmup=cfg.warmup, route_ddp=cfg.ddp_reducer, joining=joining,
                                   backend=None if cfg.backend == "mpi" else cfg.backend,
                                   on_default_group=self._adopt, on_destroy=self._dying).__enter__()
        self.interposer, self.tracker = self.caught.interposer, self.caught.tracker
        self.interposer.fault = self.tracker.fault = joining.fault
        self.tracker.progress = StepProgress("iteration", None, show=world.rank == 0)
        self.record_size = torch_record.turn_on(os.environ)
        """torch's flight record of every collective, on before the script makes its groups (torch_record.py)."""
        self.spans: deque[list] = deque(maxlen=max(1, self.record_size["buffer_size"]))
        """rank 0: [begin, end, unseen calls inside or None] of the last measured iterations, wall clock (torch's
        record's clock): no more than the ring's entries, the most iterations it can hold an op of each of."""
        self.record: dict | None = None
        """rank 0: its record tallied over the measured iterations once gathered (or why there is none)."""
        if world.rank == 0 and self.record_size["buffer_size"]:
            self._stamp_iterations()

    # ---- the script's process group: intercept/groups.py calls these ----------------------------
    def _adopt(self, pg, timeout_s: float) -> None:
        """The script's default group exists, however it was made: watch it, trace it. `timeout_s`: its
        timeout, the script's own where it gave one to init_process_group."""
        if self.initialised:
            return
        self.initialised = True
        if "nccl" in backend_of(pg) and not self.tracker.open and not self.recorder.ops:
            # NCCL's ops are queued on streams: they and the script's phases are timed by CUDA events
            self.recorder.clock = CudaClock()
            self.tracker.phases.use(self.recorder.clock)
        world = self.interposer.comm(None)
        world.timeout_s = timeout_s
        world.control = rendezvous.control_plane(world)
        rank = self.life.begin(world, backend=backend_of(pg))
        if self.cfg.live is not None:
            self.live = monitor.attach(self.cfg.live, self.tracker, rank=self.world.rank,
                                       world_size=self.world.world_size, control=world.control,
                                       progress=self.tracker.progress, contention=rank.contention,
                                       link=self.cfg.link, local_rank=self.world.local_rank,
                                       local_world_size=self.world.local_world_size, backend=backend_of(pg))
            rank.on_failure(lambda code, message: self.live.close(message))
        if self.world.rank == 0:
            self.kept = kept = Kept(self.cfg.out.json, self._incomplete, show=self._show_incomplete)
            rank.on_failure(kept.abandon)
            self.tracker.on_end = kept.update

    def _dying(self) -> None:
        """The script destroys its default group: every rank's figures are gathered over it first."""
        if self.gathered is None:
            self.gather()

    def _stamp_iterations(self) -> None:
        """The wall clock at each measured iteration's begin and end, and the unseen calls made inside it: the
        tracker's begin and end, wrapped on this one instance (two stamps an iteration; a begin already open
        returns at once, as the tracker's own does)."""
        t, unseen, spans = self.tracker, self.interposer.unseen, self.spans
        begin, end = t.begin, t.end

        def stamped_begin() -> None:
            if not t.open and t.index >= t.warmup:
                spans.append([time.time_ns(), None, dict(unseen) if unseen else None])
            begin()

        def stamped_end() -> None:
            measured = t.open and t.index >= t.warmup
            end()
            if measured and spans and spans[-1][1] is None:
                last = spans[-1]
                last[1] = time.time_ns()
                if unseen:
                    before = last[2] or {}
                    last[2] = {k: n - before.get(k, 0) for k, n in unseen.items() if n != before.get(k, 0)} or None
                if t.keep is not None and len(spans) > t.keep:  # --live keeps the last iterations only
                    spans.popleft()

        t.begin, t.end = stamped_begin, stamped_end

    def _read_record(self) -> dict:
        """Rank 0's record, read once the measured iterations are over (a dump pickles the whole ring), tallied
        over them (torch_record.tally); or why there is none."""
        info = dict(self.record_size)
        if not info["buffer_size"]:
            return {**info, "why": f"off: {info['set_by']}=0"}
        if not self.tracker.volumes:
            return {**info, "why": "no measured iteration"}
        spans = [s for s in self.spans if s[1] is not None][-len(self.tracker.volumes):]  # the last, one to one
        try:
            dump = torch_record.read()
        except (ImportError, RuntimeError, ValueError) as exc:
            return {**info, "why": f"torch's record could not be read: {exc}"}
        tallied = torch_record.tally(dump, [(b, e) for b, e, _ in spans], self.interposer.group_names())
        return {**info, "tallied": tallied, "unseen_steps": [u or {} for _, _, u in spans]}

    # ---- the run ----------------------------------------------------------------------------
    def run(self) -> int:
        script = self.cfg.script
        sys.argv = [script, *self.cfg.script_args]
        # the import path `python script.py` gives: the script's directory first, and the directory the rank
        # started in (`python -m commprof` puts it first) behind PYTHONPATH and the installed packages — kept
        # last, not dropped, for commprof's own imports from a source checkout
        if sys.path and sys.path[0] in ("", os.getcwd()):
            sys.path.append(sys.path.pop(0))
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        interrupt = ending.Interrupt()
        try:
            with self.tracker.progress:
                runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = ending.exit_code(exc.code)
        except CommprofError as exc:
            if interrupt.seen:  # a Ctrl-C Python dropped (raised in a __del__ or a callback), then the peers
                return self._interrupted(exc)  # it reached too went, failing this rank's next collective
            self._fail(exc)
            raise
        except KeyboardInterrupt as exc:
            return self._interrupted(exc)
        except Exception as exc:
            if interrupt.seen:  # Ctrl-C, come out of torch's C++ as its own error
                return self._interrupted(exc)
            failed = ending.comm_failure(exc, self.recorder)
            if failed is not None:  # a collective failed under the script (DDP's hook re-raises it as its own)
                self._fail(failed)
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

    def _interrupted(self, exc: BaseException) -> int:
        """Ctrl-C: what was measured kept and shown, as bench and run keep it; exit 130."""
        ending.Interrupt.saving()
        self.life.__exit__(KeyboardInterrupt, KeyboardInterrupt(), None)
        return 130

    def _exited(self, code: int) -> int:
        """The script's own exit status; a non-zero one is the job's (claimed before a peer, left waiting in a
        collective, calls it a lost peer), as `python train.py` or torchrun would end with it."""
        if code == 0:
            return code
        message = f"rank {self.world.rank}: {self.cfg.script} exited with status {code}"
        self._fail(ScriptError(message, code))
        if job.claim(code, message, self.world.rank):
            sys.stderr.write(f"commprof: error: {message}\n")
            sys.stderr.flush()
        return code

    def _raised(self, exc: Exception) -> int:
        """The script's own failure: its traceback once in the job (the first rank to fail), exit 1."""
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        message = f"rank {self.world.rank}: {self.cfg.script} raised {type(exc).__name__}: {first}"
        said = f"rank {self.world.rank}: " + ending.script_traceback(exc, self.cfg.script)
        self._fail(ScriptError(message), say=said)
        if job.claim(1, message, self.world.rank):
            sys.stderr.write(said)
            sys.stderr.flush()
        return 1

    def _fail(self, err: CommprofError, say: str | None = None) -> None:
        """End the job for `err` through the watchdog, once the script's group exists (never returns then):
        the peers learn of it at once, and the flight records tell a desync from the rest."""
        if self.life.watchdog is not None and self.gathered is None:
            self.life.watchdog.fail(err, say=say)

    def _incomplete(self, reason: str) -> dict:
        """Rank 0's report so far, marked incomplete: a failure may end the job before every rank's figures are
        gathered."""
        from commprof.profile.results import partial

        t = self.tracker
        mine = self._result(list(t.iterations), list(t.volumes))
        have = slots(self.cfg.backend)
        backend = backend_of(c10d._get_default_group()) if c10d.is_initialized() else self.cfg.backend
        env = merge_env([local_env(self._device())], backend=backend, world_size=self.world.world_size,
                        local_world_size=self.world.local_world_size, slots=have,
                        oversubscribed=self.world.local_world_size > have, launcher=self.world.launcher,
                        clock=self.recorder.clock.kind, argv=["commprof", *self.cfg.out.argv])
        return partial(self.cfg, mine, env, reason=reason)

    def _show_incomplete(self, doc: dict, reason: str) -> None:
        if doc.get("summary") is not None:
            print_profile(doc)
            sys.stdout.write(f"incomplete: rank 0's {len(doc['iterations'])} measured iteration(s) only: "
                             f"{reason}\n")

    def gather(self) -> None:
        """Every rank's figures to rank 0 over the script's default group, while it still exists."""
        self.tracker.finish()
        if self.world.rank == 0:
            self.record = self._read_record()
        if self.kept is not None:  # no snapshot after this: the report replaces the file
            self.kept.close()
        if self.live is not None:
            self.live.close()
        results = self.life.gather(self._result(self.tracker.iterations, self.tracker.volumes))
        self.gathered = (results, self.life.rank.env)
        self.life.unwatch()

    def _device(self) -> torch.device:
        """The GPU the script's NCCL ops ran on (its current device), else the CPU."""
        if self.recorder.clock.kind == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _result(self, iterations: list, volumes: list) -> dict:
        t = self.tracker
        return {"rank": self.world.rank, "iterations": iterations, "volume_steps": volumes, "found": t.index,
                "measured": max(0, t.index - t.warmup),
                "outside": step_volume(t.outside), "unseen": dict(self.interposer.unseen),
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

    def report(self, results: list[dict], env: dict) -> None:
        from commprof.profile.results import combine

        if self.life.rank.contention is not None:
            env["contention"] = self.life.rank.contention.read()
        doc = combine(self.cfg, results, env, trace_dir=self.life.folder.path if self.life.folder else None,
                      record=self.record)
        from commprof.findings.kinds import of_trace
        from commprof.findings.untraced import with_figures

        if not doc["steps"]["measured"]:  # the trace's iterations are all warm-up: nothing to find in them
            from commprof.findings.kinds import THRESHOLD

            block = {"threshold": THRESHOLD, "items": None, "why": "no measured iteration: every iteration was "
                     f"warm-up (--warmup {self.cfg.warmup})"}
        else:
            block = (of_trace(self.life.folder.path, link=self.cfg.link) if self.life.folder is not None
                     else monitor.findings_block(self.live))
        doc["findings"] = with_figures(block, doc)
        print_profile(doc)
        said = note(env.get("contention"))
        if said:
            sys.stdout.write(said + "\n")
        if self.cfg.out.json:
            files.write_result(self.cfg.out.json, {"complete": True, **doc})

    def close(self) -> None:
        """Hooks off. A process group the script left behind stays: the process ends without finalizing."""
        if self.live is not None:
            self.live.close("the script ended before its process group was gathered")
        self.caught.__exit__(None, None, None)
        self.life.close()
