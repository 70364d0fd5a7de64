"""A deadline that holds while the interpreter does not: for the start-up calls that keep the GIL until
every peer has come — MPI_Init (mpi4py's import), and the rendezvous — where no watchdog thread can run.

    with deadline.guard("MPI_Init", timeout_s=cfg.timeout_s, rank=world.rank):
        from mpi4py import MPI

A guard is a small child process started before the call: if the call has not returned when the deadline
passes, the child records the job's failure (the job folder, when commprof's launcher made one), says it in
one line on stderr, and ends this rank with exit 3 — a peer failure's code — under every launcher, a bare
mpiexec too (whose other ranks it then ends). It ends this rank by SIGQUIT, whose handler here is libc's
_exit: a C handler runs inside any C call, the GIL held or not, and _exit(SIGQUIT) is exit status 3. The
guard leaves quietly when the call returns (or this rank dies: its pipe closes). Exercised by:
`pytest tests/test_failures.py -k start_up`.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
from contextlib import contextmanager

from commprof.base import job, pipes
from commprof.base.errors import PeerError

SLACK_S = 2.0
"""Added to --timeout: where a call has a timeout of its own (a rendezvous), its clearer error comes first."""
CAUSE_FIRST_S = 1.0
"""How long a waiting rank's guard lets a stopped peer's guard speak and end the job first."""


@contextmanager
def guard(what: str, *, timeout_s: float, rank: int):
    """End this rank with exit 3 and one line if the block has not finished `timeout_s` + SLACK_S on."""
    limit = timeout_s + SLACK_S
    message = (f"rank {rank}: {what} did not complete within {limit:g} s (--timeout + {SLACK_S:g} s): a peer "
               "rank stalled or died during start-up")
    previous = _exit_on_sigquit()
    child = subprocess.Popen(
        [sys.executable, "-c", "from commprof.base.deadline import _child; _child()", str(os.getpid()), str(limit),
         str(rank), message], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, close_fds=True,
        preexec_fn=die_with_parent)
    try:
        yield
    finally:
        child.stdin.close()  # the guard's cue to leave
        child.wait()
        _restore_sigquit(previous)


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.signal.restype = ctypes.c_void_p
_LIBC.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child before it runs (Popen's preexec_fn): SIGKILL when its parent dies. A rank in a session of its
    own (launch.py) and its guard are out of reach of a signal to the launcher's process group: neither
    outlives the process that started it."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _exit_on_sigquit() -> tuple:
    """Make SIGQUIT end this process at once with status SIGQUIT (3); returns what to restore: () when
    nothing was changed, else (the handler it replaces,) — None there is SIG_DFL."""
    if int(signal.SIGQUIT) != PeerError.exit_code:  # not Linux's numbering: a plain kill will do
        return ()
    return (_LIBC.signal(signal.SIGQUIT, ctypes.cast(_LIBC._exit, ctypes.c_void_p).value),)


def _restore_sigquit(previous: tuple) -> None:
    if previous:
        _LIBC.signal(signal.SIGQUIT, previous[0])


def _child() -> None:
    """The guard process: wait for the parent's cue (its pipe closing) or the deadline. The rank that is
    itself stopped is the cause: its guard names it and kills it at once; a waiting rank's guard gives that
    a moment to happen (the launcher then ends this rank too, and the job says one line, not one per rank)."""
    parent, limit, rank, message = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    ready, _, _ = select.select([sys.stdin], [], [], limit)
    if ready or os.getppid() != parent:
        return
    if job.process_state(parent) == "T":
        _say(f"rank {rank} was stopped (SIGSTOP) during start-up and did not resume within {limit:g} s "
             "(--timeout + 2 s)", rank)
        _unlink_segments(parent)
        os.kill(parent, signal.SIGKILL)
        return
    ready, _, _ = select.select([sys.stdin], [], [], CAUSE_FIRST_S)
    if ready:
        return
    stopped = job.stopped_sibling(parent)
    if stopped is not None:  # a peer on this host stopped before its own guard began: it is the cause
        pid, who = stopped
        message = (f"rank {who} was stopped (SIGSTOP) during start-up and did not resume within {limit:g} s "
                   "(--timeout + 2 s)")
    _say(message, rank)
    _unlink_segments(parent)
    if stopped is not None:  # a launcher's SIGTERM never reaches it (torchrun's SIGKILL comes 30 s later)
        os.kill(stopped[0], signal.SIGKILL)
    os.kill(parent, signal.SIGQUIT if int(signal.SIGQUIT) == PeerError.exit_code else signal.SIGKILL)
    ready, _, _ = select.select([sys.stdin], [], [], 1.0)  # its pipe closes as it dies
    if not ready:
        try:
            os.kill(parent, signal.SIGKILL)  # it had not the handler yet
        except OSError:
            pass


def _unlink_segments(pid: int) -> None:
    """The MPICH segments the rank and its siblings (its launcher's other children: the job's ranks on this
    host) map, unlinked before the job is ended: inside MPI_Init none has unlinked them yet (comm/__init__.py),
    and under a bare mpiexec, which kills every rank once one ends, nobody else would."""
    found = job.mpich_segments(pid)
    ppid = job.parent_of(pid)
    for entry in os.listdir("/proc") if ppid is not None else ():
        if entry.isdigit() and int(entry) != pid and job.parent_of(int(entry)) == ppid:
            found |= job.mpich_segments(entry)
    for path in found:
        try:
            os.unlink(path)
        except OSError:
            pass


def _say(message: str, rank: int) -> None:
    if job.claim(PeerError.exit_code, message, rank):
        sys.stderr.write(f"commprof: error: {message}\n")
        sys.stderr.flush()
        pipes.drain()  # read before the kill that follows ends the job
