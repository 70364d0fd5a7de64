"""Aligned iterations: the warm-up iterations after the first, where before each collective its group's
ranks meet (on the control plane's store, then at a control barrier: outside the op log), so every op's
transfer is what it takes once its parties are there together. The first is left alone: DDP rebuilds its
buckets after it, lazy set-ups run in it, so its ops are not the measured ones.

Why: a rank late at every step leaves no instance of its ops whose parties met together, and the transfer
after its late arrival is short of what the op takes aligned (its peers' bytes were already on their way).
findings/whatif.py prices the ops a straggler made late at their median transfer here, so "step without
it" is no longer a lower bound. The meeting waits for the straggler; the barrier then releases ranks that
are all awake, within microseconds (the store's wake-ups differ by a millisecond here, and a rank that slept
in a barrier carries its wake-up into the op's transfer).

Safe where ranks disagree: the meeting is keyed by the op's group and sequence number on the store, never
on the group itself, and every rank that came reads the same outcome (comm/failure/control.py's Meeting), so the barrier
runs on all parties or on none. A rank aligning alone (a script whose ranks count iterations differently, an
op one rank hands to torch) waits at most MEET_S once, then aligns nothing more in that iteration: it can
slow the iteration, never pair a barrier with a peer's collective. The hook sits in the fault hook's slot
(comm/base.py's `_call`), which the hot path tests already: no cost outside these iterations. Point-to-point
messages, and ops on a GPU (a host-side meeting does not align a stream), are left alone. In a trace each
aligned iteration is named "iteration N (aligned)".

    commprof run --nproc 2 --trace t/                            (--warmup 2: iteration 1 is aligned)
    commprof profile --nproc 2 --warmup 4 --trace t/ -- train.py   (iterations 1-3; --warmup 1: none)

Exercised by: `pytest tests/test_findings.py -k aligned`.
"""

from __future__ import annotations

from commprof.base.measurement import P2P

MEET_S = 5.0
"""How long a rank waits at a meeting for its group (at most half the --timeout): a straggler later than that
leaves the op unaligned, and a rank aligning alone loses no more than that in an iteration."""


class _Aligner:
    """A fault hook that runs the one it replaced (an injected fault), then meets the op's group."""

    __slots__ = ("fault", "meeting", "missed")

    def __init__(self, fault, meeting, missed: list) -> None:
        self.fault = fault
        self.meeting = meeting
        self.missed = missed
        """[True] once a meeting of this iteration failed: every Comm aligns nothing more in it."""

    def __call__(self, comm, name: str, nbytes: int, dtype) -> None:
        if self.fault is not None:
            self.fault(comm, name, nbytes, dtype)
        if name in P2P or name == "barrier" or self.missed[0]:
            return
        # the group by its members (a label such as "dp" names several groups), the op by the seq `_call` gives it
        key = f"{comm.label}/{hash(tuple(comm.members)):x}/{comm.seq + 1}"
        within = MEET_S if not comm.timeout_s else min(MEET_S, comm.timeout_s / 2)
        # the watchdog's timer covers a store that stopped answering (busy: control_barrier)
        if comm._blocking("control_barrier", lambda: self.meeting.meet(key, comm.world_size, within_s=within)):
            comm.control_barrier()  # every party is here and awake: released together
        else:
            self.missed[0] = True


def start(recorder) -> None:
    """Align every collective of the Comms that log into `recorder`, and of those made until `stop`; nothing
    when the job has no control plane (one process, a store of another kind)."""
    meeting = next((c.control.meeting() for c in recorder.comms if c.control is not None), None)
    if meeting is None:
        return
    recorder.aligning = (meeting, [False])
    for comm in recorder.comms:
        join(comm)


def join(comm) -> None:
    """`comm` aligns too if it was made during an aligned iteration."""
    state = comm.recorder.aligning
    if state is not None and comm.device.type == "cpu" and not isinstance(comm.fault, _Aligner):
        comm.fault = _Aligner(comm.fault, *state)


def stop(recorder) -> None:
    """Back to the hooks they had."""
    recorder.aligning = None
    for comm in recorder.comms:
        if isinstance(comm.fault, _Aligner):
            comm.fault = comm.fault.fault
