"""`--nproc N`: start N local ranks of the same commprof command, so one command needs neither torchrun
nor mpiexec — and end the job with one line and one exit code, whatever happens to its ranks.

gloo/nccl: N child processes with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, …) and a
rendezvous on 127.0.0.1 at a free port; with COMMPROF_RANK_START=fork, gloo's are forked from one process
that imported torch once (commprof/launcher/rank_template.py). mpi: mpiexec -n N (the mpich wheel's, next to
this Python, or the system's); Hydra, which listens on every interface, in a network namespace of loopback alone
(commprof/launcher/netns.py). Every rank shares a job folder (commprof/base/job.py). The job's exit code is the failure
recorded there by whoever saw it first — never what mpiexec makes of its ranks' ends; a rank killed by
a signal is named ("rank 1 was killed by SIGKILL") and the job exits 3. Once a failure is known the other
ranks get GRACE_S to finish theirs, then every rank still alive is stopped, mpiexec's or not; a rank that
is stopped (SIGSTOP, Ctrl-Z of its own) cannot finish anything and is killed at once. The launcher is also
the job's last backstop: a rank stopped for --timeout is the job's failure (exit 3, the rank named) whatever
its peers are blocked in — rank 0 too, whose store the peers' control plane needs. A failed job's
--json is marked incomplete with the reason and its --trace merged from the per-rank files.
COMMPROF_RANK_WRAPPER (a command line, `{rank}` replaced by the rank) is put in front of every rank's
command — how `commprof nsys` gives each rank its own Nsight report.

Each rank starts in a session of its own, as torchrun starts them: with the kernel's autogroup scheduling (on
by default), the ranks of one session share one group's CPU, and on 2 cores PyTorch's FSDP2 example stepped
1.5 % slower in 7 of 8 interleaved pairs so. The terminal then interrupts the launcher alone: it passes Ctrl-C
on to the ranks (SIGINT, so rank 0 saves what it measured), SIGTERM and SIGHUP end them, and a rank the
launcher leaves behind by dying (SIGKILL) is killed with it (PR_SET_PDEATHSIG). Exercised by:
`pytest tests/test_failures.py tests/test_signals.py tests/test_sessions.py`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from commprof.base import job
from commprof.base.backends import YIELD_ENV, free_port, release_port
from commprof.base.deadline import die_with_parent
from commprof.base.errors import CommprofError, PeerError, UsageError
from commprof.base.world import usable_cores
from commprof.launcher import rank_template

GRACE_S = 3.0
"""How long the other ranks may take to report their own error after one rank failed."""
CHECK_S = 0.25
"""How often the launcher reads the job folder (a failure a rank recorded) and /proc (a stopped rank)."""

class _Terminated(Exception):
    """SIGTERM or SIGHUP reached the launcher: pass SIGTERM on to the ranks (so they can close their traces)."""


def _on_term(signum, frame):
    raise _Terminated(signum)


def take_signals() -> None:
    """The launcher's handlers: SIGTERM and SIGHUP end the job, Ctrl-C interrupts it."""
    signal.signal(signal.SIGTERM, _on_term)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # nohup's stays: the job outlives its terminal
        signal.signal(signal.SIGHUP, _on_term)  # the terminal closed: the ranks, in sessions of their own, are not told
    # Ctrl-C (SIGINT) ends the job even where the shell started commprof with SIGINT ignored (`cmd &` in
    # a script does): the launcher owns the job's signals, as torchrun's agent does.
    signal.signal(signal.SIGINT, signal.default_int_handler)


