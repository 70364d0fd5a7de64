"""The one door to the network: choose a backend, rendezvous, and hand out a `Comm`.

    comm = init_comm(world, backend="gloo", timeout_s=60)
    comm.all_reduce(tensor)            # timed, counted, NVTX-wrapped

Backends: gloo and nccl through torch.distributed, mpi through mpi4py. Exercised by:
`pytest tests/test_comm.py`.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from contextlib import contextmanager
from typing import NoReturn

import torch

from commprof.base import job
from commprof.base.backends import BACKENDS, YIELD_ENV, default_backend, free_port, require_cuda, slots, unsupported
from commprof.base.errors import PeerError, PeerTimeoutError, UsageError
from commprof.base.world import World
from commprof.comm import gloo_comm, mpi_comm
from commprof.comm.base import Comm
from commprof.comm.failure.control import ControlPlane
from commprof.comm.handle import Handle
from commprof.comm.joining import Joining
from commprof.record.clock import CpuClock, CudaClock

__all__ = ["Comm", "Handle", "BACKENDS", "YIELD_ENV", "default_backend", "unsupported", "init_comm",
           "slots", "free_port", "require_cuda", "end_process", "joined", "at_end", "run_at_end"]

_AT_END: list = []
"""What a rank does last at a clean end, after its results are gathered and written (at_end)."""


def at_end(fn) -> None:
    """Call `fn()` as this process ends well (end_process with code 0), after everything else: a live
    endpoint kept up for a last scrape (--live-linger) must not hold the job's last gather back."""
    _AT_END.append(fn)


def run_at_end() -> None:
    """The at_end calls, once, in order."""
    while _AT_END:
        try:
            _AT_END.pop(0)()
        except Exception:  # the results are written: what is left must not change the exit
            pass


def init_comm(world: World, *, backend: str, timeout_s: float, oversubscribed: bool = False,
              device: str | None = None) -> Comm:
    """Join the job described by `world` on `backend` and return the world Comm, with its control plane
    (a multi-rank job) and this rank's injected faults (COMMPROF_FAULT) attached. `device`: where its
    tensors live (backends.device); None: cuda for nccl, cpu otherwise."""
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}: choose from {', '.join(BACKENDS)}")
    joining = Joining(world, timeout_s=timeout_s)
    joining.check_in()
    if backend == "mpi":
        comm = joining.meet(lambda _: _init_mpi(world, oversubscribed, timeout_s), what="MPI_Init")
    else:
        device = device or ("cuda" if backend == "nccl" else "cpu")
        comm = joining.meet(lambda _: _init_torch(world, backend, timeout_s, device))  # its Comm opens the store
    comm.fault = joining.fault
    _OPENED.append(backend)
    return comm


_OPENED: list[str] = []
"""The backends this process has joined a job on (init_comm): such a process ends through end_process."""


def end_process(code: int | None) -> NoReturn:
    """End a process that has joined a job, skipping the interpreter's finalization — after its Comm is
    closed and its files are written. Why: torch keeps gloo's process group alive past
    destroy_process_group once it has imported torch._dynamo (torch.optim does), so gloo's worker threads
    outlive the script; one that frees a finished work during finalization must take the GIL to free the
    work's Python tensors, and a thread that takes the GIL then is ended by pthread_exit, which
    std::terminate turns into "terminate called without an active exception" (seen as SIGABRT in 2 of 40
    runs of tests/strategy_worker.py at 3 ranks). stdout and stderr are flushed and MPI finalized first,
    as the interpreter's exit would have, and at a clean end a profiling tool's CUDA records too (a failing
    rank may be stuck in a kernel: it waits for none)."""
    job.note_exit(code if isinstance(code, int) else 1)
    try:
        if code in (None, 0):
            _flush_cuda_profiling()
            run_at_end()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more to say
                pass
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()
    finally:  # whatever Finalize raises, never the interpreter's exit
        os._exit(0 if code is None else code if isinstance(code, int) else 1)


