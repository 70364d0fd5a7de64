"""commprof: a low-level communication profiler for distributed deep-learning training.

`commprof bench` sweeps one collective at a time over sizes, dtypes and ranks (nccl-tests semantics)
on gloo, NCCL or MPI (mpi4py); `commprof run` trains with one strategy and splits every iteration into
computation and communication. Every byte that crosses ranks goes through `commprof.comm`.

A script run under `commprof profile` may mark its own iterations and phases: `commprof.step()`,
`with commprof.phase("forward"): …` (commprof/record/hooks.py).

Layers, lowest first, one folder each (or two beside each other); a module imports from its own layer or
lower ones only. This list is the one source: tests/unit/test_layout.py reads it, checks the folders against
it and docs/design.md's table against it.

  base/                             what a job is, what every figure means and its statistics, what each
                                    backend can run (named before any rank loads torch), the flags every
                                    job takes, atomic files and units; a start-up deadline that needs no
                                    interpreter; a failing rank's last words through its pipes
  report/                           tables, the env block, plots, comparisons, `commprof report`
  record/                           clocks, the op log, phases (aligned ones too), volume, NVTX, traces
  comm/                             the only door to the network; comm/failure/: how a job fails (the
                                    watchdog, the control plane, the flight record, injected faults)
  intercept/                        what commprof puts into a profiled script's process, as one: its
                                    groups' backends, DDP's reducer, functional collectives,
                                    torch.distributed's names, opaque to torch.compile
  data/, models/                    what is trained
  parallel/                         grids, partitions, flat buffers, precision, schedules
  strategies/, kernels/             training strategies and collective algorithms, on Comm
  perfmodel/                        the models below every analysis: α–β fits, fabrics, a traced
                                    iteration as a program, its replay at N ranks
  findings/, live/                  what made a traced job wait, ranked by what it costs a step; the same
                                    while a job runs, window by window, to Prometheus
  launcher/                         a local MPI job's own network; the launcher, and the process gloo's
                                    ranks are forked from; the job's life cycle every command runs
                                    through; rank 0's results kept as the job goes
  bench/, run/, profile/, predict/  the commands: a config, one rank's work, rank 0's report; predict: a
                                    traced iteration replayed at N ranks
  cli/, __main__                    the command line; grids of whole jobs; Nsight Systems around a job
"""

__version__ = "0.1.0"


def step() -> None:
    """End an iteration here, in a script run under `commprof profile`; nothing otherwise."""
    from commprof.record import hooks

    hooks.step()


def phase(name: str):
    """`with commprof.phase("forward"):` times the block as that phase under `commprof profile`; nothing
    otherwise."""
    from commprof.record import hooks

    return hooks.phase(name)
