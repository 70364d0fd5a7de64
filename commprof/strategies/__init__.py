"""Training strategies, one file each, built only on Comm; CATALOG is the list `--strategy` takes.

CATALOG names each strategy's module and class and what the launcher checks before any rank starts
(the backends it runs on, whether it splits the model), so checking a command line loads no strategy
and no torch; `STRATEGIES` (name -> class) loads them all when first asked for, as the ranks do.
tests/unit/test_strategy_catalog.py checks that every entry agrees with its class. Exercised by:
`pytest tests/unit/test_strategy_catalog.py tests/test_strategies.py`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["CATALOG", "STRATEGIES", "StrategyEntry"]


@dataclass(frozen=True)
class StrategyEntry:
    """One --strategy, before its module is loaded."""

    module: str
    """Its module under commprof.strategies."""
    cls: str
    """Its class there."""
    backends: tuple[str, ...] = ("gloo", "nccl", "mpi")
    """The --backend values it runs on (the class's `backends`)."""
    model_parallel: str | None = None
    """"pp" or "tp" for strategies that split the model (the class's `model_parallel`)."""

    def load(self) -> type:
        return getattr(importlib.import_module(f"{__name__}.{self.module}"), self.cls)


CATALOG: dict[str, StrategyEntry] = {
    "single": StrategyEntry("single", "Single"),
    "naive-dp": StrategyEntry("naive_dp", "NaiveDP"),
    "ddp": StrategyEntry("ddp", "DDP"),
    "zero1": StrategyEntry("zero1", "Zero1"),
    "zero2": StrategyEntry("zero2", "Zero2"),
    "fsdp": StrategyEntry("fsdp", "FSDP"),
    "mpi-dp": StrategyEntry("mpi_dp", "MpiDP", backends=("mpi",)),
    "pipeline-gpipe": StrategyEntry("pipeline", "PipelineGPipe", model_parallel="pp"),
    "pipeline-1f1b": StrategyEntry("pipeline", "Pipeline1F1B", model_parallel="pp"),
    "tensor": StrategyEntry("tensor", "TensorParallel", model_parallel="tp"),
    "torch-ddp": StrategyEntry("torch_native", "TorchDDP", backends=("gloo", "nccl")),
    "torch-fsdp": StrategyEntry("torch_native", "TorchFSDP", backends=("gloo", "nccl")),
    "torch-pipeline-gpipe": StrategyEntry("torch_pipeline", "TorchPipelineGPipe", backends=("gloo", "nccl"),
                                          model_parallel="pp"),
    "torch-pipeline-1f1b": StrategyEntry("torch_pipeline", "TorchPipeline1F1B", backends=("gloo", "nccl"),
                                         model_parallel="pp"),
}


def __getattr__(name: str):
    if name == "STRATEGIES":  # name -> class, every strategy loaded (and torch with them), once
        loaded = globals()["STRATEGIES"] = {key: entry.load() for key, entry in CATALOG.items()}
        return loaded
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
