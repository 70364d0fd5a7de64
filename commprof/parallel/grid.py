"""The 2-D rank grid of hybrid parallelism: data-parallel replicas × model-parallel ranks per replica.

    commprof run --strategy pipeline-1f1b --model gpt2-tiny --nproc 4 --dp 2 --pp 2

Rank r sits at replica r // inner and model-parallel position r % inner (the model-parallel group is
contiguous, as in Megatron-LM, so on a multi-GPU host it stays on one node). Every rank builds every
group in the same order, which torch.distributed and MPI both require.
Exercised by: `pytest tests/test_pipeline.py tests/test_tensor.py -k hybrid`.
"""

from __future__ import annotations

from dataclasses import dataclass

from commprof.base.errors import UsageError
from commprof.parallel.sizes import tensor_bytes


@dataclass(frozen=True)
class Grid:
    """This rank's place on the grid and the Comms of its two groups."""

    dp: int
    """Data-parallel replicas."""
    inner: int
    """Model-parallel ranks per replica (pipeline stages or tensor-parallel degree)."""
    dp_index: int
    """Which replica this rank belongs to: its shard of the global batch."""
    inner_index: int
    """Position inside the replica: pipeline stage or tensor-parallel rank."""
    dp_comm: object
    """Comm over the ranks at the same position in every replica (label "dp"); None when dp == 1."""
    inner_comm: object
    """Comm over this replica's model-parallel ranks (label "pp" or "tp")."""


def degrees(world_size: int, *, dp: int | None, inner: int | None, flag: str) -> tuple[int, int]:
    """(dp, inner) from the flags given: the missing one fills the world; their product must equal it."""
    if inner is None:
        inner = world_size // dp if dp else world_size
    if dp is None:
        dp = world_size // inner if inner and world_size % inner == 0 else 0
    if inner < 1 or dp < 1 or dp * inner != world_size:
        raise UsageError(f"--dp {dp or '?'} × {flag} {inner} must equal the {world_size} ranks of the run")
    return dp, inner


def build_grid(comm, *, dp: int, inner: int, label: str) -> Grid:
    """Create both groups of every replica and position on `comm` (all ranks call this)."""
    dp_comm = inner_comm = None
    for d in range(dp):
        group = comm.new_group([d * inner + j for j in range(inner)], label=label)
        inner_comm = group or inner_comm
    if dp > 1:
        for j in range(inner):
            group = comm.new_group([d * inner + j for d in range(dp)], label="dp")
            dp_comm = group or dp_comm
    return Grid(dp=dp, inner=inner, dp_index=comm.rank // inner, inner_index=comm.rank % inner,
                dp_comm=dp_comm, inner_comm=inner_comm)


def average_gradients(dp_comm, params, buffer_holder: dict) -> None:
    """One flat all_reduce of `params`' gradients over the replicas, then divide by their number
    (a parameter with no gradient this step contributes zeros, so every replica sends the same bytes)."""
    if dp_comm is None or not params:
        return
    flat = buffer_holder.get("flat")
    if flat is None:
        total = sum(p.numel() for p in params)
        flat = buffer_holder["flat"] = params[0].new_zeros(total)
    offset = 0
    for p in params:
        n = p.numel()
        if p.grad is None:
            flat[offset:offset + n].zero_()
        else:
            flat[offset:offset + n].copy_(p.grad.reshape(-1))
        offset += n
    dp_comm.all_reduce(flat)
    flat.div_(dp_comm.world_size)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n


def replica_volume(dp_comm, params) -> dict[str, int]:
    """Predicted bytes per step outside the model-parallel group: the replicas' gradient all_reduce
    (average_gradients)."""
    return {"all_reduce (dp)": tensor_bytes(params)} if dp_comm is not None and params else {}
