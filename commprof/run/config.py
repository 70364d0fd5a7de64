"""The configuration of one `commprof run`, built by the CLI and read everywhere below it.

Exercised by: `pytest tests/test_run_cli.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from commprof.base.flags import JobConfig

if TYPE_CHECKING:
    from commprof.live.config import LiveConfig
from commprof.perfmodel.fabric import Fabric


@dataclass(frozen=True)
class RunConfig(JobConfig):
    strategy: str
    """Key of commprof.strategies.CATALOG (`commprof run --help` lists them): commprof's own, built on Comm
    (single, naive-dp, ddp, zero1, zero2, fsdp, mpi-dp, pipeline-gpipe, pipeline-1f1b, tensor), and PyTorch's,
    profiled as they are (torch-ddp, torch-fsdp, torch-pipeline-gpipe, torch-pipeline-1f1b)."""
    model: str
    """Key of commprof.models.MODELS."""
    device: str = "cpu"
    """Where the tensors live (--device): cuda for nccl; gloo moves either, so ranks can share one GPU."""
    data: str = "synthetic"
    """synthetic, mnist, cifar10, cifar100 or text."""
    data_dir: str | None = None
    """Where real data files are (a text file's path for `text`)."""
    batch_size: int = 32
    """Samples per rank per step (all micro-batches together); the global batch is this × ranks."""
    steps: int | None = None
    """Optimizer steps to run (warm-up included); None: --epochs decides."""
    epochs: int | None = None
    """Whole passes over the data; used when `steps` is None."""
    warmup: int = 2
    """Steps run before measuring; their times are not in the summary."""
    seed: int = 0
    """Seeds the model's initial weights and the data order: same seed, same run."""
    lr: float = 0.01
    """Learning rate."""
    optimizer: str = "sgd"
    """sgd (momentum 0.9) or adam."""
    bucket_mb: float = 25.0
    """Gradient bucket size in MiB (ddp; mpi-dp's fusion threshold when given)."""
    bucket_mb_given: bool = False
    """Whether --bucket-mb was given (mpi-dp defaults to Horovod's 64 MiB otherwise)."""
    precision: str = "fp32"
    """fp32, bf16 (autocast) or fp16 (autocast + dynamic loss scaling)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; gradients are communicated once per step (fsdp: per micro-batch)."""
    checkpoint: bool = False
    """Activation checkpointing: recompute each unit's activations in backward."""
    prefetch: bool = True
    """fsdp: issue the next unit's all_gather while the current one computes."""
    dp: int | None = None
    """Model-parallel strategies: data-parallel replicas (default: ranks / --stages or --tp)."""
    pp: int | None = None
    """Pipeline stages, one rank each (default: ranks / --dp)."""
    tp: int | None = None
    """Tensor-parallel degree (default: ranks / --dp)."""
    micro_batches: int = 4
    """Pipelines: micro-batches each replica's batch is split into."""
    balance: str = "params"
    """Pipelines: cut the layer chain to equalise "params" or measured "time" per stage."""
    cuts: tuple[int, ...] | None = None
    """Pipelines: explicit first layer of stages 1…p−1 (overrides --balance)."""
    frozen_backbone: bool = False
    """Torchvision models: frozen random backbone + trainable width-width-classes head."""
    head_width: int = 4096
    """Width of the frozen-backbone head's two hidden layers."""
    num_classes: int | None = None
    """Classes of the classifier (default: the data's)."""
    image_size: int | None = None
    """Input height = width (default: the data's, or 28 for mnist-cnn and 32 otherwise)."""
    in_channels: int | None = None
    """Input channels (default: the data's, or 1 for mnist-cnn and 3 otherwise)."""
    seq_len: int = 64
    """Tokens per text sample."""
    samples: int | None = None
    """Synthetic data set size (default: the source's)."""
    loss_threshold: float | None = None
    """Report the first step whose loss (mean over ranks) is at or below this."""
    eval_samples: int = 1000
    """Held-out samples to measure accuracy on after training (0: none)."""
    save_state: str | None = None
    """Write the final full model state_dict here (rank 0)."""
    link: Fabric | None = None
    """The link the ops cross (--link-rate: a rate, a fabric spec or a bench JSON): the findings name the ops
    below half of its rate."""
    torch_profiler: str | None = None
    """Also capture a PyTorch profiler (Kineto) trace per rank into this directory, for Holistic Trace
    Analysis (--torch-profiler)."""
    live: LiveConfig | None = None
    """--live: windows of steps exported while the job runs (docs/live.md); None: the figures at the end only."""
