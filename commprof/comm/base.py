"""Comm: the one door to the network. Every byte that crosses ranks goes through a Comm method.

Each data-plane call is, here and only here: wrapped in an NVTX range (domain `commprof`, category
`comm` — `bubble` for a pipeline's send/recv —, message "<op> (<group>) <size> <dtype>", payload = the
bytes; record/annotate.py names everything), timed from issue to completion with the backend's clock,
and logged with its payload bytes in nccl-tests' size convention. Under an NVTX tool each op is also an
in-flight range from that start stamp to that end stamp — a start/end range in its group's domain
`commprof comm (<group>)`, ended by whichever thread sees the op complete — for Nsight's timeline.
Backends (torch.distributed, mpi4py) implement the `_op` methods; they never time or count anything
themselves.

Names follow torch.distributed; tensor flavours throughout: `all_gather(output, input)` fills one flat
output of world_size × input (torch's all_gather_into_tensor), `reduce_scatter(output, input)` likewise,
`all_to_all(output, input)` is all_to_all_single with equal splits. An op runs in place when its
output aliases its input as NCCL defines it (all_gather: input is output's chunk `rank`; reduce_scatter:
output is input's chunk `rank`; all_reduce/reduce: no `output`).

Exercised by: `pytest tests/test_comm.py`.
"""

from __future__ import annotations

import torch

from commprof.base.errors import CommprofError, PeerError, PeerTimeoutError
from commprof.base.measurement import P2P
from commprof.comm.dtypes import dtype_name
from commprof.comm.handle import Handle
from commprof.record.annotate import ANNOTATOR, DOMAIN, Range, op_category, op_message
from commprof.record.recorder import OpRecorder

__all__ = ["Comm", "Handle", "DOMAIN"]


