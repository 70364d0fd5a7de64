"""An in-process world of N ranks, one thread each, whose Comms move tensors in memory: the fast lane's
stand-in for a multi-rank job (after param's tests/mocks/backend_mock.py and torchtitan's fake process
group), with real results: an all_reduce really sums, a recv really gets what its peer sent.

    def rank(comm):                        # on rank comm.rank's own thread
        t = torch.full((2,), float(comm.rank))
        comm.all_reduce(t)
        return t, comm.recorder.ops            # its op log, as comm/base.py wrote it
    FakeWorld(4).run(rank)                 # [(tensor([6., 6.]), [("all_reduce", 8, 4, …)]), …] by rank

FakeComm subclasses the real Comm and fills in only its backend hooks (`_all_reduce`, `_send`, …): the
timing, counting and op log under test are comm/base.py's and comm/handle.py's own. Where backends differ,
it takes the strictest, so that what passes here is correct on any of them:
  - the k-th collective of each member of a group meets every other member's k-th; members that disagree
    on op, reduction, root, dtype or size get DesyncError (base/errors.py), as a desync would end a job;
  - inputs are read and outputs written when the last member arrives (async: before wait() returns);
  - a send completes only once its receive has matched it (MPI_Ssend): a kernel that counts on a backend's
    buffering fails here rather than hanging on a long message elsewhere; p2p messages on one (src, dst)
    pair match in order and must agree in bytes and dtype; tensors must be contiguous;
  - every wait is bounded by `timeout_s`, and a rank that raises wakes every blocked peer at once:
    FakeWorld.run re-raises the first rank's own error, not its peers' aborts. A world that failed is spent.
An async collective completes, and is logged, on the thread of its last member to arrive (as gloo's future
callback: Handle._completed), under the world's lock, so that a member's wait() returns only once the op is
in its log; p2p completes at wait() (gloo's send/recv have no future: TorchComm). gather_object,
broadcast_object and control_barrier match on a sequence of their own, neither timed nor counted
(comm/base.py). The ranks share torch's global state (its default generator above all): a caller that seeds
keeps them apart (test_fake_comm_strategies.py builds one rank at a time).
Exercised by: `pytest tests/unit/test_fake_comm_kernels.py tests/unit/test_fake_comm_strategies.py`.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections import deque

import torch

from commprof.base.errors import DesyncError
from commprof.base.measurement import P2P
from commprof.comm.base import Comm
from commprof.record.clock import CpuClock

TIMEOUT_S = 20.0
"""Longest wait of any rank on its peers: far above any fast-lane op, far below pytest's patience."""

_REDUCE = {"sum": torch.add, "avg": torch.add, "prod": torch.mul, "min": torch.minimum, "max": torch.maximum}


class Aborted(RuntimeError):
    """A rank blocked on a peer that has failed: not the cause, so FakeWorld.run reports the peer's error."""


def _reduce(tensors: list[torch.Tensor], op: str) -> torch.Tensor:
    """Elementwise reduction in rank order, computed once: every member gets the same bits."""
    acc = tensors[0].reshape(-1).clone()
    for t in tensors[1:]:
        _REDUCE[op](acc, t.reshape(-1), out=acc)
    return acc.div_(len(tensors)) if op == "avg" else acc


class _Op:
    """One collective of a group (its k-th) or one p2p message; `done` once complete."""

    def __init__(self, n: int = 0) -> None:
        self.metas, self.parts, self.done, self.error, self.callbacks = [None] * n, [None] * n, False, None, []
        self.result = self.tensor = None


class _Group:
    """What the members of one group share: their collectives in flight and their p2p channels."""

    def __init__(self, members: tuple, label: str, key: tuple) -> None:
        self.members, self.label, self.key = members, label, key
        self.ops: dict[tuple, _Op] = {}
        """("collective" | "control", k) -> the group's k-th call of that kind (its tensors dropped once done)."""
        self.channels: dict[tuple, tuple[deque, deque]] = {}
        """(src, dst) group ranks -> (sends, receives) not yet matched."""


