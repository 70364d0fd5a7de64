"""Errors that end a run with one clear line on stderr and a non-zero exit code.

Anything raised as a `CommprofError` is printed as `commprof: error: <message>` by the CLI; no traceback.
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


class PeerTimeoutError(CommprofError):
    """A rank did not answer within --timeout."""

    exit_code = 3
