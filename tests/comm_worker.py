"""One rank of the Comm test: every op, sync and async, checked against closed forms; exit 1 on any
mismatch. Started by tests/test_comm.py as N real processes (gloo) or under mpiexec (MPI).

    python tests/comm_worker.py gloo|mpi
"""

import sys
import time

import torch
from torch.overrides import TorchFunctionMode

from commprof.base.world import discover
from commprof.comm import end_process, init_comm


def check(name: str, got: torch.Tensor, want) -> None:
    want = torch.as_tensor(want, dtype=got.dtype)
    if not torch.equal(got, want.expand_as(got)):
        raise AssertionError(f"{name}: got {got.tolist()} want {want.tolist()}")


class Traced(torch.Tensor):
    """A tensor subclass that sees every torch function called on it, torch.distributed's included."""

    seen: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(getattr(func, "__name__", ""))
        return super().__torch_function__(func, types, args, kwargs or {})


def gloo_layer(comm) -> None:
    """GlooComm calls the ProcessGroup itself, and hands to torch's functions what their Python layer is
    for: complex tensors, tensors with __torch_function__, calls inside _coalescing_manager."""
    from torch.distributed import distributed_c10d as c10d

    r, n = comm.rank, comm.world_size
    tri = n * (n + 1) // 2
    torch_all_reduce, c10d.all_reduce = c10d.all_reduce, None  # the plain call must not need it
    try:
        t = torch.full((3,), float(r + 1))
        comm.all_reduce(t)
        check("direct all_reduce", t, tri)
    finally:
        c10d.all_reduce = torch_all_reduce
    z = torch.full((2,), complex(r + 1, -(r + 1)))
    comm.all_reduce(z)
    if not torch.equal(z, torch.full((2,), complex(tri, -tri))):
        raise AssertionError(f"complex all_reduce: got {z.tolist()}")
    t = torch.full((2,), float(r + 1)).as_subclass(Traced)
    comm.all_reduce(t)
    check("subclass all_reduce", t.as_subclass(torch.Tensor), tri)
    assert "all_reduce" in Traced.seen, f"torch's function did not dispatch the subclass: {Traced.seen}"
    modes: list = []

    class Seen(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            modes.append(getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))

    t = torch.full((2,), float(r + 1))
    with Seen():
        comm.all_reduce(t)
    check("all_reduce under a TorchFunctionMode", t, tri)
    assert "all_reduce" in modes, f"torch's function did not dispatch to the mode: {modes}"
    a, b = torch.full((2,), float(r + 1)), torch.full((3,), float(r + 2))
    with c10d._coalescing_manager(async_ops=True) as cm:
        comm.all_reduce(a)
        comm.all_reduce(b)
        if n > 1:  # queued by torch's layer, issued as one at the manager's exit
            check("all_reduce inside _coalescing_manager", a, r + 1)
    cm.wait()
    check("coalesced all_reduce", a, tri)
    check("coalesced all_reduce (2)", b, tri + n)


def completes_before_its_wait(comm, n: int) -> None:
    """An async collective's span ends when it completes, not when its caller waits, 300 ms later — also
    reduce_scatter, whose gloo work has no future (comm/waiter.py); MPI's complete at wait()."""
    late = {}
    for name, issue in (
            ("all_reduce", lambda: comm.all_reduce(torch.ones(4), async_op=True)),
            ("all_gather", lambda: comm.all_gather(torch.empty(2 * n), torch.ones(2), async_op=True)),
            ("reduce_scatter", lambda: comm.reduce_scatter(torch.empty(2), torch.ones(2 * n), async_op=True))):
        handle = issue()
        time.sleep(0.3)
        handle.wait()
        late[name] = comm.recorder.durations_ns()[-1] / 1e6
    if max(late.values()) >= 150:
        print(f"spans end at the wait: {late} ms", file=sys.stderr)
        sys.exit(1)


