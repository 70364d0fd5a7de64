"""How a script's run ended, read the way the job reports it: the status sys.exit's argument makes, the
traceback `python train.py` would show, the Comm failure behind an exception the script let through, and whether
Ctrl-C came.
Exercised by: `pytest tests/test_profile_failures.py`.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback

from commprof.base.errors import CommprofError


def exit_code(code) -> int:
    """sys.exit's argument as the process would turn it into a status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


def script_traceback(exc: BaseException, script: str) -> str:
    """The exception as `python script` shows it: from the script's first frame down, commprof's and
    runpy's frames above it left out; a syntax error in the script with no frames at all."""
    tb = exc.__traceback__
    path = os.path.abspath(script)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != path:
        tb = tb.tb_next
    if tb is None and isinstance(exc, SyntaxError):
        return "".join(traceback.format_exception_only(type(exc), exc))
    return "".join(traceback.format_exception(type(exc), exc, tb if tb is not None else exc.__traceback__))


def comm_failure(exc: BaseException, recorder) -> CommprofError | None:
    """The Comm failure behind a script's exception: in its chain, or — re-raised by C++ (DDP's reducer
    runs the comm hook's future there), the chain lost — one of the script's groups that failed."""
    seen = exc
    while seen is not None:
        if isinstance(seen, CommprofError):
            return seen
        seen = seen.__cause__ or seen.__context__
    failed = next((c for c in recorder.comms if c.failed is not None), None)
    return failed.failure(failed.failed, exc) if failed is not None else None


class Interrupt:
    """Whether Ctrl-C reached the script. The KeyboardInterrupt it raises may come out of torch's C++ as
    torch's own error (autograd's engine re-raises it as "RuntimeError: Cannot extract tensors from value:
    KeyboardInterrupt"): the rank then knows it was interrupted, not failed, and keeps what it measured."""

    def __init__(self) -> None:
        self.seen = False
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where Ctrl-C is ignored
            signal.signal(signal.SIGINT, self._on)

    def _on(self, signum, frame) -> None:
        self.seen = True
        signal.default_int_handler(signum, frame)

    @staticmethod
    def saving() -> None:
        """A second Ctrl-C must not cut the saving short."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
