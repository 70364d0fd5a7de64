"""With COMMPROF_RANK_START=fork, the launcher's gloo ranks are forked from one template process that imported
torch once, rather than started as N interpreters that each import it: `import torch` is 1.5 s of CPU a rank,
and torch._dynamo (which run's first optimizer and profile's interception import) 1.2 s more, most of a short
job's CPU where ranks outnumber cores, while a fork costs milliseconds. Each rank is then what
`python -m commprof ARGV` would be: its own session, RANK and LOCAL_RANK in its environment, killed with the
process that started it, its exit status the launcher's to read.

The template, `python -m commprof.launcher.rank_template FD NPROC MODULES -- ARGS…`, imports MODULES, forks NPROC
ranks of `python ARGS`, writes "start RANK PID" for each and "end PID CODE" as each ends to file descriptor
FD, and exits once every rank has. Nothing it imports touches CUDA or starts a thread of Python's before the
fork (torch's own DataLoader workers fork from such a process), and the generators of Python's `random`, of
torch on CPU and of NumPy are seeded afresh in each rank, as in a new interpreter; str hashes stay the
template's (PYTHONHASHSEED), the same on every rank. Not for nccl, which has not been run this way on a GPU,
nor for mpi (mpiexec starts the ranks), nor under COMMPROF_RANK_WRAPPER (a command in front of each rank).
Not the default: forked ranks stepped 1-3 % slower in Python-heavy training than ranks of their own
(benchmarks/rank_start.py), and commprof measures the job the user runs; the test suite, whose jobs are
short, starts its ranks so (tests/spawn.py).
Exercised by: `pytest tests/test_rank_template.py tests/test_sessions.py tests/test_failures.py`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PRELOADED = {"run": ("torch", "torch._dynamo"), "profile": ("torch", "torch._dynamo")}
"""What a rank of each command imports anyway, imported once in the template; other commands: torch alone."""

START_ENV = "COMMPROF_RANK_START"
"""`fork`: fork gloo's ranks from a template; otherwise (`exec`, the default) each is an interpreter of its own."""
NAME = "the ranks' template process"
"""What the launcher's lines call it."""
CHECK_S = 0.25
"""How often start() looks whether the template is stopped while it imports, and a rank's poll in /proc
whether it ended unreaped."""


def preload(argv: list[str]) -> tuple[str, ...]:
    """The modules the template imports for ranks of `commprof ARGV`."""
    command = next((a for a in argv if not a.startswith("-")), "")  # as commprof.cli.main finds it
    return PRELOADED.get(command, ("torch",))


def forks(command: list[str], backend: str, wrapper: str) -> bool:
    """Whether the ranks of `command` (sys.executable -m commprof ARGV) are forked from a template."""
    return (backend == "gloo" and not wrapper and os.environ.get(START_ENV, "exec") == "fork"
            and command[:3] == [sys.executable, "-m", "commprof"])


class Forked:
    """A forked rank, as the launcher's supervision sees a subprocess.Popen: pid, poll, wait, signals."""

    def __init__(self, pid: int, reports: _Reports) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._reports = reports
        self._looked = 0.0

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._reports.code(self.pid)
        # a template stopped (SIGSTOP) reaps nothing: the rank's end is in /proc, read every CHECK_S (the
        # launcher polls every 50 ms, and /proc on every poll of every rank costs the ranks' cores)
        if self.returncode is None and time.monotonic() - self._looked >= CHECK_S:
            self._looked = time.monotonic()
            self.returncode = _zombie_code(self.pid)
        if self.returncode is None and self._reports.gone:  # the template died untold: killed with it
            self.returncode = -signal.SIGKILL
        return self.returncode

    @property
    def template_ended(self) -> bool:
        """The template has ended (closed its end of the reports): a rank killed since was killed with it, as
        the kernel closes a dying process's files before it signals its children (PR_SET_PDEATHSIG)."""
        self._reports.read()
        return self._reports.gone

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # one the template reaped is not signalled: its pid may be another's now
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _zombie_code(pid: int) -> int | None:
    """The exit code of `pid` if it has ended and is not yet reaped (/proc/PID/stat: state Z, field 52)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return os.waitstatus_to_exitcode(int(fields[49])) if fields[0] == "Z" else None


class _Reports:
    """The template's lines: each rank's pid once forked, its exit code once it ended."""

    def __init__(self, template: subprocess.Popen, fd: int) -> None:
        self.template = template
        self.started: dict[int, int] = {}
        """rank -> pid"""
        self.gone = False
        """The template has closed its end: it said all it will."""
        self.error: str | None = None
        """Why the template could not start the ranks (a module it could not import)."""
        self._fd = fd
        self._pending = b""
        self._ended: dict[int, int] = {}
        os.set_blocking(fd, False)

    def fileno(self) -> int:
        return self._fd

    def read(self) -> None:
        """Take what has come, without waiting."""
        while not self.gone:
            try:
                chunk = os.read(self._fd, 4096)
            except BlockingIOError:
                return
            if not chunk:
                self.gone = True
                os.close(self._fd)
            *done, self._pending = (self._pending + chunk).split(b"\n")
            for line in done:
                word, _, rest = line.decode().partition(" ")
                if word == "start":
                    rank, pid = rest.split()
                    self.started[int(rank)] = int(pid)
                elif word == "end":
                    pid, code = rest.split()
                    self._ended[int(pid)] = int(code)
                else:
                    self.error = rest

    def code(self, pid: int) -> int | None:
        """`pid`'s exit code, once the template has told it."""
        self.read()
        return self._ended.get(pid)


