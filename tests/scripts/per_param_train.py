"""A training script that all-reduces every gradient on its own, one blocking call per parameter (many
small collectives), or with --fused all of them as one flat tensor: the same arithmetic, fewer ops."""
import argparse

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--layers", type=int, default=16)
p.add_argument("--fused", action="store_true")
args = p.parse_args()

dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(args.layers)])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
x = torch.randn(16, 32, generator=g)
for step in range(args.steps):
    opt.zero_grad()
    model(x).square().mean().backward()
    grads = [q.grad for q in model.parameters()]
    if args.fused:
        flat = torch.cat([q.reshape(-1) for q in grads])
        dist.all_reduce(flat)
        for q, part in zip(grads, flat.split([q.numel() for q in grads])):
            q.copy_(part.view_as(q))
    else:
        for q in grads:
            dist.all_reduce(q)
    for q in grads:
        q.div_(world)
    opt.step()
dist.destroy_process_group()
