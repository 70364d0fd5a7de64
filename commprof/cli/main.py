"""The `commprof` command: registers subcommands and turns every failure into one line on stderr.

    commprof bench --help
    commprof run --help

Exit codes: 0 success, 1 wrong results or a backend failure, 2 bad input or an unsupported request,
3 a peer rank that stalled, died or was killed, 4 ranks that called different collectives (desync),
130 interrupted. COMMPROF_DEBUG=1 shows tracebacks.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import NoReturn

from commprof.base import job
from commprof.base.errors import CommprofError, PeerError, UnsupportedError, UsageError
from commprof.cli import sweep
from commprof.cli.commands import parse


def main(argv: list[str] | None = None) -> int:
    # Before torch loads (c10 reads it once): c10d warns with a C++ stack when a rank's control-plane
    # client finds rank 0's store gone — after a failure the job reports in one line of its own, under
    # commprof's launcher, mpiexec or torchrun alike.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    argv = sys.argv[1:] if argv is None else argv
    if not isinstance(sys.stdout, _ReaderGone):
        sys.stdout = _ReaderGone(sys.stdout)
    if not isinstance(sys.stderr, _ReaderGone):  # `commprof … 2>&1 | head`: the same reader
        sys.stderr = _ReaderGone(sys.stderr)
    chosen = next((a for a in argv if not a.startswith("-")), "")  # the subcommand, if argv names one
    try:
        if chosen in sweep.GRID_FLAGS and sweep.wanted(chosen, argv[argv.index(chosen) + 1:]):
            return call(sweep.main, (chosen, argv[argv.index(chosen) + 1:]))
        args = parse(argv, chosen)
    except UsageError as exc:
        return usage_error(exc)
    return call(args.func, args)


class _ReaderGone:
    """stdout (or stderr) that outlives its reader: after `commprof … | head` has read what it wanted, the rest
    goes to /dev/null and the job goes on — rank 0 leaving on a broken pipe would fail its peers mid-collective
    and lose the job's results."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def _gone(self) -> None:
        os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def usage_error(exc: UsageError) -> int:
    """A command line refused before anything ran: one line, exit 2."""
    sys.stderr.write(f"commprof: error: {_one_line(str(exc))}\n")
    return 2


def entry() -> NoReturn:
    """The `commprof` command (console script and `python -m commprof`): main(), then the process ends —
    through comm.end_process when it joined a job as a rank, its Comm closed and its files written."""
    code = _closed_streams()
    if code is None:
        code = main()
    comm = sys.modules.get("commprof.comm")
    if comm is not None and comm.joined():
        comm.end_process(code)
    if comm is not None and code == 0:
        comm.run_at_end()
    job.note_exit(code)
    sys.exit(code)


def _closed_streams() -> int | None:
    """A command started with stdin, stdout or stderr closed (`>&-`): the next file opened would take its
    number, and a rank's tables would be written into it. stdin and stderr are given /dev/null; a closed stdout,
    where the tables go, is one line and exit 2 before anything runs."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: fd itself
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            os.set_inheritable(fd, True)  # os.open's are not: the ranks would start with it closed again
    if 2 in closed:
        sys.stderr = open(2, "w", closefd=False)
    if 1 in closed:
        sys.stderr.write("commprof: error: standard output is closed: give it a file, or /dev/null to discard "
                         "the tables (commprof … >/dev/null)\n")
        return 2
    return None


def call(func, args: argparse.Namespace) -> int:
    """`func(args)`'s exit code, with every failure turned into one line on stderr and its exit code."""
    rank = os.environ.get("RANK") or os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")
    who = f"rank {rank}: " if rank is not None else ""
    try:
        code = func(args)
    except (UsageError, UnsupportedError) as exc:
        _say(f"{exc}", rank)  # the same on every rank: rank 0 says it
        code = exc.exit_code
    except CommprofError as exc:
        if isinstance(exc, PeerError):
            job.defer_to_launcher()
        _fail(exc.exit_code, f"{exc}", rank, kill_after=getattr(exc, "kill_after", None))  # names its rank
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # `commprof … | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush stays quiet
        code = 0
    except Exception as exc:  # a backend failure (peer gone, timeout inside gloo, …)
        if os.environ.get("COMMPROF_DEBUG"):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        _fail(1, f"{who}{type(exc).__name__}: {first[:300]}", rank)
    return code


def _int(rank: str | None) -> int | None:
    return int(rank) if rank is not None and rank.isascii() and rank.isdigit() else None


def _fail(code: int, message: str, rank: str | None, kill_after: int | None = None) -> None:
    """A rank's own failure: said if it is the job's first, then exit at once. `kill_after`: a stopped
    peer's pid, the cause, killed only after the line is out."""
    if job.claim(code, message, _int(rank)):
        _say(message, None)
    if kill_after is not None:
        try:
            os.kill(kill_after, signal.SIGKILL)
        except OSError:  # gone already
            pass
    _exit_now(code)


def _say(message: str, rank: str | None) -> None:
    if rank in (None, "0"):
        sys.stderr.write(f"commprof: error: {_one_line(message)}\n")
        sys.stderr.flush()


# What str.splitlines() breaks a line at, escaped: argparse puts arguments unquoted into its messages
# ("unrecognized arguments: …", "ambiguous option: …"), and a message must stay on its one line.
_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


def _one_line(message: str) -> str:
    return message.translate(_BREAKS)


def _exit_now(code: int) -> None:
    """Exit without running a broken process group's destructors (gloo aborts in them after a failure)."""
    job.note_exit(code)
    if code:
        job.release_shared_memory()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
