"""commprof: a low-level communication profiler for distributed deep-learning training.

`commprof bench` sweeps one collective at a time over sizes, dtypes and ranks (nccl-tests semantics)
on gloo, NCCL or MPI (mpi4py). Every byte that crosses ranks goes through `commprof.comm`.
"""

__version__ = "0.1.0"