def launch(argv: list[str], *, nproc: int, backend: str, oversubscribed: bool, timeout_s: float,
           json_path: str | None = None, trace_dir: str | None = None, huge_pages: bool = False,
           served: bool = False) -> int:
    """Run `commprof <argv>` as `nproc` local ranks; returns the job's exit code. `timeout_s`: how long a
    rank may stay stopped. `huge_pages` (--huge-pages) puts torch's large CPU buffers on huge pages; without
    it the ranks' allocator is the environment's, as the user's own job would have it. `served`: a rank
    serves an endpoint the host must reach (--live's): an MPI job then stays in the host's network."""
    take_signals()
    env = dict(os.environ)
    # One rank per core gets one intra-op thread per core it owns, as torchrun does by default.
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() // nproc)))
    # Asked for only: it changes what is measured both ways (a 16 MiB MPI op on a torch buffer 2.8-3.2 ms
    # with it against 4.5-5 ms of TLB misses without; ResNet-18 steps 3.5 % slower with it), and a user's
    # training job has it only where its launcher sets it.
    if huge_pages:
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    if sys.stderr.isatty():  # the ranks take seconds to import torch and meet: say what is coming
        sys.stderr.write(f"commprof {argv[0]}: starting {nproc} rank(s) on {backend}…\n")
        sys.stderr.flush()
    folder = job.make()
    env[job.ENV] = str(folder)
    command = [sys.executable, "-m", "commprof", *argv]
    wrapper = os.environ.get("COMMPROF_RANK_WRAPPER", "")
    for r in range(nproc if backend == "mpi" and wrapper.strip() else 0):
        program = shlex.split(wrapper.replace("{rank}", str(r)))[0]
        if shutil.which(program) is None:  # said as under gloo: mpiexec says it twice in its words, exit 255
            shutil.rmtree(folder, ignore_errors=True)
            raise CommprofError(f"cannot start rank {r} ({program}): No such file or directory")
    code, template = 1, None
    try:
        if backend == "mpi":  # mpiexec knows the rank, the wrapper reads it from the environment
            code = _mpiexec(shlex.split(wrapper.replace("{rank}", "%q{PMI_RANK}")) + command, nproc, env,
                            oversubscribed, folder, timeout_s, own_network=not served)
        else:
            port = free_port()
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nproc),
                       LOCAL_WORLD_SIZE=str(nproc), COMMPROF_LAUNCHER="commprof")
            try:
                if rank_template.forks(command, backend, wrapper):
                    children, template = rank_template.start(command, env, nproc, rank_template.preload(argv),
                                                             timeout_s=timeout_s)
                else:
                    children = _start(wrapper, command, env, nproc)
            except PeerError as exc:  # the template stopped or killed before it forked the ranks
                code = _claim(str(exc), folder)
            except KeyboardInterrupt:  # while the template imports torch: it is gone, and no rank was forked
                code = 130
            except _Terminated as exc:
                code = 128 + exc.args[0]
            else:
                code = _supervise(children, folder, ranks=list(range(nproc)), timeout_s=timeout_s,
                                  template=template)
            release_port(port)
    finally:
        if template is not None:
            _end_template(template)
        _stop_pids(folder)
        if code:
            _stop_descendants(folder)
        try:
            if code:
                _salvage(folder, code, json_path, trace_dir)
        finally:  # the job folder goes whatever the salvage met
            _remove_shared_memory(folder)
            shutil.rmtree(folder, ignore_errors=True)
    return code


def _end_template(template: subprocess.Popen) -> int:
    """Reap the ranks' template, which exits once it has reaped them; killed (and they with it) if it has not
    within GRACE_S: the job ends whatever held it. Its exit status."""
    try:
        return template.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        template.kill()
        return template.wait()


def _remove_shared_memory(folder: Path) -> None:
    """The shared-memory files the job's ranks mapped (MPICH's segments: a clean MPI_Finalize removes its
    own, a failed or interrupted job leaves them), removed once every rank is gone."""
    for path in job.shared_memory(folder):
        try:
            os.unlink(path)
        except OSError:  # removed by its own rank's MPI_Finalize, or not ours to remove
            pass


def _start(wrapper: str, command: list[str], env: dict, nproc: int) -> list[subprocess.Popen]:
    """Start the `nproc` ranks; when one cannot start (a wrapper that is not there), end those already started
    before saying which could not: a failed launch leaves no rank behind."""
    children: list[subprocess.Popen] = []
    for r in range(nproc):
        argv = shlex.split(wrapper.replace("{rank}", str(r))) + command
        try:
            children.append(subprocess.Popen(argv, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                             start_new_session=True, preexec_fn=die_with_parent))
        except OSError as exc:
            for child in children:
                child.kill()
            for child in children:
                child.wait()
            raise CommprofError(f"cannot start rank {r} ({argv[0]}): {exc.strerror or exc}") from None
    return children


