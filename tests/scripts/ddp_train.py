"""A plain DDP training script, as a user writes it: `commprof profile` must see every bucket."""
import argparse
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--bucket-mb", type=float, default=0.05)
p.add_argument("--state", help="write the final parameters here (rank 0)")
p.add_argument("--hook", action="store_true", help="register torch's own all-reduce comm hook")
p.add_argument("--find-unused", action="store_true", help="find_unused_parameters=True")
p.add_argument("--misbehave", choices=["barrier", "all_reduce", "raise", "os_exit"],
               help="rank --rank at step --at: an extra barrier, an extra all_reduce of 4 floats, an exception, or "
                    "os._exit(7)")
p.add_argument("--at", type=int, default=0, help="the step --rank misbehaves at")
p.add_argument("--rank", type=int, default=1, help="the rank that misbehaves")
p.add_argument("--no-buffers", action="store_true",
               help="no BatchNorm: DDP broadcasts nothing a step, so an extra all_reduce meets a bucket's")
p.add_argument("--mismatch", action="store_true", help="rank 1's hidden layer narrower: DDP refuses the model")
p.add_argument("--seed-by-rank", action="store_true",
               help="each rank its own initial parameters: DDP's construction broadcasts rank 0's")
args = p.parse_args()

dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank if args.seed_by_rank else 0)
hidden = 48 if args.mismatch and rank == 1 else 64
norm = torch.nn.Identity() if args.no_buffers else torch.nn.BatchNorm1d(hidden)
model = torch.nn.Sequential(torch.nn.Linear(32, hidden), norm, torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
ddp = DDP(model, bucket_cap_mb=args.bucket_mb, find_unused_parameters=args.find_unused)
if args.hook:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
for step in range(args.steps):
    x = torch.randn(16 * world, 32, generator=g)
    y = torch.randint(0, 10, (16 * world,), generator=g)
    mine = slice(16 * rank, 16 * (rank + 1))
    if args.misbehave and rank == args.rank and step == args.at:
        if args.misbehave == "barrier":
            dist.barrier()
        elif args.misbehave == "all_reduce":
            dist.all_reduce(torch.ones(4))
        elif args.misbehave == "os_exit":
            os._exit(7)
        else:
            raise RuntimeError(f"bad batch at step {step}")
    loss = torch.nn.functional.cross_entropy(ddp(x[mine]), y[mine])
    opt.zero_grad()
    loss.backward()
    opt.step()
if rank == 0:
    print(json.dumps({"params": sum(p.numel() for p in model.parameters()),
                      "buffers": {str(b.dtype): b.numel() for b in model.buffers()}}))
    if args.state:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.state)
# Released before the group goes: a work the last step left to them would otherwise be freed during
# interpreter finalization by a gloo worker thread, which then takes the GIL and aborts the process
# ("terminate called without an active exception": 9 of 30 runs of this script at 2 ranks).
del ddp, opt, loss
gc.collect()
dist.destroy_process_group()
if "commprof" not in sys.modules:
    # Run plainly (not under `commprof profile`, which ends its ranks so itself), the process ends without
    # finalizing, as commprof's ranks do (comm.end_process): with --hook the abort above was still seen once
    # in a fresh-clone suite run, the hook's future chain keeping a work past the collection.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
