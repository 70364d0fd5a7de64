"""A failing rank's last words reach its launcher before the rank ends the job.

MPICH's Hydra reads a rank's stdout and stderr pipes and forwards their bytes to mpiexec over the socket that
also carries MPI_Abort and the ranks' exits: bytes it read before the abort or the exit arrive before it;
bytes still in the pipe when mpiexec tears the job down are lost (4 lines in 60 aborts, measured). So a rank
about to abort the job, or a start-up guard about to kill its rank, first waits until its pipes are read.
Exercised by: `pytest tests/test_stopped.py -k launcher_to_read`.
"""

from __future__ import annotations

import array
import fcntl
import os
import stat
import termios
import time

DRAIN_S = 1.0
"""How long a rank waits, at most, for its launcher to read what it wrote (a reader that is itself stopped,
a pager the user paused, must not hold the job's end)."""


def drain(*, within_s: float = DRAIN_S) -> None:
    """Until every byte this process's stdout and stderr pipes hold has been read, or `within_s`.
    FIONREAD on a pipe's write end counts the bytes not yet read; files and terminals have nobody to wait for."""
    fds = [fd for fd in (1, 2) if _is_pipe(fd)]
    deadline = time.monotonic() + within_s
    unread = array.array("i", [0])
    while fds and time.monotonic() < deadline:
        try:
            fcntl.ioctl(fds[0], termios.FIONREAD, unread)
        except OSError:
            unread[0] = 0
        if unread[0] == 0:
            fds.pop(0)
        else:
            time.sleep(0.001)


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False