def find_mpiexec() -> str:
    """mpiexec next to this Python (the mpich wheel's), else on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if not found:
        raise UsageError("backend mpi needs mpiexec and none was found: install an MPI, "
                         "or pip install 'commprof[mpich]'")
    return found


def _mpiexec(command: list[str], nproc: int, env: dict, oversubscribed: bool, folder: Path,
             timeout_s: float, own_network: bool = True) -> int:
    mpiexec = find_mpiexec()
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    flags = []
    if oversubscribed:
        env.update({k: env.get(k, v) for k, v in YIELD_ENV.items()})
        if "Open MPI" in version or "OpenRTE" in version:
            flags.append("--oversubscribe")
    private = []
    if "HYDRA" in version:  # its control port listens on every interface: the job gets a network of its own
        # unless a rank serves what the host must reach (--live's endpoint): a network of its own would hold
        # that too (docs/live.md)
        private = [sys.executable, "-m", "commprof.launcher.netns"] if own_network else []
        flags += ["-iface", "lo"]
    proc = subprocess.Popen([*private, mpiexec, "-n", str(nproc), *flags, *command], env=env,
                            stdout=subprocess.PIPE)
    banners: list[tuple[int, int]] = []
    relay = threading.Thread(target=_relay, args=(proc.stdout, banners), daemon=True)
    relay.start()
    code = _supervise([proc], folder, ranks=None, timeout_s=timeout_s)
    relay.join(timeout=5)
    # Ctrl-C, SIGTERM, SIGHUP to the launcher: Hydra's kills of the ranks are ours, not the job's failure
    if code and code not in (130, 128 + signal.SIGTERM, 128 + signal.SIGHUP) and job.failure(folder) is None \
            and banners:
        # no rank said anything: the first process mpiexec saw end badly was killed or crashed
        pid, status = banners[0]
        rank = {p: r for r, p in job.pids(folder).items()}.get(pid)
        who = f"rank {rank}" if rank is not None else f"a rank (pid {pid})"
        return _death(who, -status if 0 < status < 64 else status, folder)
    return code


def _relay(stream, banners: list) -> None:
    """Copy mpiexec's stdout through, leaving out Hydra's "BAD TERMINATION" banner and noting its pid and
    exit status: the launcher says what happened in one line of its own."""
    out = sys.stdout.buffer
    held: list[bytes] = []  # blank and "====" lines: the start of a banner, or not
    in_banner, pid = False, None
    for raw in iter(stream.readline, b""):
        text = raw.decode(errors="replace").rstrip("\n")
        if in_banner:
            found = re.match(r"=\s+PID (\d+) RUNNING", text)
            pid = int(found.group(1)) if found else pid
            status = re.match(r"=\s+EXIT CODE: (\d+)", text)
            if status and pid is not None:
                banners.append((pid, int(status.group(1))))
            in_banner = not text.startswith("Please see the FAQ page")
            continue
        if "BAD TERMINATION" in text:
            in_banner, held, pid = True, [], None
            continue
        if not text.strip() or re.fullmatch(r"=+", text):
            held.append(raw)
            continue
        _write(out, b"".join(held) + raw)
        held = []
    _write(out, b"".join(held))
    stream.close()


def _write(out, data: bytes) -> None:
    try:
        out.write(data)
        out.flush()
    except (BrokenPipeError, ValueError):  # `commprof … | head` has read all it wanted: keep draining
        pass


def _supervise(children: list, folder: Path, *, ranks: list[int] | None, timeout_s: float,
               template: subprocess.Popen | None = None) -> int:
    """Wait for every child; once a failure is known, stop the rest after GRACE_S (a stopped rank at once).
    `children`: subprocess.Popen, or rank_template.Forked; `ranks`: the rank of each child, or None for one
    mpiexec that holds them all; `template`: the forked ranks' template, which reports their ends."""
    failed_at = None
    stopped = _StoppedRanks(folder, timeout_s)
    looked = -CHECK_S
    try:
        while any(p.poll() is None for p in children):
            if failed_at is None:
                for i, p in enumerate(children):
                    rc = p.poll()
                    if rc not in (None, 0):
                        failed_at = time.monotonic()
                        job.note_segments_of_ranks(folder)
                        if ranks is not None and rc < 0:
                            _death(*_culprit(template, p, f"rank {ranks[i]}", rc), folder)
                        elif ranks is not None and not job.exited(folder, ranks[i]):
                            # ended outside commprof (os._exit in the script): its code, not its peers'
                            # "a peer exited" (their claim comes after the wait for its record)
                            _claim(f"rank {ranks[i]} exited with status {rc} (outside commprof: os._exit, or a "
                                   "library that ended the process)", folder, rc)
                # the job folder and /proc, read every CHECK_S: read on every 50 ms tick they took 0.7 % of a
                # core, 3.5x torchrun's agent, from ranks that fill the cores
                if time.monotonic() - looked >= CHECK_S:
                    looked = time.monotonic()
                    rank = stopped.overdue()
                    if rank is not None:
                        _claim(f"rank {rank} was stopped (SIGSTOP) and did not resume within {timeout_s:g} s "
                               f"(--timeout)", folder)
                    if job.failure(folder) is not None:
                        failed_at = time.monotonic()
                        job.note_segments_of_ranks(folder)  # before mpiexec ends them
            elif time.monotonic() - failed_at > GRACE_S:
                _stop(children)
                _stop_pids(folder)
            else:
                stopped.kill()  # it cannot report anything: do not wait GRACE_S for it
            time.sleep(0.05)
    except KeyboardInterrupt:
        if ranks is not None:  # the ranks are in sessions of their own: the terminal interrupted the launcher alone
            for p in children:
                if p.poll() is None:
                    p.send_signal(signal.SIGINT)
        _interrupted(children)
        return 130
    except _Terminated as exc:
        _stop(children)
        return 128 + exc.args[0]
    recorded = job.failure(folder)
    if recorded is not None:
        return recorded["code"]
    for i, p in enumerate(children):
        rc = p.returncode
        if rc < 0:
            return _death(*_culprit(template, p, f"rank {ranks[i]}" if ranks is not None else "mpiexec", rc), folder)
        if rc > 128 and rc - 128 in signal.valid_signals() and ranks is not None:
            # a shell or nsys passing its rank's signal on
            return _death(f"rank {ranks[i]}", -(rc - 128), folder)
        if rc:
            return rc
    return 0