class FakeWorld:
    """N ranks in one process: `comms[r]` is rank r's world Comm; `run(fn)` runs fn(comm) on every rank."""

    def __init__(self, world_size: int, *, timeout_s: float = TIMEOUT_S) -> None:
        self.world_size, self.timeout_s = world_size, timeout_s
        self.cond = threading.Condition()
        """Guards every shared structure below and in each _Group; notified on every change."""
        self.failed: str | None = None
        self._groups: dict[tuple, _Group] = {}
        world = self.group((), tuple(range(world_size)), "world")
        self.comms = [FakeComm(self, world, rank=r) for r in range(world_size)]

    def group(self, key: tuple, members: tuple, label: str) -> _Group:
        """The group made by the key-th new_group call, created by its first caller; DesyncError if callers differ."""
        with self.cond:
            got = self._groups.setdefault(key, _Group(members, label, key))
        if (got.members, got.label) != (members, label):
            raise DesyncError(f"new_group #{key[-1] if key else 0}: ranks {members} ({label!r}) here, "
                              f"{got.members} ({got.label!r}) on a peer")
        return got

    def wait(self, ready, what: str) -> None:
        """Block until ready() (checked under the lock); Aborted if a peer failed, RuntimeError after timeout_s."""
        deadline = time.monotonic() + self.timeout_s
        with self.cond:
            while not ready():
                if self.failed is not None:
                    raise Aborted(f"{what}: aborted, {self.failed}")
                left = deadline - time.monotonic()
                if left <= 0:  # "timed out": Comm.failure makes it a PeerTimeoutError, this text its cause
                    raise RuntimeError(f"{what} timed out after {self.timeout_s:g} s: a peer never matched it")
                self.cond.wait(left)

    def run(self, fn, *args) -> list:
        """fn(comms[r], *args) on N threads at once; the return values in rank order, or the first failing
        rank's own exception re-raised (RankFailed naming it) once every thread has ended."""
        results, errors = [None] * self.world_size, {}

        def body(r: int) -> None:
            try:
                results[r] = fn(self.comms[r], *args)
            except BaseException as exc:  # whatever it is, the peers must wake
                errors[r] = exc
                with self.cond:
                    if self.failed is None and not _caused_by_abort(exc):
                        self.failed = f"rank {r} failed: {type(exc).__name__}: {exc}"
                    self.cond.notify_all()

        threads = [threading.Thread(target=body, args=(r,), name=f"fake rank {r}", daemon=True)
                   for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:  # every wait inside is bounded: a thread alive past this is a bug of the fake
            t.join(self.timeout_s * 3)
            if t.is_alive():
                raise RuntimeError(f"{t.name} still runs {3 * self.timeout_s:g} s on: it blocks outside the Comm")
        if errors:
            rank = min((r for r in errors if not _caused_by_abort(errors[r])), default=min(errors))
            raise RankFailed(f"rank {rank} of {self.world_size}: {type(errors[rank]).__name__}: "
                             f"{errors[rank]}") from errors[rank]
        return results


class RankFailed(RuntimeError):
    """A rank of FakeWorld.run raised; its exception is the cause."""


def _caused_by_abort(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, Aborted):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class FakeComm(Comm):
    """One rank's Comm over one group of a FakeWorld; only the backend hooks are its own."""

    backend = "fake"

    def __init__(self, world: FakeWorld, group: _Group, *, rank: int, recorder=None) -> None:
        super().__init__(rank=rank, world_size=len(group.members), device=torch.device("cpu"), clock=CpuClock(),
                         recorder=recorder)
        self.world, self.group = world, group
        self.members = list(group.members)
        self.label = group.label
        self.timeout_s = world.timeout_s
        self._next = {"collective": 0, "control": 0, "group": 0}
        """This rank's count of each kind of call on its group: the k-th matches every member's k-th."""

    # ---- collectives: arrive, and the last member to arrive computes for all -------------------
    def _arrive(self, meta: tuple, part, compute, async_op: bool = False, kind: str = "collective"):
        k, n, world = self._next[kind], self.world_size, self.world
        self._next[kind] = k + 1
        what = f"rank {self.rank}: {meta[0]} #{k} on group {self.label!r}"
        with world.cond:
            op = self.group.ops.setdefault((kind, k), _Op(n))
            op.parts[self.rank], op.metas[self.rank] = part, meta
            if all(p is not None for p in op.parts):
                if len(set(op.metas)) > 1:
                    calls = "; ".join(f"rank {r} {m}" for r, m in enumerate(op.metas))
                    op.error = DesyncError(f"{kind} call #{k} on group {self.label!r}: the ranks disagree: {calls}")
                else:
                    try:
                        op.result = compute(op.parts)
                    except Exception as exc:  # the backend's own failure, raised in every member
                        op.error = exc
                op.parts, op.done = None, True  # the tensors are the ranks' again
                world.cond.notify_all()
                # the future's callbacks (Handle._completed), on this thread and under our lock: Handle logs
                # the op only after releasing its own, and a member's wait() must not return before that
                for done in op.callbacks:
                    done(time.perf_counter_ns())
                op.callbacks = []
        if async_op:
            return (op, what)
        return self._finish(op, what)

    def _finish(self, op: _Op, what: str):
        self.world.wait(lambda: op.done, what)
        if op.error is not None:  # one instance per rank: threads must not share a traceback
            raise type(op.error)(*op.error.args) from op.error
        return op.result

    def _all_reduce(self, tensor, op, output, async_op):
        def compute(parts):
            result = _reduce([t for t, _ in parts], op)
            for t, out in parts:
                (out if out is not None else t).view(-1).copy_(result)
        return self._arrive(("all_reduce", op, tensor.dtype, tensor.nbytes), (tensor, output), compute, async_op)

    def _all_gather(self, output, input, async_op):
        def compute(parts):
            result = torch.cat([i.reshape(-1) for _, i in parts])
            for out, _ in parts:
                out.view(-1).copy_(result)
        meta = ("all_gather", input.dtype, input.nbytes, output.nbytes)
        return self._arrive(meta, (output, input), compute, async_op)

    def _reduce_scatter(self, output, input, op, async_op):
        def compute(parts):
            chunks = _reduce([i for _, i in parts], op).chunk(len(parts))
            for r, (out, _) in enumerate(parts):
                out.view(-1).copy_(chunks[r])
        meta = ("reduce_scatter", op, input.dtype, input.nbytes, output.nbytes)
        return self._arrive(meta, (output, input), compute, async_op)

    def _broadcast(self, tensor, src, async_op):
        def compute(parts):
            for t in parts:
                if t is not parts[src]:
                    t.view(-1).copy_(parts[src].reshape(-1))
        return self._arrive(("broadcast", src, tensor.dtype, tensor.nbytes), tensor, compute, async_op)

    def _reduce(self, tensor, dst, op, output, async_op):
        def compute(parts):
            t, out = parts[dst]
            (out if out is not None else t).view(-1).copy_(_reduce([t for t, _ in parts], op))
        return self._arrive(("reduce", dst, op, tensor.dtype, tensor.nbytes), (tensor, output), compute, async_op)

    def _all_to_all(self, output, input, async_op):
        def compute(parts):
            n = len(parts)
            chunks = [i.reshape(-1).chunk(n) for _, i in parts]
            results = [torch.cat([chunks[i][j] for i in range(n)]) for j in range(n)]
            for (out, _), result in zip(parts, results):
                out.view(-1).copy_(result)
        return self._arrive(("all_to_all", input.dtype, input.nbytes), (output, input), compute, async_op)

    def _barrier(self):
        self._arrive(("barrier",), True, lambda parts: None)

    def _watch_completion(self, work, done, name: str) -> tuple:
        if name not in P2P:  # a collective completes when its last member arrives: log it then
            with self.world.cond:
                if not work[0].done:
                    work[0].callbacks.append(done)
                    return None, None
            done(time.perf_counter_ns())
        return None, None

    def _wait(self, work) -> None:
        for op, what in work if isinstance(work, list) else (work,):
            self._finish(op, what)

    # ---- point to point: one FIFO channel per (src, dst) of the group ---------------------------
    def _post(self, side: int, tensor, peer: int, what: str):
        if not tensor.is_contiguous():
            raise RuntimeError(f"{what}: tensors must be contiguous (as gloo's and NCCL's)")
        if not 0 <= peer < self.world_size:
            raise RuntimeError(f"{what}: no rank {peer} in group {self.label!r} of {self.world_size}")
        key = (self.rank, peer) if side == 0 else (peer, self.rank)
        msg = _Op()
        msg.tensor = tensor  # read (send) or written (recv) when the message matches
        with self.world.cond:
            queues = self.group.channels.setdefault(key, (deque(), deque()))
            queues[side].append(msg)
            sends, recvs = queues
            while sends and recvs:  # in order: the i-th send of a pair meets its i-th receive
                s, r = sends.popleft(), recvs.popleft()
                if (s.tensor.nbytes, s.tensor.dtype) != (r.tensor.nbytes, r.tensor.dtype):
                    s.error = r.error = RuntimeError(
                        f"{key[0]}→{key[1]} on {self.label!r}: send of {s.tensor.nbytes} B {s.tensor.dtype} "
                        f"met a recv of {r.tensor.nbytes} B {r.tensor.dtype}")
                else:
                    r.tensor.view(-1).copy_(s.tensor.reshape(-1))
                s.done = r.done = True
                s.tensor = r.tensor = None
            self.world.cond.notify_all()
        return msg, what

    def _send(self, tensor, dst, async_op):
        work = self._post(0, tensor, dst, f"rank {self.rank}: send to {dst} on {self.label!r}")
        return work if async_op else self._wait(work)

    def _recv(self, tensor, src, async_op):
        work = self._post(1, tensor, src, f"rank {self.rank}: recv from {src} on {self.label!r}")
        return work if async_op else self._wait(work)

    def _sendrecv(self, send_tensor, recv_tensor, dst, src, async_op):
        works = [self._post(1, recv_tensor, src, f"rank {self.rank}: sendrecv's recv from {src}"),
                 self._post(0, send_tensor, dst, f"rank {self.rank}: sendrecv's send to {dst}")]
        return works if async_op else self._wait(works)

    # ---- control plane: its own sequence, copies of the objects (as pickling through a store) ---
    def _gather_object(self, obj, dst):
        got = self._arrive(("gather_object", dst), pickle.dumps(obj), lambda parts: list(parts), kind="control")
        return [pickle.loads(p) for p in got] if self.rank == dst else None

    def _broadcast_object(self, obj, src):
        got = self._arrive(("broadcast_object", src), pickle.dumps(obj), lambda parts: parts[src], kind="control")
        return pickle.loads(got)

    def _control_barrier(self, idle) -> None:
        self._arrive(("control_barrier",), True, lambda parts: None, kind="control")

    def new_group(self, ranks: list[int], label: str = "group") -> "FakeComm | None":
        index = self._next["group"]
        self._next["group"] = index + 1
        group = self.world.group((*self.group.key, index), tuple(self.members[r] for r in ranks), label)
        if self.rank not in ranks:
            return None
        sub = FakeComm(self.world, group, rank=list(ranks).index(self.rank), recorder=self.recorder)
        sub.fault = self.fault
        return sub
