"""A plain torch.distributed.pipelining script: one stage per rank, GPipe or 1F1B over 4 micro-batches."""
import argparse

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
p.add_argument("--micro-batches", type=int, default=4)
args = p.parse_args()

dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
layers = [torch.nn.Linear(32, 32) for _ in range(2 * world)]
stage_module = torch.nn.Sequential(*layers[2 * rank:2 * rank + 2])
stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))


def loss_fn(out, target):
    return torch.nn.functional.mse_loss(out, target)


schedule = (ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B)(stage, args.micro_batches, loss_fn=loss_fn)
opt = torch.optim.SGD(stage_module.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
for step in range(args.steps):
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 32, generator=g)
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        schedule.step(target=y)
    else:
        schedule.step()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
