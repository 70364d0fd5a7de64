"""Watchdog: how a rank's failure becomes the job's one line and one exit code.

A daemon thread, the timer, samples every Comm's busy state (two attribute stores per op on the hot path);
a second one, the listener, polls the control plane for a peer's claim (less often in a large job:
LISTEN_RATE). The timer never touches the network, so no peer — not even rank 0 stopped with the store —
can hold its deadline back; every control-plane call is bounded as well (comm/failure/control.py). An op busy for
longer than --timeout, or a CommprofError leaving the `with Watchdog(...)` block, is a failure:

  1. the rank claims it on the control plane (comm/failure/control.py); if a peer claimed first, this rank only
     answers: it posts its flight record and exits, quietly, with the peer's verdict;
  2. the claimant collects every rank's flight record (comm/failure/flight.py) for a moment: if the ranks called
     different collectives at the same seq, the failure is a desync (exit 4) named at its first divergence,
     otherwise it stays what it was (a stalled or dead peer: exit 3; a backend error: 1), and the ranks
     that did not answer are named;
  3. the verdict is posted for the others; each rank writes its flight record to the dump folder, runs
     the salvage hooks (the results so far, marked incomplete), notes its exit in the job folder, and the
     first to claim the job's failure there says it.

MPI has no timeouts of its own and a stalled peer would hang every other rank forever; gloo and NCCL
time out themselves, and this is the backstop for all three. Exercised by: `pytest tests/test_failures.py`.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

from commprof.base import job, pipes
from commprof.base.errors import CommprofError, PeerError, PeerTimeoutError
from commprof.base.files import OutputError
from commprof.comm.failure import flight, ring_file

ANSWER_S = 2.0
"""How long the claimant waits for its peers' flight records (a stopped peer never sends one)."""
ACK_S = 5.0
"""How long the claimant waits, at most, for the ranks that answered to save their results and read the verdict."""
GO_S = 1.5
"""How long an answering rank waits, at most, for the claimant's go once it acked (under the control plane's
2 s bound on a store call)."""
LISTEN_RATE = 4000.0
"""How many times a second the job's listeners together check the store for a claim, at most: each rank checks
every `poll_s` (0.2 s) up to 800 ranks, then less often (4.1 s at 16,384 ranks), so the store's load stays a
few per cent of what one TCPStore serves, not 5 calls a second a rank (82,000/s at 16,384 ranks)."""


def listen_s(world_size: int, poll_s: float) -> float:
    """How often one rank checks the store for a peer's claim in a job of `world_size` ranks."""
    return max(poll_s, world_size / LISTEN_RATE)


