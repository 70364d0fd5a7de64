"""A plain FSDP2 (fully_shard) training script: each Linear a unit, then the root (--units root: the root alone,
one unit of every parameter)."""
import argparse
import gc

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--state", help="write the final full parameters here (rank 0)")
p.add_argument("--units", choices=["layers", "root"], default="layers")
p.add_argument("--width", type=int, default=64, help="the hidden layers' width")
args = p.parse_args()

dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
w = args.width
model = torch.nn.Sequential(torch.nn.Linear(32, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                            torch.nn.Linear(w, 10))
if args.units == "layers":
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
for step in range(args.steps):
    x = torch.randn(16 * world, 32, generator=g)
    y = torch.randint(0, 10, (16 * world,), generator=g)
    mine = slice(16 * rank, 16 * (rank + 1))
    loss = torch.nn.functional.cross_entropy(model(x[mine]), y[mine])
    loss.backward()
    opt.step()
    opt.zero_grad()
state = {k: v.full_tensor() for k, v in model.state_dict().items()}
if rank == 0 and args.state:
    torch.save(state, args.state)
# Released before the group goes: a work the last step left to them would otherwise be freed during
# interpreter finalization by a gloo worker thread, which then takes the GIL and aborts the process
# ("terminate called without an active exception": 5 of 20 runs of this script at 2 ranks).
del model, opt, loss
gc.collect()
dist.destroy_process_group()
