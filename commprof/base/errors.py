"""Errors that end a run with one clear line on stderr and a non-zero exit code.

Anything raised as a `CommprofError` is printed as `commprof: error: <message>` by the CLI; no traceback.
Exit codes, the same under commprof's own launcher and under mpiexec (see commprof/base/job.py):
  1 wrong results or a backend failure    2 bad input or an unsupported request
  3 a peer rank stalled, died or was killed    4 ranks called different ops (desync)    130 interrupted
"""


class CommprofError(Exception):
    """A failure the user can act on; `exit_code` is what the process exits with."""

    exit_code = 1


class UsageError(CommprofError):
    """Bad command-line input (unknown collective, dtype, size range, …)."""

    exit_code = 2


class UnsupportedError(CommprofError):
    """The backend lacks the requested op, dtype or mode."""

    exit_code = 2


class PeerError(CommprofError):
    """A peer rank stalled, died or vanished: this rank cannot go on."""

    exit_code = 3


class PeerTimeoutError(PeerError):
    """A rank did not answer within --timeout."""


class DesyncError(CommprofError):
    """Ranks called different collectives (name, size, dtype or group) at the same sequence number."""

    exit_code = 4


class ScriptError(CommprofError):
    """A profiled script's own failure: an exception it raised (exit 1) or a non-zero sys.exit (its status)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