class Watchdog:
    """Watches a Comm's ops; turns a stall or an error inside the block into the job's verdict."""

    def __init__(self, comm, *, timeout_s: float, rank: int, dump_dir: str | None = None,
                 poll_s: float = 0.2) -> None:
        self._comm = comm
        self._timeout_s = timeout_s
        self._rank = rank
        self._dump_dir = dump_dir
        self._poll_s = min(poll_s, timeout_s / 4)
        self._world = comm.control.world_size if comm.control is not None else 1
        self._listen_s = listen_s(self._world, self._poll_s)
        self._answer_s = min(ANSWER_S, timeout_s) + self._listen_s - self._poll_s
        """How long the claimant waits for its peers' records: ANSWER_S, and the longer a large job's ranks
        take to hear the claim."""
        self._salvage: list = []
        self._writing = False
        """The failure is a file that could not be written: another refused write in the salvage is not said."""
        self._stop = threading.Event()
        self._failing = threading.Lock()
        self._threads = [threading.Thread(target=self._time, name="commprof-watchdog", daemon=True),
                         threading.Thread(target=self._listen, name="commprof-listener", daemon=True)]

    def on_failure(self, fn) -> None:
        """Call `fn(code, message)` before the process exits on a failure (write what was measured)."""
        self._salvage.append(fn)

    def __enter__(self) -> "Watchdog":
        if self._world > 1 and job.folder() is not None:  # what a rank killed by a signal last called
            ring_file.keep(self._comm.recorder, job.folder(), self._rank)
        if self._comm.control is not None:
            try:
                self._comm.control.post_process()
            except Exception:  # a peer then cannot end this rank if it stops: its launcher will
                pass
        for thread in self._threads:
            thread.start()
        return self

    def _join(self) -> None:
        for thread in self._threads:
            thread.join()

    def __exit__(self, kind, exc, tb) -> bool:
        self._stop.set()
        if exc is None:
            self._join()
            if self._comm.control is not None:  # a clean end: let rank 0's store go only once unwatched
                try:
                    self._comm.control.close(within_s=self._timeout_s)
                except Exception:
                    pass
            return False
        if isinstance(exc, CommprofError):
            self.fail(exc)  # does not return
        # Ctrl-C, or a bug: save what was measured and let the exception go on, the threads ended first
        self._join()
        self._run_salvage(130 if isinstance(exc, KeyboardInterrupt) else 1,
                          "interrupted" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}")
        return False

    # ---- the watching threads ---------------------------------------------------------------------
    def _time(self) -> None:
        seen: dict[int, tuple] = {}
        while not self._stop.wait(self._poll_s):
            now = time.monotonic()
            for comm in list(self._comm.recorder.comms):
                busy, seq = comm.busy, comm.busy_seq
                last = seen.get(id(comm))
                if busy is None or last is None or last[0] != seq:
                    seen[id(comm)] = (seq, now)
                elif now - last[1] > self._timeout_s:
                    self.fail(PeerTimeoutError(
                        f"rank {self._rank}: {busy} did not complete within {self._timeout_s:g} s "
                        "(--timeout): a peer rank stalled or died"))

    def _listen(self) -> None:
        # the ranks' checks spread evenly over the interval, not all at once
        first = self._listen_s * self._rank / self._world if self._listen_s > self._poll_s else 0.0
        if self._stop.wait(first):
            return
        while not self._stop.wait(self._listen_s):
            control = self._comm.control
            if control is None:
                return
            try:
                claim = control.claimed()
            except Exception:  # rank 0, the store's host, is stopped or gone: the timer will tell
                return
            if claim is not None and claim["rank"] != self._rank and not self._stop.is_set():
                self._answer(claim)

    # ---- failing --------------------------------------------------------------------------------
    def fail(self, err: CommprofError, say: str | None = None) -> None:
        """End the job for `err`, from any thread; never returns. `say`: what this rank shows instead of the
        one line when it speaks for the job and the verdict stays `err`'s (a script's own traceback)."""
        self._failing.acquire()  # a second failure (the other thread) waits here for the exit
        self._writing = isinstance(err, OutputError)
        self._stop.set()
        self._end_with(err.exit_code, self._conclude, err, say)

    def _conclude(self, err: CommprofError, say: str | None) -> int:
        """fail's work up to the exit: claim, agree on the verdict, save and say it; the exit code."""
        code, message = err.exit_code, str(err)
        control, answered, states = self._comm.control, [], {}
        if control is not None:
            try:
                if not control.claim(code, message):
                    self._answer(control.claimed(), locked=True)
                control.post_state(self._snapshot(message))
                states = control.states(within_s=self._answer_s)
                answered = [r for r in states if r != self._rank]
                code, message = _verdict(code, message, states, control.world_size, self._rank,
                                         self._dead_records(states, control.world_size))
            except Exception:  # the control plane is gone with rank 0: say what this rank saw
                world, control = control.world_size, None
                mine = {self._rank: self._snapshot(message)}
                desync = flight.first_divergence({**self._dead_records(mine, world), **mine})
                if desync:  # rank 0 aborted by its backend on meeting the desync
                    code, message = 4, desync
                else:
                    if self._rank != 0:
                        message += "; rank 0 did not answer on the control plane"
                    if isinstance(err, PeerError):
                        job.defer_to_launcher()
        if code != err.exit_code:
            say = None  # the verdict is another failure (a desync): it speaks, not the rank's own words
        # Said and saved before the verdict goes out: the answering ranks exit on it, and mpiexec may then
        # stop this one at once.
        self._leave(code, message, speak=True, say=say)
        if control is not None:
            _end_stopped(control, [r for r in range(control.world_size) if r not in states])
            try:
                control.post_verdict(code, message)
                # rank 0 serves the store, and a launcher ends every rank once one exits: let them read
                # the verdict and save what they measured first
                control.wait_acks(answered, within_s=ACK_S)
                control.go()
            except Exception:
                pass
        return code

    def _answer(self, claim: dict, locked: bool = False) -> None:
        """A peer claimed the failure: post this rank's record, take the verdict, exit with it."""
        if not locked:
            self._failing.acquire()
        self._stop.set()
        self._end_with(claim["code"], self._take_verdict, claim)

    def _end_with(self, code: int, work, *args) -> None:
        """Exit with what `work(*args)` returns — or with `code` if it raised: whatever went wrong on the way
        out, the rank ends (one left running would hold its peers), and says what went wrong."""
        try:
            code = work(*args)
        except BaseException as exc:
            try:
                sys.stderr.write(f"commprof: rank {self._rank}: while ending: {exc!r}\n")
            except Exception:
                pass
        self._exit(code)

    def _take_verdict(self, claim: dict) -> int:
        """_answer's work up to the exit: the verdict read, this rank's results saved, the claimant acked."""
        control = self._comm.control
        code, message = claim["code"], claim["message"]
        try:
            control.post_state(self._snapshot(f"answering rank {claim['rank']}"))
            verdict = control.verdict(within_s=self._answer_s + 2.0)
            if verdict is not None:
                code, message = verdict["code"], verdict["message"]
        except Exception:
            pass
        self._leave(code, message, speak=False)
        try:
            control.ack()
            control.wait_go(within_s=GO_S)
        except Exception:  # no go within GO_S, or the claimant's store went with it: exit now
            pass
        return code

    def _dead_records(self, states: dict, world_size: int) -> dict[int, dict]:
        """The ring files of the ranks on this host that did not answer (killed by a signal: a backend's
        abort), dumped beside the others'."""
        folder = job.folder()
        if folder is None or len(states) == world_size:
            return {}
        found = ring_file.read(folder, [r for r in range(world_size) if r not in states])
        for snap in found.values() if self._dump_dir else ():
            try:
                flight.dump(self._dump_dir, snap)
            except (OSError, OutputError):
                pass
        return found

    def _snapshot(self, reason: str) -> dict:
        return flight.snapshot(self._comm.recorder, rank=self._rank, reason=reason)

    def _run_salvage(self, code: int, message: str, *, speak: bool = True) -> None:
        for fn in self._salvage:
            try:
                fn(code, message)
            except BaseException as exc:  # best effort, a Ctrl-C in the middle too: never let it hide the failure
                # said by the rank that speaks for the job, and once: not when it is the failure itself (a file
                # that cannot be written), nor another write refused when a write was the failure (a full disk)
                same = (str(exc) and str(exc) in message) or (self._writing and isinstance(exc, OSError | OutputError))
                if speak and not same:
                    sys.stderr.write(f"commprof: rank {self._rank}: could not save the results: "
                                     f"{str(exc) or type(exc).__name__}\n")

    def _leave(self, code: int, message: str, *, speak: bool, say: str | None = None) -> None:
        """Flight record dumped, results saved; the claimant records the job's failure and says it (an
        answering rank does not: it exits first and would silence the claimant in the job folder)."""
        if self._dump_dir:
            try:
                flight.dump(self._dump_dir, self._snapshot(message))
            except (OSError, OutputError):  # a full disk: the results are saved next, and said
                pass
        self._run_salvage(code, message, speak=speak)
        job.tell_torchrun(message if speak else f"rank {self._rank} ended on a peer's failure: {message}",
                          first=speak)
        if speak and job.claim(code, message, self._rank):
            sys.stderr.write(say if say is not None else f"commprof: error: {message}\n")
            sys.stderr.flush()

    def _exit(self, code: int) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed pipe, a launcher gone: the exit still comes
                pass
        if job.folder() is None:  # no commprof launcher to end the others, nor to remove MPICH's segment
            job.release_shared_memory()
            _abort_mpi(code)
        job.note_exit(code)
        os._exit(code)