def _interrupted(children: list[subprocess.Popen]) -> None:
    """Ctrl-C: the ranks are interrupted too (by the launcher, or by the terminal under mpiexec), and rank 0
    saves and prints what it measured before it exits; they get up to GRACE_S for that before they are stopped
    (at once on a second Ctrl-C)."""
    deadline = time.monotonic() + GRACE_S
    try:
        while any(p.poll() is None for p in children) and time.monotonic() < deadline:
            time.sleep(0.05)
    except KeyboardInterrupt:
        pass
    _stop(children)


def _culprit(template: subprocess.Popen | None, child, who: str, rc: int) -> tuple[str, int]:
    """Whose end a rank's death by a signal is: the ranks' template's when it had ended, the rank killed with
    it (PR_SET_PDEATHSIG); the rank's own while the template lives on."""
    if template is not None and child.template_ended:
        code = _end_template(template)  # ending already: its files are closed
        if code:
            return rank_template.NAME, code
    return who, rc


def _death(who: str, rc: int, folder: Path) -> int:
    """A process ended by a signal (rc < 0) or without a word: claim it as the job's failure, exit 3."""
    desync = _desync(folder) if rc not in _OUTSIDE else None
    if desync:
        return _claim(desync, folder, 4)
    if rc < 0:
        message = f"{who} was killed by {signal.Signals(-rc).name}"
    else:
        message = f"{who} ended without saying why (exit status {rc})"
    return _claim(message, folder)


