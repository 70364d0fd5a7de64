"""A DDP training script with a straggler: rank --slow-rank sleeps --delay-ms before every backward (or every
--delay-every'th: 2 delays steps 0, 2, 4, …, each beside balanced ones; from step --delay-from on), so its peers
wait that long for it in DDP's all-reduces (0: a balanced job). --skew: rank --slow-rank counts one iteration
more than its peers under `commprof profile` (commprof.step() once before the loop, every rank after each step),
so the warm-up iterations it aligns are not theirs."""
import argparse
import gc
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--delay-ms", type=float, default=0.0)
p.add_argument("--slow-rank", type=int, default=1)
p.add_argument("--delay-every", type=int, default=1)
p.add_argument("--delay-from", type=int, default=0)
p.add_argument("--skew", action="store_true")
args = p.parse_args()

dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 10))
ddp = DDP(model, bucket_cap_mb=0.5)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
x, y = torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g)
if args.skew:
    import commprof

    if rank == args.slow_rank:
        commprof.step()
for step in range(args.steps):
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    if rank == args.slow_rank and args.delay_ms and step % args.delay_every == 0 and step >= args.delay_from:
        time.sleep(args.delay_ms / 1e3)
    loss.backward()
    opt.step()
    if args.skew:
        commprof.step()
del ddp, opt, loss  # before the group goes (tests/scripts/ddp_train.py says why)
gc.collect()
dist.destroy_process_group()
