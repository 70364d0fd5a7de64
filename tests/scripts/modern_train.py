"""A training script written the ways PyTorch is used today, one way per `--mode`, run unchanged under
torchrun and under `commprof profile`:

  mesh_tp            tensor + sequence parallel on a mesh from init_device_mesh alone (no init_process_group)
  fsdp_tp            FSDP2 over TP on a 2-D mesh (4 ranks: dp × tp)
  compile_ddp        torch.compile(DDP(model)): DDPOptimizer splits the graph at bucket boundaries
  compiled_autograd  DDP's python reducer with compiled autograd: the all-reduces inside the backward graph
  compiled_autograd_ctx  the same as PyTorch's tutorial writes it: each backward inside
                     `compiled_autograd._enable(torch.compile(...))`, without fullgraph
  compile_fsdp       torch.compile of an FSDP2 model
  ddp_static         DDP(static_graph=True)
  ddp_unused         DDP(find_unused_parameters=True) with a branch unused on odd steps
  compiled_sync      home-made data parallel: the gradients averaged by `dist.all_reduce` calls inside a
                     torch.compile(fullgraph=True) function (dynamo makes them functional collectives)

MODERN_DEVICE=cuda MODERN_BACKEND=nccl put the modes without a mesh on the GPU (benchmarks/gpu_checks.py's
idioms step). `--mode` takes a comma list too, run one after another in one process group (compiled_autograd, which sets
dynamo's global configuration, last). Prints each rank's final loss of each mode as `rank R MODE loss HEX`
(float.hex: to the bit). `--count-gloo FILE`
runs the whole script under torch.profiler and writes this rank's count of gloo's own events (`gloo:<op>`) to
FILE.rankR: an independent count of every op the backend ran.
"""

import argparse
import json
import os
from collections import Counter
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--mode", required=True)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--compiler", default="aot_eager", help="torch.compile's backend")
parser.add_argument("--count-gloo", default=None)
args = parser.parse_args()


class Block(nn.Module):
    def __init__(self, dim=16, unused=False) -> None:
        super().__init__()
        self.norm, self.w1, self.w2 = nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.extra = nn.Linear(dim, dim) if unused else None
        self.step = 0

    def forward(self, x):
        y = self.w2(torch.relu(self.w1(self.norm(x))))
        if self.extra is not None and self.step % 2 == 0:
            y = y + self.extra(y)
        return y


def tp_plan(prefix=""):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {f"{prefix}norm": SequenceParallel(), f"{prefix}w1": ColwiseParallel(input_layouts=Shard(1)),
            f"{prefix}w2": RowwiseParallel(output_layouts=Shard(1))}


def build(mode: str):
    """(model to call, parameters to step, the batch of step i, the loss of an output)."""
    from torch.distributed.device_mesh import init_device_mesh

    ws = int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    if mode == "mesh_tp":
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = init_device_mesh("cpu", (ws,))  # makes the default group itself
        model = parallelize_module(Block(), mesh, tp_plan())
        return model, model.parameters(), lambda i: torch.randn(4, 8, 16), lambda out: out.pow(2).mean()
    if mode == "fsdp_tp":
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = init_device_mesh("cpu", (ws // 2, 2), mesh_dim_names=("dp", "tp"))
        model = nn.Sequential(Block(), Block())
        for block in model:
            parallelize_module(block, mesh["tp"], tp_plan())
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        dp = mesh["dp"].get_local_rank()
        return (model, model.parameters(), lambda i: torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(
            100 * i + dp)), lambda out: out.pow(2).mean())
    device = torch.device(os.environ.get("MODERN_DEVICE", "cpu"))
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(os.environ.get("MODERN_BACKEND", "gloo"))
    rank = dist.get_rank()
    batch = lambda i: torch.randn(8, 8, 16, generator=torch.Generator().manual_seed(100 * i + rank)).to(device)  # noqa: E731
    loss = lambda out: out.pow(2).mean()  # noqa: E731
    model = nn.Sequential(Block(unused=mode == "ddp_unused"), Block()).to(device)
    params = list(model.parameters())
    if mode in ("compile_fsdp",):
        from torch.distributed.fsdp import fully_shard

        for block in model:
            fully_shard(block)
        fully_shard(model)
        return torch.compile(model, backend=args.compiler), model.parameters(), batch, loss
    if mode == "compiled_sync":
        return model, params, batch, loss
    from torch.nn.parallel import DistributedDataParallel as DDP

    if mode in ("compiled_autograd", "compiled_autograd_ctx"):
        torch._dynamo.config.optimize_ddp = "python_reducer"
    if mode == "compiled_autograd":
        torch._dynamo.config.compiled_autograd = True
    ddp = DDP(model, static_graph=mode == "ddp_static", find_unused_parameters=mode == "ddp_unused",
              device_ids=[device.index] if device.type == "cuda" else None)
    if mode in ("compile_ddp", "compiled_autograd", "compiled_autograd_ctx"):
        return torch.compile(ddp, backend=args.compiler), params, batch, loss
    if mode in ("ddp_static", "ddp_unused"):
        return ddp, params, batch, loss
    raise SystemExit(f"unknown --mode {mode}")


def compiled_sync(params):
    """Each gradient summed over the ranks and divided by their number, in one graph (fullgraph: a graph break
    raises)."""
    world = dist.get_world_size()

    @torch.compile(backend=args.compiler, fullgraph=True)
    def sync(grads):
        for g in grads:
            dist.all_reduce(g)
            g.div_(world)

    return lambda: sync([p.grad for p in params])


def main() -> None:
    for mode in args.mode.split(","):
        train(mode)


def train(mode: str) -> None:
    model, params, batch, loss_of = build(mode)
    params = list(params)
    sync = compiled_sync(params) if mode == "compiled_sync" else None
    opt = torch.optim.SGD(params, lr=0.05)
    for i in range(args.steps):
        for m in model.modules():
            if isinstance(m, Block):
                m.step = i
        loss = loss_of(model(batch(i)))
        if mode == "compiled_autograd_ctx":
            from torch._dynamo import compiled_autograd

            with compiled_autograd._enable(torch.compile(backend=args.compiler)):
                loss.backward()
        else:
            loss.backward()
        if sync is not None:
            sync()
        opt.step()
        opt.zero_grad()
    print(f"rank {dist.get_rank()} {mode} loss {loss.item().hex()}", flush=True)


if __name__ == "__main__":
    profiler = (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if args.count_gloo
                else nullcontext())
    with profiler:
        main()
    if args.count_gloo:
        counts = Counter(e.name.removeprefix("gloo:") for e in profiler.events() if e.name.startswith("gloo:"))
        with open(f"{args.count_gloo}.rank{dist.get_rank()}", "w") as f:
            json.dump(counts, f)
    dist.destroy_process_group()
