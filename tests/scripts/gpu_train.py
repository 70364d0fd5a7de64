"""A CUDA training loop of known durations, for the GPU checks: forward and backward are `torch.cuda._sleep`
kernels of calibrated length, and the communication one known op. Run by `pytest -m gpu tests/test_gpu.py`
and `python benchmarks/gpu_truth.py`.

    commprof profile --backend nccl --nproc 1 -- tests/scripts/gpu_train.py --comm async
    RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python tests/scripts/gpu_train.py --truth

--comm blocking: an all_gather of --mib MiB between backward and the optimizer step (nothing hides it);
--comm async: the same all_gather issued before forward and waited on after backward (compute hides it);
--comm ddp: DistributedDataParallel over a parameter of --mib MiB (its bucket all-reduce ends backward).
--truth (unprofiled) prints, as JSON, CUDA-event medians of each part timed alone: what a profile must find.
"""
import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--comm", choices=["blocking", "async", "ddp"], default="blocking")
p.add_argument("--forward-ms", type=float, default=4.0)
p.add_argument("--backward-ms", type=float, default=6.0)
p.add_argument("--mib", type=float, default=512.0, help="the all_gather's output, or DDP's parameter")
p.add_argument("--truth", action="store_true")
p.add_argument("--cycles-per-ms", type=float, help="torch.cuda._sleep's cycles per ms (default: calibrated here)")
args = p.parse_args()

device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
torch.cuda.set_device(device)
dist.init_process_group(device_id=device)
rank, world = dist.get_rank(), dist.get_world_size()


def timed(fn, repeat=5, ahead=None):
    """Median CUDA-event time of fn() in ms on the device: a kernel queued ahead (1 ms) lets the host queue
    all of fn before the first event is reached, so launch time is not counted."""
    out = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(ahead if ahead is not None else per_ms))
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


for _ in range(100):  # ~0.2 s of work first: the GPU's clock up before the calibration
    torch.cuda._sleep(2_000_000)
torch.cuda.synchronize()
per_ms = args.cycles_per_ms or 1e6 / timed(lambda: torch.cuda._sleep(1_000_000), ahead=1_000_000)
"""Cycles of torch.cuda._sleep per ms on this GPU (--cycles-per-ms: a truth run's, so both run the same)."""
fwd_cycles, bwd_cycles, gate_cycles = int(args.forward_ms * per_ms), int(args.backward_ms * per_ms), int(per_ms / 2)


class Sleep(torch.autograd.Function):
    """x * w[0], whose forward and backward each take a calibrated time on the device."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        torch.cuda._sleep(fwd_cycles)
        return x * w[0]

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        torch.cuda._sleep(bwd_cycles)
        gw = torch.zeros_like(w)
        gw[0] = (g * x).sum()
        return g * w[0], gw


class Net(torch.nn.Module):
    def __init__(self, numel):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(numel))

    def forward(self, x):
        return Sleep.apply(x, self.w)


numel = int(args.mib * 2**20) // 4
model = Net(numel if args.comm == "ddp" else 1).to(device)
net = DDP(model, device_ids=[device.index], bucket_cap_mb=args.mib + 1) if args.comm == "ddp" else model
opt = torch.optim.SGD(net.parameters(), lr=1e-6)
gathered = torch.empty(numel, device=device)
mine = torch.ones(numel // world, device=device)
x = torch.ones(1024, device=device)


def gather(async_op=False):
    return dist.all_gather_into_tensor(gathered, mine, async_op=async_op)


def train_step():
    work = None
    if args.comm == "async":
        # queued behind a short kernel, so the op starts on the device when forward's does (the host is
        # past the launch by then): the whole op runs under compute
        torch.cuda._sleep(gate_cycles)
        work = gather(async_op=True)
    loss = net(x).sum()
    opt.zero_grad()
    loss.backward()
    if work is not None:
        work.wait()
    elif args.comm == "blocking":
        gather()
    opt.step()


for _ in range(args.steps):
    train_step()
torch.cuda.synchronize()

if args.truth:
    def forward():
        global out
        out = net(x).sum()

    truth = {
        "comm": args.comm, "cycles_per_ms": per_ms, "gate_ms": timed(lambda: torch.cuda._sleep(gate_cycles)),
        "forward_ms": timed(forward),
        "backward_ms": timed(lambda: (forward(), out.backward())) - timed(forward),
        "step_ms": timed(opt.step),
        "gather_ms": timed(gather),
        "iteration_ms": timed(train_step),
    }
    if args.comm == "ddp":  # the bucket all-reduce alone, as DDP issues it
        truth["all_reduce_ms"] = timed(lambda: dist.all_reduce(model.w.grad))
    if rank == 0:
        print(json.dumps(truth))
dist.barrier()
dist.destroy_process_group()