def _flush_cuda_profiling() -> None:
    """Hand a CUDA profiling tool (Nsight Systems) the records it still buffers: CUPTI flushes its activity
    buffers at the process's normal end, which os._exit skips — run on an H200 under nsys, the ranks'
    NVTX ranges were in the report and not one of their CUDA kernels. cudaProfilerStop flushes them, as
    NVIDIA's guide asks of processes that end otherwise; with no tool attached it does nothing."""
    cuda = sys.modules.get("torch.cuda")
    if cuda is None or not cuda.is_initialized():
        return
    try:
        cuda.synchronize()
        cuda.cudart().cudaProfilerStop()
    except Exception:  # a failed device is no reason to end the process otherwise
        pass


def join(what: str) -> None:
    """Mark this process as one rank of a job whose process group is not commprof's own (a profiled
    script's): it ends through end_process too."""
    _OPENED.append(what)


def joined() -> bool:
    """Whether this process has joined a job (and must end through end_process)."""
    return bool(_OPENED)


def require_torch_cuda() -> None:
    """The rank's own check: the driver may see a GPU this torch cannot use (a CPU build, an old driver)."""
    if not torch.cuda.is_available():
        raise UsageError("CUDA tensors (backend nccl, --device cuda) need a GPU that torch can use and none is; "
                         "use --backend gloo or mpi with --device cpu")


