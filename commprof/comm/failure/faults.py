"""Fault injection at the Comm level, for exercising how a job fails: `COMMPROF_FAULT`, a comma list of

    KIND:rank=R[:op=NAME][:seq=N][:from_step=K][:at=start][:signal=SIG][:ms=D]

KIND   stall   the rank stops answering: sleeps, its threads alive (a slow or hung rank)
       stop    the rank sends itself SIGSTOP: nothing of it runs any more (a frozen process)
       die     the rank sends itself SIGKILL, or `signal` (a crashed or killed process)
       desync  the rank issues one extra broadcast (from rank 0, as many bytes) before the op: a rank that
               calls something its peers do not
       slow    the rank sleeps `ms` before every counted op from the seq-th on: a straggler its peers wait
               for (with op=NAME of one op a step, D ms a step)
       clock   the rank's clock (perf_counter, every stamp commprof takes) reads `ms` ahead of its peers'
               from the start: a node whose clock is not rank 0's, which the trace's alignment must undo
rank   which rank (default 0)
op     count only ops of this name (all_reduce, all_gather, …; default: every data-plane op)
seq    fire at the N-th such op this rank issues, 1-based (default 1)
from_step  count ops only from the K-th iteration on (0-based, as the JSON numbers them: a profiled
       script's iterations, run's steps; default 0): a rank that turns slow in the middle of a job
at     `start`: fire before the rank checks in with its peers (start-up), instead of at an op;
       `init`: after the check-in, just before MPI_Init or the rendezvous (where the start-up deadline holds)
ms     how long `slow` sleeps, how far `clock` is ahead (default 10, at most an hour)

Checked before any rank starts: an op commprof does not count, a signal that is not one, a number that is
not one, each is one line and exit 2; a fault on a rank the job does not have is said, and never fires.

    COMMPROF_FAULT=stall:rank=1:seq=5 commprof bench --nproc 2 --timeout 3
    COMMPROF_FAULT=die:rank=0:op=all_gather commprof run --backend mpi --nproc 2 --json out.json
    COMMPROF_FAULT=desync:rank=1:seq=3 commprof bench all_reduce --backend mpi --nproc 2
    COMMPROF_FAULT=slow:rank=1:op=all_reduce:ms=20 commprof run --nproc 2 --bucket-mb 100 --trace t/
    COMMPROF_FAULT=slow:rank=1:op=all_reduce:ms=30:from_step=40 commprof profile --nproc 2 --live -- train.py
    COMMPROF_FAULT=clock:rank=1:ms=500,slow:rank=1:op=all_reduce:ms=20 commprof run --nproc 2 --trace t/

The hot path pays one attribute test per op when no fault is set. Exercised by:
`pytest tests/unit/test_failure_diagnosis.py tests/test_failures.py`.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from commprof.base.errors import UsageError

ENV = "COMMPROF_FAULT"
KINDS = ("stall", "stop", "die", "desync", "slow", "clock")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send", "recv",
       "sendrecv", "barrier")
"""The data-plane ops a Comm counts (comm/base.py), by the names `op=` takes."""
MAX_MS = 3_600_000.0
"""The longest `ms`: an hour (a sleep of more overflows, and no test waits so long)."""


@dataclass(frozen=True)
class Fault:
    """One injected failure."""

    kind: str
    """stall, stop, die, desync, slow or clock."""
    rank: int = 0
    """The rank it happens on."""
    op: str | None = None
    """Count only ops of this name; None counts every data-plane op."""
    seq: int = 1
    """Fire at the seq-th counted op."""
    at: str = "op"
    """'op' (at an op), 'start' (before check-in) or 'init' (before MPI_Init or the rendezvous)."""
    signal: str = "KILL"
    """The signal `die` sends."""
    ms: float = 10.0
    """How long `slow` sleeps before each op; how far ahead `clock` reads."""
    from_step: int = 0
    """Count ops only from this iteration of a profiled script on (its tracker tells the injector)."""


def parse(spec: str) -> list[Fault]:
    """COMMPROF_FAULT's value -> faults; UsageError naming the bad part."""
    faults = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        kind, *fields = part.split(":")
        if kind not in KINDS:
            raise UsageError(f"{ENV}: unknown fault {kind!r} in {part!r}: choose from {', '.join(KINDS)}")
        values: dict = {}
        for field in fields:
            key, _, value = field.partition("=")
            if key in ("rank", "seq", "from_step"):
                if not (value.isascii() and value.isdigit()):
                    raise UsageError(f"{ENV}: {key}={value!r} in {part!r} is not a whole number")
                values[key] = int(value)
            elif key == "ms":
                try:
                    values[key] = float(value)
                except ValueError:
                    raise UsageError(f"{ENV}: ms={value!r} in {part!r} is not a number") from None
                if not 0 <= values[key] <= MAX_MS:
                    raise UsageError(f"{ENV}: ms={value!r} in {part!r} must be a time from 0 to {MAX_MS:.0f} ms")
            elif key in ("op", "at", "signal"):
                values[key] = value
            else:
                raise UsageError(f"{ENV}: unknown field {key!r} in {part!r}: rank, op, seq, from_step, at, signal, "
                                 "ms")
        fault = Fault(kind, **values)
        if fault.at not in ("op", "start", "init"):
            raise UsageError(f"{ENV}: at={fault.at!r} in {part!r}: 'start', 'init' or leave it out")
        if fault.seq < 1:
            raise UsageError(f"{ENV}: seq={fault.seq} in {part!r} must be at least 1")
        if not isinstance(getattr(signal, "SIG" + fault.signal, None), signal.Signals):
            raise UsageError(f"{ENV}: unknown signal {fault.signal!r} in {part!r}: a name such as KILL, TERM, SEGV")
        if fault.op is not None and fault.op not in OPS:
            raise UsageError(f"{ENV}: op={fault.op!r} in {part!r} is not an op commprof counts: {', '.join(OPS)}")
        faults.append(fault)
    return faults


