"""Where a found backward ends: at its return, or — once the process has built a C++ reducer (DDP's), which
waits for its buckets after autograd's last node — at that last node (record/hooks.py). One process, a gloo
world of one rank."""

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from commprof.record import hooks
from commprof.record.clock import CpuClock
from commprof.record.recorder import OpRecorder


def test_a_backward_marks_its_last_node_only_once_a_cxx_reducer_exists(monkeypatch, tmp_path):
    marked = []
    split = hooks.split_backward
    monkeypatch.setattr(hooks, "split_backward", lambda *a: marked.append(time.perf_counter_ns()) or split(*a))
    torch_own = dist.Reducer
    tracker = hooks.install(OpRecorder(CpuClock), warmup=0)
    model, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    try:
        assert dist.Reducer is not torch_own and issubclass(dist.Reducer, torch_own)
        loss = model(x).sum()
        before = time.perf_counter_ns()
        loss.backward()
        returned = time.perf_counter_ns()
        name, start, end = tracker.phases.spans[-1]
        assert marked == [] and not tracker.reducer
        assert name == "backward" and before <= start <= end <= returned

        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        ddp = DistributedDataParallel(model)
        assert tracker.reducer
        ddp(x).sum().backward()
        assert len(marked) == 1 and tracker.phases.spans[-1][0] == "backward"
    finally:
        hooks.uninstall()
        if dist.is_initialized():
            dist.destroy_process_group()
    assert dist.Reducer is torch_own
