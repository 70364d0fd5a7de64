"""A plain torch.distributed script: per iteration an all_reduce, an async all_gather, a subgroup broadcast
and a ring send/recv, then an optimizer step. Prints one line per rank, exits with --exit."""
import argparse

import torch
import torch.distributed as dist

import commprof

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--exit", type=int, default=0)
p.add_argument("--explicit", action="store_true", help="mark iterations and phases with commprof's own calls")
p.add_argument("--no-destroy", action="store_true", help="leave the process group for commprof to find")
args = p.parse_args()

dist.init_process_group()
r, n = dist.get_rank(), dist.get_world_size()
pair = dist.new_group([0, 1])
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    if args.explicit:
        with commprof.phase("forward"):
            loss = model(torch.ones(4, 64)).sum()
        with commprof.phase("backward"):
            loss.backward()
    else:
        model(torch.ones(4, 64)).sum().backward()
    t = torch.ones(1000)                     # 4000 B
    dist.all_reduce(t)
    assert t[0].item() == n
    out = torch.empty(n * 250)               # 250 floats each: 1000 B in, n × 1000 B out
    dist.all_gather_into_tensor(out, torch.full((250,), float(r)), async_op=True).wait()
    assert out.view(n, 250)[:, 0].tolist() == list(map(float, range(n)))
    if r < 2:
        b = torch.full((100,), float(r))     # 400 B on ranks 0-1
        dist.broadcast(b, src=1, group=pair)
        assert b[0].item() == 1.0
    got = torch.empty(50)                     # 200 B around the ring
    reqs = [dist.isend(torch.full((50,), float(r)), dst=(r + 1) % n), dist.irecv(got, src=(r - 1) % n)]
    for q in reqs:
        q.wait()
    assert got[0].item() == (r - 1) % n
    opt.step()
    opt.zero_grad()
    if args.explicit:
        commprof.step()
print(f"script rank {r} of {n} finished", flush=True)
if not args.no_destroy:
    dist.destroy_process_group()
raise SystemExit(args.exit)