def check(world_size: int) -> list[str]:
    """COMMPROF_FAULT checked for a job of `world_size` ranks before any starts: UsageError where it cannot be
    read; a line for each fault on a rank the job does not have (it never fires: said, not refused, as one
    variable serves a sweep's jobs of every size)."""
    return [f"{ENV}: rank={f.rank} in {f.kind!r}: the job has ranks 0-{world_size - 1}, so it never fires"
            for f in parse(os.environ.get(ENV, "")) if f.rank >= world_size]


class Injector:
    """This rank's faults; `Comm._call` calls it before every op."""

    def __init__(self, faults: list[Fault]) -> None:
        for fault in faults:
            if fault.kind == "clock":  # before the rank takes its first stamp
                _skew(fault.ms)
        self._faults = [f for f in faults if f.kind != "clock"]
        self._counts = [0] * len(self._faults)
        self._firing = False
        self.step = 0
        """The profiled script's iteration now (record/hooks.py sets it): `from_step` reads it."""

    @classmethod
    def for_rank(cls, rank: int) -> "Injector | None":
        faults = [f for f in parse(os.environ.get(ENV, "")) if f.rank == rank]
        return cls(faults) if faults else None

    def start(self, at: str = "start") -> None:
        """Fire the faults meant for this point of start-up: 'start' or 'init'."""
        for fault in self._faults:
            if fault.at == at:
                _fire(fault, None, 0, None)

    def __call__(self, comm, name: str, nbytes: int, dtype) -> None:
        if self._firing:  # the extra op of a desync is not counted
            return
        for i, fault in enumerate(self._faults):
            if fault.at != "op" or (fault.op is not None and fault.op != name) or self.step < fault.from_step:
                continue
            self._counts[i] += 1
            if self._counts[i] == fault.seq or (fault.kind == "slow" and self._counts[i] > fault.seq):
                self._firing = True
                try:
                    _fire(fault, comm, nbytes, dtype)
                finally:
                    self._firing = False


_SKEWED: list = []
"""The real clock functions, once a `clock` fault has shifted them (a second Injector adds nothing)."""


def _skew(ms: float) -> None:
    """This process's perf_counter clocks read `ms` ahead: durations stay as they are, stamps do not."""
    if _SKEWED:
        return
    from commprof.record.clock import CpuClock

    offset_ns = round(ms * 1e6)
    _SKEWED[:] = [time.perf_counter_ns, time.perf_counter]
    real_ns, real = _SKEWED
    time.perf_counter_ns = lambda: real_ns() + offset_ns
    time.perf_counter = lambda: real() + offset_ns / 1e9
    CpuClock.now = staticmethod(time.perf_counter_ns)


def _fire(fault: Fault, comm, nbytes: int, dtype) -> None:
    if fault.kind == "slow":
        time.sleep(fault.ms / 1e3)
        return
    if fault.kind == "stall":
        while True:
            time.sleep(3600)
    if fault.kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return  # continued by someone: go on
    if fault.kind == "die":
        os.kill(os.getpid(), getattr(signal, "SIG" + fault.signal))
        time.sleep(3600)  # a catchable signal's handler may let us get here
    if fault.kind == "desync" and comm is not None:
        import torch

        # A broadcast where the peers run `op`: gloo and MPICH both leave such a pair hanging (the
        # watchdog's case); a same-op size mismatch would make them abort the process instead.
        extra = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=comm.device)
        comm.broadcast(extra, src=0)
