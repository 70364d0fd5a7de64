"""One rank of tests/test_interpose.py: a plain torch.distributed script, interposed. Every collective's result
is checked against its closed form, then the op log against what the script called: names, payload bytes
in nccl-tests' convention, group labels. Prints one JSON line per rank; exit 1 on any mismatch."""

import json
import os
import pickle
import sys

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from commprof.comm import torch_own
from commprof.intercept import interpose
from commprof.record.recorder import GROUP, NAME, NBYTES

N = 1024  # float32 elements per rank


def main() -> int:
    interposer = interpose.install()
    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    failures, expected = [], []

    def check(what, got, want):
        if not torch.equal(got, want):
            failures.append(f"{what}: got {got.flatten()[:4].tolist()} want {want.flatten()[:4].tolist()}")

    t = torch.full((N,), float(r + 1))
    dist.all_reduce(t)
    check("all_reduce", t, torch.full((N,), float(n * (n + 1) // 2)))
    expected.append(("all_reduce", N * 4, "world"))

    t = torch.full((N,), float(r))
    work = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
    work.wait()
    check("async all_reduce max", t, torch.full((N,), float(n - 1)))
    expected.append(("all_reduce", N * 4, "world"))

    out = torch.empty(n * N)
    dist.all_gather_into_tensor(out, torch.full((N,), float(r)))
    check("all_gather_into_tensor", out, torch.arange(n).repeat_interleave(N).float())
    expected.append(("all_gather", n * N * 4, "world"))

    parts = [torch.empty(N) for _ in range(n)]
    work = dist.all_gather(parts, torch.full((N,), float(r)), async_op=True)
    work.wait()
    check("all_gather list", torch.stack(parts), torch.arange(n).float()[:, None].expand(n, N))
    expected.append(("all_gather", n * N * 4, "world"))

    shard = torch.empty(N)
    dist.reduce_scatter_tensor(shard, torch.arange(n * N).float())
    check("reduce_scatter_tensor", shard, n * torch.arange(r * N, (r + 1) * N).float())
    expected.append(("reduce_scatter", n * N * 4, "world"))

    dist.reduce_scatter(shard, [torch.full((N,), float(i)) for i in range(n)])
    check("reduce_scatter list", shard, torch.full((N,), float(n * r)))
    expected.append(("reduce_scatter", n * N * 4, "world"))

    t = torch.full((N,), float(r))
    dist.broadcast(t, src=n - 1)  # a global rank, as torch takes it
    check("broadcast", t, torch.full((N,), float(n - 1)))
    expected.append(("broadcast", N * 4, "world"))

    t = torch.ones(N)
    dist.reduce(t, dst=0)
    if r == 0:
        check("reduce", t, torch.full((N,), float(n)))
    expected.append(("reduce", N * 4, "world"))

    a2a = torch.empty(n * 4)
    dist.all_to_all_single(a2a, torch.arange(n * 4).float() + 100 * r)
    check("all_to_all_single", a2a, torch.cat([torch.arange(r * 4, r * 4 + 4).float() + 100 * s for s in range(n)]))
    expected.append(("all_to_all", n * 4 * 4, "world"))

    outs = [torch.empty(4) for _ in range(n)]
    dist.all_to_all(outs, [torch.full((4,), float(100 * r + s)) for s in range(n)])
    check("all_to_all list", torch.stack(outs), torch.tensor([[100.0 * s + r] * 4 for s in range(n)]))
    expected.append(("all_to_all", n * 4 * 4, "world"))

    dist.barrier()
    expected.append(("barrier", 0, "world"))

    # point to point: a ring, blocking, async and batched (torch's P2POp takes the rebound isend/irecv)
    nxt, prv = (r + 1) % n, (r - 1) % n
    got = torch.empty(N)
    if r % 2 == 0:
        dist.send(torch.full((N,), float(r)), dst=nxt)
        sender = dist.recv(got, src=prv)
    else:
        sender = dist.recv(got, src=prv)
        dist.send(torch.full((N,), float(r)), dst=nxt)
    check("send/recv", got, torch.full((N,), float(prv)))
    if sender != prv:
        failures.append(f"recv returned {sender}, not the sender {prv}")
    expected += [("send", N * 4, "world"), ("recv", N * 4, "world")] if r % 2 == 0 else \
        [("recv", N * 4, "world"), ("send", N * 4, "world")]
    # gloo's send and recv works have no future, and each ask throws a C++ error with its backtrace (8-15
    # µs): asked once per kind of op, not twice per op (benchmarks/profile_cost.py's pipeline)
    work_class = dist.distributed_c10d.Work
    own, asked = work_class.get_future, []
    work_class.get_future = lambda self: asked.append(1) or own(self)
    try:
        works = [dist.isend(torch.full((N,), float(r)), dst=nxt), dist.irecv(got, src=prv)]
        for w in works:
            w.wait()
    finally:
        work_class.get_future = own
    if len(asked) > 2:
        failures.append(f"isend and irecv asked their works for a future {len(asked)} times, not at most 2")
    check("isend/irecv", got, torch.full((N,), float(prv)))
    expected += [("send", N * 4, "world"), ("recv", N * 4, "world")]
    ops = [dist.P2POp(dist.isend, torch.full((N,), float(r)), nxt), dist.P2POp(dist.irecv, got, prv)]
    if ops[0].op is not dist.isend:
        failures.append("P2POp does not keep the isend it was given")
    for w in dist.batch_isend_irecv(ops):
        if not isinstance(w, dist.distributed_c10d.Work):
            failures.append(f"batch_isend_irecv returned a {type(w).__name__}, not a Work")
        w.wait()
    check("batch_isend_irecv", got, torch.full((N,), float(prv)))
    expected += [("send", N * 4, "world"), ("recv", N * 4, "world")]

    pair = dist.new_group([0, 1])  # every rank calls new_group; only ranks 0 and 1 use it
    if r < 2:
        t = torch.full((N,), float(r + 1))
        dist.all_reduce(t, group=pair)
        check("subgroup all_reduce", t, torch.full((N,), 3.0))
        expected.append(("all_reduce", N * 4, "ranks0-1"))
        t = torch.full((N,), float(r))
        dist.broadcast(t, src=1, group=pair)
        check("subgroup broadcast", t, torch.full((N,), 1.0))
        expected.append(("broadcast", N * 4, "ranks0-1"))

    # by distributed_c10d's own name, and through torch's helpers that call those names: routed all the same
    t = torch.full((N,), float(r + 1))
    c10d.all_reduce(t)
    check("all_reduce by distributed_c10d's name", t, torch.full((N,), float(n * (n + 1) // 2)))
    expected.append(("all_reduce", N * 4, "world"))
    objects = [None] * n
    dist.all_gather_object(objects, {"rank": r})  # the sizes (an int64 a rank), then the pickles
    if objects != [{"rank": s} for s in range(n)]:
        failures.append(f"all_gather_object gave {objects}")
    expected += [("all_gather", n * 8, "world"), ("all_gather", n * len(pickle.dumps({"rank": 0})), "world")]
    box = ["from the last rank" if r == n - 1 else None]
    dist.broadcast_object_list(box, src=n - 1)  # the size (an int64 an object), then the pickle
    if box != ["from the last rank"]:
        failures.append(f"broadcast_object_list gave {box}")
    expected += [("broadcast", 8, "world"), ("broadcast", len(pickle.dumps("from the last rank")), "world")]

    # the coalesced forms: one op over the tensors laid end to end, as gloo sends them
    pair = [torch.ones(2), torch.full((1, 3), float(r))]
    dist.all_reduce_coalesced(pair)
    check("all_reduce_coalesced", torch.cat([t.reshape(-1) for t in pair]),
          torch.tensor([float(n)] * 2 + [n * (n - 1) / 2] * 3))
    expected.append(("all_reduce", 5 * 4, "world"))
    lists = [[torch.empty(2), torch.empty(1, 3)] for _ in range(n)]
    c10d.all_gather_coalesced(lists, [torch.full((2,), float(r)), torch.full((1, 3), 10.0 + r)])
    check("all_gather_coalesced", torch.stack([torch.cat([a, b.reshape(-1)]) for a, b in lists]),
          torch.stack([torch.tensor([float(s)] * 2 + [10.0 + s] * 3) for s in range(n)]))
    expected.append(("all_gather", n * 5 * 4, "world"))

    # what Comm has no form for runs as torch's own, counted as unseen; what torch's own function calls by
    # distributed_c10d's names is torch's too (all_gather_into_tensor calls all_gather_single): no op
    splits = [1] * n
    dist.all_to_all_single(torch.empty(n), torch.zeros(n), splits, splits)
    out = torch.empty(n * 2)
    dist.all_gather_into_tensor(out, torch.full((4,), float(r))[::2])  # not contiguous
    check("all_gather_into_tensor, not contiguous", out, torch.arange(n).repeat_interleave(2).float())
    pieces = [torch.empty(4) for _ in range(n)] if r == 0 else None
    dist.gather(torch.full((4,), float(r)), pieces, dst=0)
    if r == 0:
        check("gather", torch.stack(pieces), torch.arange(n).float()[:, None].expand(n, 4))
    mine = torch.empty(4)
    c10d.scatter(mine, [torch.full((4,), float(s)) for s in range(n)] if r == 0 else None, src=0)
    check("scatter", mine, torch.full((4,), float(r)))

    seen = [(op[NAME], op[NBYTES], op[GROUP]) for op in interposer.recorder.ops]
    if seen != expected:
        failures.append(f"op log {seen} != {expected}")
    dist.destroy_process_group()
    interpose.uninstall()
    if dist.all_reduce is not c10d.all_reduce or c10d.all_reduce is not torch_own.c10d.all_reduce:
        failures.append("uninstall left all_reduce rebound")
    if c10d.gather is not torch_own.c10d.gather or dist.gather is not c10d.gather:
        failures.append("uninstall left gather rebound")
    print(json.dumps({"rank": r, "ops": len(seen), "unseen": dict(interposer.unseen), "failures": failures}),
          flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