class Comm:
    """Collectives and point-to-point over one process group, timed, counted and NVTX-wrapped."""

    backend = "none"

    def __init__(self, *, rank: int, world_size: int, device: torch.device, clock, recorder=None) -> None:
        self.rank = rank
        """Rank within this Comm's group."""
        self.world_size = world_size
        """Size of this Comm's group: the n of busbw factors."""
        self.device = device
        self.clock = clock
        self.recorder = recorder if recorder is not None else OpRecorder(clock)
        self.recorder.comms.append(self)
        self._now = clock.now
        self._append = self.recorder.ops.append
        self._ring = self.recorder.append_ring
        self._labels: dict = {}
        self.busy: str | None = None
        """Label of the op this rank is blocked in, for the watchdog; None when not blocked."""
        self.busy_seq = 0
        self.failed: str | None = None
        """The op the backend raised in, for the flight recorder (busy is reset on the way out)."""
        self.seq = 0
        """Collectives issued on this group so far: the k-th has seq k on every member (comm/failure/flight.py)."""
        self.members: list[int] = list(range(world_size))
        """Global ranks of this group, in group-rank order."""
        self.fault = None
        """Fault injector (comm/failure/faults.py) called before every op; None when no fault is set."""
        self.control = None
        """The job's control plane (comm/failure/control.py), on the world Comm of a multi-rank job."""
        self.timeout_s: float | None = None
        """The --timeout the backend was initialised with, for error messages."""
        self.label = "world"
        """Name of this Comm's group in the op log ("world", or e.g. "dp" / "pp" for a subgroup)."""

    # ---- data plane -------------------------------------------------------------------------
    def all_reduce(self, tensor, *, op: str = "sum", output=None, async_op: bool = False):
        """Reduce `tensor` across ranks; in place unless `output` is given (where the backend can)."""
        return self._call("all_reduce", tensor.nbytes, tensor.dtype, async_op,
                          self._all_reduce, tensor, op, output, async_op)

    def all_gather(self, output, input, *, async_op: bool = False):
        """Gather every rank's `input` into `output` (world_size × input, rank order)."""
        return self._call("all_gather", output.nbytes, input.dtype, async_op,
                          self._all_gather, output, input, async_op)

    def reduce_scatter(self, output, input, *, op: str = "sum", async_op: bool = False):
        """Reduce `input` (world_size chunks) across ranks; chunk `rank` of the result lands in `output`."""
        return self._call("reduce_scatter", input.nbytes, input.dtype, async_op,
                          self._reduce_scatter, output, input, op, async_op)

    def broadcast(self, tensor, *, src: int, async_op: bool = False):
        """Copy `tensor` of rank `src` to every rank."""
        return self._call("broadcast", tensor.nbytes, tensor.dtype, async_op,
                          self._broadcast, tensor, src, async_op)

    def reduce(self, tensor, *, dst: int, op: str = "sum", output=None, async_op: bool = False):
        """Reduce `tensor` onto rank `dst`; in place unless `output` is given (where the backend can)."""
        return self._call("reduce", tensor.nbytes, tensor.dtype, async_op,
                          self._reduce, tensor, dst, op, output, async_op)

    def all_to_all(self, output, input, *, async_op: bool = False):
        """Chunk j of every rank's `input` goes to rank j; chunk i of `output` comes from rank i."""
        return self._call("all_to_all", input.nbytes, input.dtype, async_op,
                          self._all_to_all, output, input, async_op)

    def send(self, tensor, *, dst: int) -> None:
        self._call("send", tensor.nbytes, tensor.dtype, False, self._send, tensor, dst, False)

    def recv(self, tensor, *, src: int) -> None:
        self._call("recv", tensor.nbytes, tensor.dtype, False, self._recv, tensor, src, False)

    def isend(self, tensor, *, dst: int) -> "Handle":
        return self._call("send", tensor.nbytes, tensor.dtype, True, self._send, tensor, dst, True)

    def irecv(self, tensor, *, src: int) -> "Handle":
        return self._call("recv", tensor.nbytes, tensor.dtype, True, self._recv, tensor, src, True)

    def sendrecv(self, send_tensor, recv_tensor, *, dst: int, src: int, async_op: bool = False):
        """Send to `dst` and receive from `src` at once (one step of a ring exchange)."""
        return self._call("sendrecv", send_tensor.nbytes, send_tensor.dtype, async_op,
                          self._sendrecv, send_tensor, recv_tensor, dst, src, async_op)

    def barrier(self) -> None:
        self._call("barrier", 0, None, False, self._barrier)

    # ---- the single place where ops are wrapped, timed and logged ---------------------------
    def _call(self, name: str, nbytes: int, dtype, async_op: bool, fn, *args):
        if self.fault is not None:
            self.fault(self, name, nbytes, dtype)
        hit = self._labels.get((name, nbytes, dtype))
        if hit is None:
            hit = self._label(name, nbytes, dtype)
        self.seq += hit[1]
        self._ring((self.label, self.seq, name, nbytes, dtype))
        annotate = ANNOTATOR.active
        if annotate:
            ANNOTATOR.push(hit[0])
        self.busy_seq += 1
        self.busy = name
        flight = hit[2]
        if flight is not None:  # started just before the start stamp, as it ends just after the end stamp
            flight = (flight.end, flight.start(flight.attrs))
        try:
            start = self._now()
            work = fn(*args)
            if async_op:
                handle, flight = Handle(self, name, nbytes, work, start, flight), None
                return handle
            end = self._now()
        except CommprofError:
            raise
        except Exception as exc:  # the backend's own words, as one line that names the op
            raise self.failure(name, exc) from exc
        finally:
            if flight is not None:  # a synchronous op, or one that failed: over now
                flight[0](flight[1])
            self.busy = None
            if annotate:
                ANNOTATOR.pop()
        entry = (name, nbytes, self.world_size, start, end, False, self.label)
        self._append(entry)  # _log's body: a call less on every synchronous op
        if annotate and ANNOTATOR._trace is not None:  # the attribute: its property is a call more
            ANNOTATOR._trace.op(entry, self)
        return None

    def failure(self, name: str, exc: BaseException) -> CommprofError:
        """A backend exception as one clear error: a timeout, a vanished peer, or the first line."""
        self.failed = name
        text = str(exc).strip()
        first = text.splitlines()[0][:240] if text else type(exc).__name__
        lower = text.lower()
        if "timed out" in lower or "timeout" in lower:
            limit = f" within {self.timeout_s:g} s (--timeout)" if self.timeout_s else ""
            return PeerTimeoutError(f"rank {self.rank}: {name} did not complete{limit}: "
                                    "a peer rank stalled or died")
        if "connection reset" in lower or "connection closed" in lower or "broken pipe" in lower:
            return PeerError(f"rank {self.rank}: {name} failed: a peer rank exited ({first})")
        return CommprofError(f"rank {self.rank}: {name} failed: {first}")

    def _label(self, name: str, nbytes: int, dtype) -> tuple:
        """(NVTX label, 1 for a collective — it advances `seq` — or 0, the op's in-flight range or None),
        cached per (name, size, dtype)."""
        if name.startswith("wait "):
            label, in_flight = ANNOTATOR.label(f"{name} ({self.label})", "wait"), None
        else:
            kind = dtype_name(dtype) if dtype is not None else None
            label = ANNOTATOR.label(op_message(name, nbytes, kind, self.label), op_category(name, self.label),
                                    payload=nbytes if dtype is not None else None)
            in_flight = ANNOTATOR.in_flight_range(label, self.label)
        hit = self._labels[(name, nbytes, dtype)] = (label, 0 if name in P2P else 1, in_flight)
        return hit

    def range(self, message: str) -> Range:
        """An NVTX range (category `kernel`) around several ops, e.g. one step of a hand-written
        algorithm: `with comm.range("ring::reduce_scatter::step2"): ...`. Neither timed nor counted."""
        return Range(ANNOTATOR.label(message, "kernel"))

    def _log(self, entry: tuple) -> None:
        """Append one op log entry, fields in record/recorder.py's NAME … GROUP order: a plain tuple,
        the cheapest append and untracked by the garbage collector (see there)."""
        self._append(entry)
        trace = ANNOTATOR._trace
        if trace is not None:
            trace.op(entry, self)

    # ---- control plane: bookkeeping between ranks, neither timed nor counted ----------------
    def gather_object(self, obj, dst: int = 0) -> list | None:
        """Picklable `obj` of every rank, as a list on `dst` (None elsewhere)."""
        return self._blocking("gather_object", self._gather_object, obj, dst)

    def broadcast_object(self, obj, src: int = 0):
        """Rank `src`'s picklable `obj`, on every rank."""
        return self._blocking("broadcast_object", self._broadcast_object, obj, src)

    def control_barrier(self, *, idle: bool | None = None) -> None:
        """Wait for every rank, outside the op log. A barrier where some ranks have nothing to do until
        the others arrive (bench's ranks outside every group) passes `idle` on every rank: True where the
        rank waits without spinning, leaving its core to the others, False elsewhere (MPI matches that
        barrier, a nonblocking one, only with nonblocking ones)."""
        self._blocking("control_barrier", self._control_barrier, idle)

    def _blocking(self, name: str, fn, *args):
        self.busy_seq += 1
        self.busy = name
        try:
            return fn(*args)
        except CommprofError:
            raise
        except Exception as exc:
            raise self.failure(name, exc) from exc
        finally:
            self.busy = None

    def new_group(self, ranks: list[int], label: str = "group") -> "Comm | None":
        """A Comm over `ranks` (this Comm's ranks) sharing its op log, its ops logged under `label`;
        every rank must call it with the same arguments; None on ranks outside it."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the backend's resources."""

    # ---- what a backend implements ----------------------------------------------------------
    def _all_reduce(self, tensor, op, output, async_op): raise NotImplementedError
    def _all_gather(self, output, input, async_op): raise NotImplementedError
    def _reduce_scatter(self, output, input, op, async_op): raise NotImplementedError
    def _broadcast(self, tensor, src, async_op): raise NotImplementedError
    def _reduce(self, tensor, dst, op, output, async_op): raise NotImplementedError
    def _all_to_all(self, output, input, async_op): raise NotImplementedError
    def _send(self, tensor, dst, async_op): raise NotImplementedError
    def _recv(self, tensor, src, async_op): raise NotImplementedError
    def _sendrecv(self, send_tensor, recv_tensor, dst, src, async_op): raise NotImplementedError
    def _barrier(self): raise NotImplementedError
    def _gather_object(self, obj, dst): raise NotImplementedError
    def _broadcast_object(self, obj, src): raise NotImplementedError
    def _control_barrier(self, idle): raise NotImplementedError

    def _wait(self, work) -> None:
        """Block until backend `work` (a torch Work or MPI Request) has completed."""
        raise NotImplementedError

    def _watch_completion(self, work, done, name: str) -> tuple:
        """Arrange for `done(perf_counter_ns())` to run when `work`, op `name`'s, completes, if the backend
        can tell; returns (what the op's waits wait on instead of `work` (comm/waiter.py) or None, the backend's
        future of `work` or None)."""
        return None, None