_OUTSIDE = (-signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP)
"""Deaths that come from outside (a kill, the OOM killer, a Ctrl-C), never a backend's own abort."""


def _desync(folder: Path) -> str | None:
    """The desync in the ranks' ring files, if any: a backend that meets one may abort a rank (gloo on a size
    mismatch: SIGABRT; MPICH on a truncated message), which is then only the symptom."""
    if len(list(folder.glob("rank*.ring"))) < 2:
        return None
    from commprof.comm.failure import flight, ring_file  # torch comes with them: only on this path, never at launch

    return flight.first_divergence(ring_file.read(folder))


def _claim(message: str, folder: Path, code: int = 3) -> int:
    """The launcher's own verdict (exit 3, or the code a rank ended with), said if it is the job's first
    failure."""
    if job.claim(code, message, None, folder):
        sys.stderr.write(f"commprof: error: {message}\n")
        sys.stderr.flush()
    return code


class _StoppedRanks:
    """The job's ranks in the stopped state (SIGSTOP, SIGTSTP: 'T' in /proc/PID/stat; a debugger's stop,
    't', is left alone), and since when. A stopped rank holds its peers in their ops, and when it is
    rank 0 it holds the store their control plane speaks over: only the launcher can see it and end the job."""

    def __init__(self, folder: Path, timeout_s: float) -> None:
        self._folder, self._timeout_s = folder, timeout_s
        self._since: dict[int, float] = {}
        self._pids: dict[int, int] = {}

    def _poll(self) -> dict[int, float]:
        now = time.monotonic()
        self._pids = job.pids(self._folder)
        for rank, pid in self._pids.items():
            if job.process_state(pid) == "T":
                self._since.setdefault(rank, now)
            else:
                self._since.pop(rank, None)
        return self._since

    def overdue(self) -> int | None:
        """The rank stopped first, if it has been stopped for longer than the timeout."""
        late = [(since, rank) for rank, since in self._poll().items()
                if time.monotonic() - since > self._timeout_s]
        return min(late)[1] if late else None

    def kill(self) -> None:
        for rank in self._poll():
            _kill_rank(self._folder, self._pids[rank])


def _stop(children: list[subprocess.Popen]) -> None:
    for p in children:
        if p.poll() is None:
            # SIGTERM waits in a stopped process's queue until it resumes: kill that one outright
            p.kill() if job.process_state(p.pid) == "T" else p.terminate()
    deadline = time.monotonic() + 2.0
    for p in children:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _stop_pids(folder: Path) -> None:
    """Kill every rank of this job that is still there (a stopped one outlives mpiexec's SIGTERM); a pid
    counts as this job's only while its environment names the job folder, so a reused pid is left alone."""
    for pid in job.pids(folder).values():
        _kill_rank(folder, pid)


def _stop_descendants(folder: Path) -> None:
    """A failed job: SIGKILL every process left whose environment names the job folder — what a rank's script
    forked (a data loader's workers, a server of its own), in the rank's session or not, which would outlive
    the job until it noticed its parent gone (17 s and more)."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            _kill_rank(folder, int(entry))


def _kill_rank(folder: Path, pid: int) -> None:
    """SIGKILL `pid` if it is still a rank of this job (its environment names the job folder)."""
    try:
        if f"{job.ENV}={folder}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _salvage(folder: Path, code: int, json_path: str | None, trace_dir: str | None) -> None:
    """A failed job's files: the JSON (as far as it got) marked incomplete, the trace merged."""
    reason = (job.failure(folder) or {}).get("message") or ("interrupted" if code == 130 else f"exit {code}")
    from commprof.base.files import OutputError, mark_incomplete

    # best effort, and quiet: the job has said its line (a full disk that failed it refuses these writes too)
    if json_path:
        try:
            mark_incomplete(json_path, reason)
        except (OSError, OutputError):
            pass
    if trace_dir and any(Path(trace_dir).glob("rank*.trace.json")):
        from commprof.record import trace

        try:
            trace.merge(trace_dir)
        except (OSError, ValueError, OutputError):
            pass