def _init_torch(world: World, backend: str, timeout_s: float, device: str) -> Comm:
    if device == "cuda":  # nccl, or gloo moving CUDA tensors (ranks may share a GPU)
        require_torch_cuda()
        device = torch.device("cuda", world.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        clock = CudaClock()
    else:
        device, clock = torch.device("cpu"), CpuClock()
    addr, port = rendezvous_address(world)
    try:
        with _held_stderr():
            comm = gloo_comm.comm_class(backend).init(backend=backend, rank=world.rank, world_size=world.world_size,
                                                      addr=addr, port=port, timeout_s=timeout_s, device=device,
                                                      clock=clock)
            if world.world_size > 1:  # a second client of the rendezvous store, for the watchdog thread alone
                comm.control = ControlPlane.connect(host=addr, port=port, rank=world.rank,
                                                    world_size=world.world_size, within_s=timeout_s)
    except (RuntimeError, ValueError) as exc:  # DistStoreError and friends: peers never arrived
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        stopped = job.stopped_sibling(os.getpid())
        if stopped is not None:  # a peer beside it stopped before its own guard began: it is the cause
            error = PeerError(f"rank {stopped[1]} was stopped (SIGSTOP) during start-up and did not resume within "
                              f"{timeout_s:g} s (--timeout)")
            # killed once the line is said (cli.call): a launcher's SIGTERM never reaches it (torchrun's grace
            # is 30 s), and a launcher seeing it die first would end this rank before it speaks
            error.kill_after = stopped[0]
            raise error from None
        raise PeerTimeoutError(f"rank {world.rank}: rendezvous at {addr}:{port} with {world.world_size} ranks "
                               f"failed within {timeout_s:g} s (--timeout): {first}") from None
    comm.timeout_s = timeout_s
    return comm


@contextmanager
def _held_stderr():
    """This process's stderr held in a file for the block: c10d logs a failed rendezvous with a C++ stack, at
    the ERROR level that TORCH_CPP_LOG_LEVEL=ERROR still shows. Written out when the block ends well; left
    out when it raises, where the rank's one line says what happened."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        text = held.read()
        if text:
            os.write(2, text)


def _mpi_control(world: World, timeout_s: float) -> ControlPlane:
    """Rank 0 serves a store; the others learn where over MPI."""
    MPI = import_mpi()
    if world.rank == 0:
        host = world.master_addr or _own_address(world)
        control = ControlPlane.connect(host=host, port=0, rank=0, world_size=world.world_size, serve=True,
                                       within_s=timeout_s)
        where = (host, control.port)
    else:
        control, where = None, None
    host, port = MPI.COMM_WORLD.bcast(where, root=0)
    if control is None:
        control = ControlPlane.connect(host=host, port=port, rank=world.rank, world_size=world.world_size,
                                       within_s=timeout_s)
    return control


MPI_THREAD_LEVEL = "funneled"
"""The thread level commprof initialises MPI with: only the main thread calls MPI (the watchdog and the
trace speak over the control plane), and MPICH locks every call only under `multiple` — mpi4py's own
default, ~2–3 µs a call with MPICH here. MPI4PY_RC_THREAD_LEVEL=multiple (mpi4py's variable)
chooses another, for a script that calls MPI from its own threads; the env block records the level."""


def import_mpi():
    """mpi4py's MPI module — initialising MPI at MPI_THREAD_LEVEL unless MPI4PY_RC_THREAD_LEVEL says
    otherwise — or a clear error when no MPI library can be loaded."""
    try:
        import mpi4py

        if "MPI4PY_RC_THREAD_LEVEL" not in os.environ:
            mpi4py.rc.thread_level = MPI_THREAD_LEVEL  # read by the first import of mpi4py.MPI
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        raise UsageError(f"no usable MPI library ({str(exc).splitlines()[0]}): install one, e.g. "
                         "pip install 'commprof[mpich]'") from None
    job.note_shared_memory()  # MPI_Init has mapped the job's intranode segment: the launcher removes it after
    return MPI


LOOPBACK_ENV = {"UCX_NET_DEVICES": "lo", "FI_TCP_IFACE": "lo", "FI_SOCKETS_IFACE": "lo"}
"""A job on one host: the MPI library's network transports on loopback (UCX, libfabric's tcp and sockets
providers listen on the host's own address otherwise), read by MPI_Init; a user's own setting wins. Hydra's
control port is its own: it binds every interface and has no setting (docs/failures.md)."""


def _loopback_transports() -> None:
    for key, value in LOOPBACK_ENV.items():
        os.environ.setdefault(key, value)


def _init_mpi(world: World, oversubscribed: bool, timeout_s: float) -> Comm:
    if world.local_world_size >= world.world_size:
        _loopback_transports()
    if oversubscribed:
        for key, value in YIELD_ENV.items():
            os.environ.setdefault(key, value)  # read by MPI_Init, which the import below runs
    MPI = import_mpi()
    size = MPI.COMM_WORLD.Get_size()
    if size != world.world_size:
        raise UsageError(f"backend mpi needs ranks started by mpiexec (MPI sees {size} rank(s), "
                         f"the launcher {world.world_size}); use --nproc N or mpiexec -n N")
    if size > 1:  # every rank maps MPICH's intranode segment once all have passed here: its name can go
        MPI.COMM_WORLD.Barrier()
        job.unlink_shared_memory()
    comm = mpi_comm.MpiComm(comm=MPI.COMM_WORLD, clock=CpuClock())
    comm.timeout_s = timeout_s
    if world.world_size > 1:
        comm.control = _mpi_control(world, timeout_s)
    return comm


def _own_address(world: World) -> str:
    """The address rank 0 serves the store on when the launcher named none: loopback for a job on one host
    (nothing off the host may reach it), the host's own address otherwise."""
    if world.local_world_size >= world.world_size:
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


def rendezvous_address(world: World) -> tuple[str, int]:
    """Address and port of rank 0's store: the launcher's, or one rank 0 picks (under mpiexec, told to the
    others over MPI). `commprof profile` gives it to a script's env:// rendezvous."""
    if world.master_addr and world.master_port:
        return world.master_addr, world.master_port
    if world.world_size == 1:
        return "127.0.0.1", free_port()
    if world.launcher == "mpiexec":
        # mpiexec gives ranks but no rendezvous: rank 0 picks one and tells the others over MPI.
        MPI = import_mpi()
        here = (_own_address(world), free_port()) if world.rank == 0 else None
        return MPI.COMM_WORLD.bcast(here, root=0)
    raise UsageError(f"{world.launcher} gave no rendezvous: set MASTER_ADDR and MASTER_PORT")