def main(backend: str) -> None:
    world = discover()
    comm = init_comm(world, backend=backend, timeout_s=60)
    r, n = comm.rank, comm.world_size
    tri = n * (n + 1) // 2  # Σ (rank + 1)
    for async_op in (False, True):
        def done(h):
            if async_op:
                h.wait()

        t = torch.full((4,), float(r + 1))
        done(comm.all_reduce(t, async_op=async_op))
        check(f"all_reduce sum async={async_op}", t, tri)
        t = torch.full((3,), float(r + 1))
        done(comm.all_reduce(t, op="max", async_op=async_op))
        check("all_reduce max", t, n)
        out = torch.empty(2 * n)
        done(comm.all_gather(out, torch.full((2,), float(r)), async_op=async_op))
        check("all_gather", out, torch.arange(n).repeat_interleave(2).float())
        inp = torch.arange(2 * n, dtype=torch.float32) + r
        out = torch.empty(2)
        done(comm.reduce_scatter(out, inp, async_op=async_op))
        check("reduce_scatter", out, torch.tensor([2 * r, 2 * r + 1]) * n + n * (n - 1) // 2)
        t = torch.full((5,), float(r + 7))
        done(comm.broadcast(t, src=n - 1, async_op=async_op))
        check("broadcast", t, n - 1 + 7)
        t = torch.full((2,), float(r + 1))
        done(comm.reduce(t, dst=0, async_op=async_op))
        if r == 0:
            check("reduce", t, tri)
        inp = torch.tensor([10.0 * r + d for d in range(n)])  # element d goes to rank d
        out = torch.empty(n)
        done(comm.all_to_all(out, inp, async_op=async_op))
        check("all_to_all", out, torch.tensor([10.0 * s + r for s in range(n)]))
        recv = torch.empty(3)
        done(comm.sendrecv(torch.full((3,), float(r)), recv, dst=(r + 1) % n, src=(r - 1) % n,
                           async_op=async_op))
        check("sendrecv", recv, (r - 1) % n)
    comm.barrier()
    if backend == "gloo":
        gloo_layer(comm)
    if n > 1:  # point-to-point: rank 0 -> last rank, blocking and nonblocking
        if r == 0:
            comm.send(torch.full((2,), 5.0), dst=n - 1)
            comm.isend(torch.full((2,), 6.0), dst=n - 1).wait()
        elif r == n - 1:
            a, b = torch.empty(2), torch.empty(2)
            comm.recv(a, src=0)
            comm.irecv(b, src=0).wait()
            check("send/recv", a, 5.0)
            check("isend/irecv", b, 6.0)
    # A subgroup of the even ranks: n and rank are the group's, not the world's.
    evens = list(range(0, n, 2))
    sub = comm.new_group(evens)
    if r % 2 == 0:
        assert sub is not None and sub.world_size == len(evens) and sub.rank == r // 2
        t = torch.full((2,), float(r + 1))
        sub.all_reduce(t)
        check("subgroup all_reduce", t, sum(e + 1 for e in evens))
    else:
        assert sub is None
    # Every data-plane op above was logged with its payload in nccl-tests' size convention.
    logged = comm.recorder.bytes_by_op()
    assert logged["all_reduce"] >= 2 * (16 + 12), logged
    assert logged["all_gather"] == 2 * 2 * n * 4, logged
    assert logged["reduce_scatter"] == 2 * 2 * n * 4, logged
    assert all(d >= 0 for d in comm.recorder.durations_ns()), "negative duration"
    waits = len(comm.recorder.waits)
    assert waits >= 8, f"only {waits} waits logged"
    if backend == "gloo" and n > 1:
        completes_before_its_wait(comm, n)
    comm.gather_object(r)
    comm.close()
    print(f"rank {r}/{n} {backend} ok")


if __name__ == "__main__":
    end_process(main(sys.argv[1]) or 0)  # not sys.exit: see commprof.comm.end_process
