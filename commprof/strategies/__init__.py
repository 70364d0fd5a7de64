"""Training strategies, one file each, built only on Comm; this dict is the list `--strategy` takes.

Exercised by: `pytest tests/test_strategies.py`.
"""

from __future__ import annotations

from commprof.strategies.ddp import DDP
from commprof.strategies.fsdp import FSDP
from commprof.strategies.mpi_dp import MpiDP
from commprof.strategies.naive_dp import NaiveDP
from commprof.strategies.pipeline import Pipeline1F1B, PipelineGPipe
from commprof.strategies.single import Single
from commprof.strategies.tensor import TensorParallel
from commprof.strategies.zero1 import Zero1
from commprof.strategies.zero2 import Zero2

STRATEGIES = {cls.name: cls for cls in (Single, NaiveDP, DDP, Zero1, Zero2, FSDP, MpiDP, PipelineGPipe,
                                        Pipeline1F1B, TensorParallel)}
