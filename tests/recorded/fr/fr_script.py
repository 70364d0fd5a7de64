"""Made tests/recorded/fr/ once: rank 0's flight record (torch's own, stack traces left out) of 2 gloo ranks, with
the wall-clock stamps of three "iterations" and the script's groups as commprof labels them. Run plainly, not
under commprof, so each call below reaches torch as the script wrote it:

    TORCH_FR_BUFFER_SIZE=2000 python -m torch.distributed.run --nproc-per-node 2 tests/recorded/fr/fr_script.py \
        tests/recorded/fr

Each iteration: all_reduce of 1,024 floats, all_gather_into_tensor of 256 floats a rank, broadcast of 100 floats on
a subgroup of both ranks, a functional all_reduce of 64 floats, a C++ `pg.allreduce` of 50 floats, a
reduce_scatter_tensor of 16 floats, a send/recv of 5 floats and a gather of 3 floats; one all_reduce of 8 floats
before the first and after the last (outside every iteration). tests/unit/test_torch_record.py reads it.
"""
import json
import pickle
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed import distributed_c10d as c10d

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
sub = dist.new_group([0, 1])
dist.all_reduce(torch.ones(8))
spans = []
for _ in range(3):
    begin = time.time_ns()
    dist.all_reduce(torch.ones(1024))
    dist.all_gather_into_tensor(torch.empty(world * 256), torch.ones(256))
    dist.broadcast(torch.ones(100), src=0, group=sub)
    fc.wait_tensor(fc.all_reduce(torch.ones(64), "sum", dist.group.WORLD))
    c10d._get_default_group().allreduce([torch.ones(50)]).wait()
    dist.reduce_scatter_tensor(torch.empty(16 // world), torch.ones(16))
    if rank == 0:
        dist.send(torch.ones(5), 1)
    else:
        dist.recv(torch.empty(5), 0)
    dist.gather(torch.ones(3), [torch.empty(3) for _ in range(world)] if rank == 0 else None, dst=0)
    spans.append([begin, time.time_ns()])
dist.all_reduce(torch.ones(8))
if rank == 0:
    dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(includeStackTraces=False))
    groups = {pg.group_name: ["world" if pg is c10d._get_default_group() else
                              "ranks" + "-".join(map(str, (min(r), max(r)))), len(r)]
              for pg in c10d._world.pg_map for r in [c10d.get_process_group_ranks(pg)]}
    out = Path(sys.argv[1])
    out.joinpath("dump.json").write_text(json.dumps(dump, indent=1) + "\n")
    out.joinpath("spans.json").write_text(json.dumps({"spans": spans, "groups": groups,
                                                      "torch": torch.__version__}, indent=1) + "\n")
dist.destroy_process_group()
