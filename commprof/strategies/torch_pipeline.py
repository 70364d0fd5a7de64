"""`torch-pipeline-gpipe` and `torch-pipeline-1f1b`: PyTorch's own `torch.distributed.pipelining`
(PipelineStage, ScheduleGPipe / Schedule1F1B) on the cut our pipelines use, measured through interposition.

    commprof run --strategy torch-pipeline-gpipe,pipeline-gpipe --model gpt2-tiny --nproc 2 --micro-batches 4

Every rank builds the whole model from the seed and keeps its stage's layers, cut as `pipeline-gpipe` cuts
(--balance params or --cuts); the stage's process group is the run's `pp` group, adopted by the interposer,
so torch's isend/irecv land in the op log as "send (pp)" / "recv (pp)". Shapes are given to PipelineStage
up front (one forward of a micro-batch on every rank), so no shape inference crosses ranks. The schedule
runs inside a "schedule" phase (compute, its blocking receives the bubble) with a "forward" phase per
micro-batch from a forward hook on the stage. Loss: the mean over each micro-batch, gradients scaled by
1/micro-batches (the schedule's scale_grads), so a step equals `single`'s. One replica only (--dp 1). The
first step also carries torch's exchange of the stages' tensor metadata (a few bytes each way): warm-up.
Exercised by: `pytest tests/test_pipeline.py -k torch_pipeline`.
"""

from __future__ import annotations

import torch
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from commprof.base.errors import UsageError
from commprof.intercept import interpose
from commprof.parallel.schedule import one_f_one_b
from commprof.strategies.base import StepResult, loss_fn
from commprof.strategies.pipeline import PipelineGPipe


class TorchPipelineGPipe(PipelineGPipe):
    """torch.distributed.pipelining's ScheduleGPipe, one stage per rank."""

    name = "torch-pipeline-gpipe"
    backends = ("gloo", "nccl")
    torch_schedule = ScheduleGPipe

    def setup(self) -> None:
        super().setup()
        if self.grid.dp > 1:
            raise UsageError(f"strategy {self.name} runs one pipeline: --dp 1")
        if self.starts is None:
            raise UsageError(f"strategy {self.name} cuts by parameters or --cuts, not --balance time")
        pp = self.grid.inner_comm
        interpose.ensure(self.comm).adopt(pp, group=pp._group)
        self._pipe = None
        self._phases = None
        self._forward = None
        self.stage_module.register_forward_pre_hook(self._forward_begins)
        self.stage_module.register_forward_hook(self._forward_ends)

    def _forward_begins(self, module, args) -> None:
        if self._phases is not None:
            self._forward = self._phases.phase("forward")
            self._forward.__enter__()

    def _forward_ends(self, module, args, output) -> None:
        if self._forward is not None:
            forward, self._forward = self._forward, None
            forward.__exit__(None, None, None)

    def _build(self, x: torch.Tensor, m: int):
        shapes = self._plan(x)
        s = self.stage
        inp = x if s == 0 else torch.empty(shapes[s - 1][0], dtype=shapes[s - 1][1])
        out = None if self.last else torch.empty(shapes[s][0], dtype=shapes[s][1])
        stage = PipelineStage(self.stage_module, s, self.stages, self.device, input_args=(inp.to(self.device),),
                              output_args=out.to(self.device) if out is not None else None,
                              group=self.grid.inner_comm._group)
        task = self.spec.task
        return self.torch_schedule(stage, m, loss_fn=lambda output, target: loss_fn(task, output, target))

    def train_step(self, micro_batches, phases, *, measure_memory: bool = False) -> StepResult:
        m = self.m = len(micro_batches)
        if self._pipe is None:
            self._pipe = self._build(micro_batches[0][0], m)
        x = torch.cat([mb[0] for mb in micro_batches])
        y = torch.cat([mb[1] for mb in micro_batches])
        losses: list = []
        self._phases = phases
        try:
            with phases.phase("schedule"):
                if self.stage == 0:
                    self._pipe.step(x)
                elif self.last:
                    self._pipe.step(target=y, losses=losses)
                else:
                    self._pipe.step()
        finally:
            self._phases = None
        held = self.optimizer_step(phases, measure_memory)
        loss = sum(float(v.detach()) for v in losses) / m if self.last else float("nan")
        return StepResult(loss, held)

    def predict(self) -> dict[str, int]:
        """Activations forward and their gradients back over each boundary, per micro-batch, all in the pp group."""
        s, m, out = self.stage, self.m, {"send (pp)": 0, "recv (pp)": 0}
        if s < self.stages - 1:
            out["send (pp)"] += m * self._boundary_bytes(s)
            out["recv (pp)"] += m * self._boundary_bytes(s)
        if s > 0:
            out["recv (pp)"] += m * self._boundary_bytes(s - 1)
            out["send (pp)"] += m * self._boundary_bytes(s - 1)
        return out

    def group_sizes(self) -> dict[str, int]:
        return {"world": self.world_size, "pp": self.stages}


class TorchPipeline1F1B(TorchPipelineGPipe):
    """torch.distributed.pipelining's Schedule1F1B."""

    name = "torch-pipeline-1f1b"
    torch_schedule = Schedule1F1B
    schedule = staticmethod(one_f_one_b)