def _end_stopped(control, silent: list[int]) -> None:
    """SIGKILL the peers on this host that did not answer and are stopped (SIGSTOP: state `T`), now that the
    job's line is said. A launcher that ends the job's other ranks when one fails gives each a grace period
    after SIGTERM, which a stopped process never acts on (torchrun: 30 s): the job would end that much later.
    commprof's launcher and an MPI job's mpiexec (MPI_Abort: _abort_mpi) end a stopped rank themselves."""
    if not silent or job.folder() is not None or sys.modules.get("mpi4py.MPI") is not None:
        return
    try:
        found = control.processes(silent)
    except Exception:
        return
    here = socket.gethostname()
    for proc in found.values():
        if proc["host"] == here and job.process_state(proc["pid"]) in ("T", "t"):
            try:
                os.kill(proc["pid"], signal.SIGKILL)
            except OSError:
                pass


def _abort_mpi(code: int) -> None:
    """End the whole job through MPI_Abort when this rank is an MPI process: its launcher then ends every
    rank, a stopped one too. Exiting alone leaves that to the launcher noticing the exit, which MPICH's Hydra
    at times does not: twice in a few dozen full suite runs, a rank 0 stopped (SIGSTOP) under a bare mpiexec
    was left so after rank 1 exited, and the job never ended. Called from the watchdog's thread while the
    main thread sits in an MPI call: MPICH takes no lock at MPI_THREAD_FUNNELED, and the abort goes over the
    launcher's own socket. MPICH's own line about the abort is left out (stderr to /dev/null): the job's line
    is said."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return
    pipes.drain()  # the line this rank said, read before the abort tears the job down
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        mpi.COMM_WORLD.Abort(code)
    except Exception:  # os._exit follows
        pass


def _verdict(code: int, message: str, states: dict, world_size: int, me: int,
             dead: dict | None = None) -> tuple[int, str]:
    """The claimant's conclusion from the flight records it got (and `dead`: those read from the files of
    ranks that did not answer): a desync (exit 4) if the ranks called different collectives, else its own
    failure with the ranks that did not answer or sat in no op."""
    desync = flight.first_divergence({**(dead or {}), **states})
    if desync:
        return 4, desync
    silent = [r for r in range(world_size) if r not in states]
    idle = [r for r, snap in sorted(states.items()) if not snap["busy"] and r != me]
    if silent:  # one short phrase however many: ranks as runs, the rest counted (flight.name_ranks)
        message += f"; {flight.name_ranks(silent)} did not answer on the control plane"
    if idle:
        message += f"; {flight.name_ranks(idle)} was in no op"
    return code, message