def start(command: list[str], env: dict, nproc: int, modules: tuple[str, ...], *,
          timeout_s: float = 30.0) -> tuple[list[Forked], subprocess.Popen]:
    """Start the template, which imports `modules`, and its `nproc` ranks of `command` (sys.executable and what
    follows it: `-m MODULE ARGS…` or `SCRIPT ARGS…`): the ranks, once every one is forked, and the template
    (to wait for once they have ended). A template stopped (SIGSTOP) for `timeout_s` before it forked them,
    or killed, is a PeerError (the launcher's exit 3); one that could not import a module, a CommprofError."""
    from commprof.base.deadline import die_with_parent
    from commprof.base.errors import CommprofError, PeerError

    read, write = os.pipe()
    try:
        template = subprocess.Popen([sys.executable, "-m", "commprof.launcher.rank_template", str(write), str(nproc),
                                     ",".join(modules) or "-", "--", *command[1:]], env=env, pass_fds=(write,),
                                    start_new_session=True, preexec_fn=die_with_parent)
    except OSError as exc:
        os.close(read)
        raise CommprofError(f"cannot start the ranks' template ({sys.executable}): {exc.strerror or exc}") from None
    finally:
        os.close(write)
    reports = _Reports(template, read)
    try:
        stopped = _wait_for_forks(reports, nproc, timeout_s)
    except BaseException:  # Ctrl-C while torch imports: the template goes, and any rank it forked with it
        template.kill()
        template.wait()
        raise
    if len(reports.started) < nproc:
        template.kill()
        code = template.wait()
        if stopped:
            raise PeerError(f"{NAME} was stopped (SIGSTOP) and did not resume within {timeout_s:g} s (--timeout)")
        if code < 0 and reports.error is None:
            raise PeerError(f"{NAME} was killed by {signal.Signals(-code).name} before it started the ranks")
        raise CommprofError(reports.error or f"{NAME} ended (exit status {code}) before it started the ranks")
    return [Forked(reports.started[r], reports) for r in range(nproc)], template


def _wait_for_forks(reports: _Reports, nproc: int, timeout_s: float) -> bool:
    """Wait until the template has forked `nproc` ranks or ended; True if it stayed stopped for `timeout_s`
    (a stopped process never ends, and the job with it)."""
    import select

    from commprof.base.job import process_state

    since = None
    while len(reports.started) < nproc and not reports.gone:
        if select.select([reports.fileno()], [], [], CHECK_S)[0]:
            reports.read()
        if process_state(reports.template.pid) != "T":
            since = None
        elif since is None:
            since = time.monotonic()
        elif time.monotonic() - since > timeout_s:
            return True
    return False


# ---- the template ---------------------------------------------------------------------------------------------
def _become_rank(rank: int, template: int) -> None:
    """In a forked child: a rank of its own session, killed with the template, with its own seeds."""
    from commprof.base.deadline import die_with_parent

    os.setsid()
    die_with_parent()
    if os.getppid() != template:  # the template ended before the line above: so must this rank
        os._exit(128 + signal.SIGKILL)
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
    # `random` reseeds itself in a child; torch's CPU generator and NumPy's global one, seeded at import, do not
    # (CUDA's are made in the rank: the template touches no CUDA)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()
    numpy = sys.modules.get("numpy.random")
    if numpy is not None:
        numpy.seed()


def _template(fd: int, nproc: int, modules: list[str]) -> int:
    """Import `modules`, fork the ranks; in a rank, its number; the template exits once every rank has ended."""
    import gc
    import importlib
    import warnings

    # No collection while importing, and none in a rank of what was imported: a collection writes to every
    # object it visits, and each page written is copied into the rank that wrote it (Python's gc.freeze advice)
    gc.disable()
    out = os.fdopen(fd, "w", buffering=1)
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # said once, by the launcher: the ranks would each have said it
            _say(out, f"error cannot start the ranks: importing {name} failed: {exc!r}")
            sys.exit(1)
    # Python 3.12 warns of fork() in a process with threads: OpenBLAS's pool (NumPy's), which forks safely
    warnings.filterwarnings("ignore", message=".*multi-threaded.*fork", category=DeprecationWarning)
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()
    alive: dict[int, int] = {}
    me = os.getpid()
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:
            out.close()
            gc.enable()
            _become_rank(rank, me)
            return rank
        alive[pid] = rank
        _say(out, f"start {rank} {pid}")
    while alive:
        pid, status = os.wait()
        if alive.pop(pid, None) is not None:
            _say(out, f"end {pid} {os.waitstatus_to_exitcode(status)}")
    os._exit(0)  # without tearing down what it imported: a third of a second of the job's end


def _say(out, line: str) -> None:
    try:
        out.write(line + "\n")
    except OSError:  # the launcher is gone: so are the ranks soon (PR_SET_PDEATHSIG); reap them meanwhile
        pass


def _run(args: list[str]) -> None:
    """Run `python ARGS` in this process: `-m MODULE …` or `SCRIPT …`, as the interpreter would."""
    import runpy

    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]  # run_module puts the module's path first
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    fd_, nproc_, modules_, _, *args_ = sys.argv[1:]
    _template(int(fd_), int(nproc_), [] if modules_ == "-" else modules_.split(","))
    _run(args_)  # in a rank
