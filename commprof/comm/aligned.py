"""Aligned iterations: the warm-up iterations after the first, where before each collective its group's
ranks meet (two control barriers, outside the op log), so every op's transfer is what it takes once its
parties are there together. The first is left alone: DDP rebuilds its buckets after it, lazy set-ups run in
it, so its ops are not the measured ones.

Why: a rank late at every step leaves no instance of its ops whose parties met together, and the transfer
after its late arrival is short of what the op takes aligned (its peers' bytes were already on their way).
findings/whatif.py prices the ops a straggler made late at their median transfer here, so "step without
it" is no longer a lower bound. The barriers sit in the fault hook's slot (base.py's `_call`), which the hot
path tests already: no cost outside these iterations. Point-to-point messages are left alone. In a trace
each is named "iteration N (aligned)".

    commprof run --nproc 2 --trace t/                            (--warmup 2: iteration 1 is aligned)
    commprof profile --nproc 2 --warmup 4 --trace t/ -- train.py   (iterations 1-3; --warmup 1: none)

Exercised by: `pytest tests/test_findings.py -k aligned`.
"""

from __future__ import annotations

from commprof.measurement import P2P


class _Aligner:
    """A fault hook that runs the one it replaced (an injected fault), then meets the group's ranks."""

    __slots__ = ("fault",)

    def __init__(self, fault) -> None:
        self.fault = fault

    def __call__(self, comm, name: str, nbytes: int, dtype) -> None:
        if self.fault is not None:
            self.fault(comm, name, nbytes, dtype)
        if name not in P2P and name != "barrier":
            comm.control_barrier()
            comm.control_barrier()  # the ranks that waited in the first are awake now, as in a balanced step


def start(recorder) -> None:
    """Align every collective of the Comms that log into `recorder` (a group made meanwhile inherits it)."""
    for comm in recorder.comms:
        if not isinstance(comm.fault, _Aligner):
            comm.fault = _Aligner(comm.fault)


def stop(recorder) -> None:
    """Back to the hooks they had."""
    for comm in recorder.comms:
        if isinstance(comm.fault, _Aligner):
            comm.fault = comm.fault.fault
