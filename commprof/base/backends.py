"""What each backend can run, named before any rank starts and without loading torch or MPI: the
launcher checks a command line against this, then starts ranks that load them (seconds each).

  BACKENDS, DTYPES, ALIASES, REDUCE_OPS    the names --backend, -d and -o take
  unsupported(...)                          why a backend cannot run a collective with a dtype, op, mode
  cuda_devices(), default_backend(), slots()  the GPUs the CUDA driver sees, asked of the driver itself
  device(backend, asked)                    where a job's tensors live (--device): cuda for nccl, cpu else

commprof/comm/ maps these names to torch dtypes and process groups. Exercised by: `pytest
tests/test_startup.py tests/test_bench_cli.py`.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import re
import socket
from pathlib import Path

from commprof.base.errors import UsageError
from commprof.base.measurement import COLLECTIVES
from commprof.base.world import usable_cores

BACKENDS = ("gloo", "nccl", "mpi")

DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8")
"""Element types by torch's names, in the order `-d all` sweeps them."""
FLOATING = frozenset({"float32", "float16", "bfloat16", "float64"})
ALIASES = {"float": "float32", "half": "float16", "double": "float64", "bf16": "bfloat16",
           "fp32": "float32", "fp16": "float16", "fp64": "float64"}
"""nccl-tests' and common short names, accepted for the torch ones."""
NCCL_TESTS_ONLY_DTYPES = {
    **{u: f"torch's {u} has no arithmetic on the CPU and no collective in commprof bench: use "
          f"int{u[4:]} (the same bytes on the wire)" for u in ("uint32", "uint64")},
    **{f: "fp8 has no torch.distributed collective in commprof bench: use bfloat16 or float16"
       for f in ("fp8_e4m3", "fp8_e5m2")}}
"""nccl-tests' -d names with no dtype here, and why."""
REDUCE_OPS = ("sum", "prod", "min", "max", "avg")
DEVICES = ("cpu", "cuda")
"""Where a job's tensors live (--device): gloo moves either; nccl CUDA tensors only; commprof's MPI path
host buffers only."""

REDUCING = frozenset(name for name, model in COLLECTIVES.items() if model.reduces)
# What each library's API offers (commprof adds no copies to fake a mode it lacks).
_NO_OUT_OF_PLACE = {"torch.distributed": {"all_reduce", "broadcast", "reduce"},
                    "MPI": {"broadcast"}}
_NO_IN_PLACE = {"torch.distributed": {"all_to_all", "sendrecv"}, "MPI": {"sendrecv"}}

YIELD_ENV = {
    "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1",
    "MPIR_CVAR_POLLS_BEFORE_YIELD": "1",
    "OMPI_MCA_mpi_yield_when_idle": "1",
}
"""Environment that makes an MPI library yield the core while it waits instead of spinning, for when
ranks outnumber cores: MPICH sleeps between idle polls, Open MPI yields when idle."""


def parse_dtypes(spec: str) -> list[str]:
    """'float32,int8' or 'all' -> dtype names, in the order given, each once (float,float32 is one)."""
    if spec == "all":
        return list(DTYPES)
    out = []
    for raw in spec.split(","):
        name = ALIASES.get(raw.strip(), raw.strip())
        if name in NCCL_TESTS_ONLY_DTYPES:
            raise UsageError(f"dtype {name}: {NCCL_TESTS_ONLY_DTYPES[name]}")
        if name not in DTYPES:
            raise UsageError(f"unknown dtype {raw!r}: choose from {', '.join(DTYPES)} or all")
        out.append(name)
    return list(dict.fromkeys(out))


def parse_ops(spec: str) -> list[str]:
    """'sum,max' or 'all' -> reduce op names, in the order given, each once."""
    if spec == "all":
        return list(REDUCE_OPS)
    ops = [op.strip() for op in spec.split(",")]
    for op in ops:
        if op == "mulsum":
            raise UsageError("reduce op mulsum: nccl-tests' mulsum is NCCL's PREMUL_SUM, which torch.distributed "
                             "runs on NCCL alone and commprof bench does not: use sum, prod, min, max or avg")
        if op not in REDUCE_OPS:
            raise UsageError(f"unknown reduce op {op!r}: choose from {', '.join(REDUCE_OPS)} or all")
    return list(dict.fromkeys(ops))


def unsupported(backend: str, collective: str, dtype: str, op: str | None, inplace: bool) -> str | None:
    """Why `backend` cannot run `collective` with this dtype (a name), op and mode, or None when it can."""
    library = "MPI" if backend == "mpi" else "torch.distributed"
    if not inplace and collective in _NO_OUT_OF_PLACE[library]:
        return f"{library} has no out-of-place {collective}"
    if inplace and collective in _NO_IN_PLACE[library]:
        return f"{library} has no in-place {collective}" + (" in commprof" if library == "MPI" else "")
    if collective in REDUCING and backend == "mpi":
        if op == "avg":
            return "MPI has no avg reduce op"
        if dtype == "bfloat16":
            return "MPI has no bfloat16 reductions"
    if collective in REDUCING and backend == "gloo" and op == "avg" and dtype not in FLOATING:
        return f"gloo has no avg reduction for {dtype}"
    return None


@functools.cache
def cuda_devices() -> int:
    """GPUs torch could use here, decided without loading torch: the ones the CUDA driver sees
    (CUDA_VISIBLE_DEVICES applied, asked of libcuda), when the installed torch is a CUDA build whose major
    CUDA version the driver supports. 0 without a driver, a GPU or a CUDA build of torch. The ranks check
    again with torch itself (comm.require_torch_cuda)."""
    built = _torch_cuda_major()
    if built is None:
        return 0
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count, version = ctypes.c_int(0), ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return 0
    if version.value // 1000 < built or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def _torch_cuda_major() -> int | None:
    """The CUDA major version the installed torch was built for (torch/version.py's `cuda`), read as
    text: finding a top-level package does not import it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return None
    found = re.search(r"^cuda\b[^=]*=\s*['\"](\d+)\.", text, re.M)
    return int(found.group(1)) if found else None


def default_backend() -> str:
    """nccl when CUDA sees a GPU, else gloo."""
    return "nccl" if cuda_devices() else "gloo"


def slots(backend: str) -> int:
    """How many ranks one host can run without sharing: GPUs for nccl, usable cores otherwise."""
    return cuda_devices() if backend == "nccl" else usable_cores()


def device(backend: str, asked: str | None) -> str:
    """--device for `backend`: `asked`, or cuda for nccl and cpu otherwise; one line where they cannot go
    together or no GPU is visible."""
    if asked is None:
        return "cuda" if backend == "nccl" else "cpu"
    if backend == "nccl" and asked != "cuda":
        raise UsageError("backend nccl moves CUDA tensors only: drop --device cpu, or use --backend gloo")
    if backend == "mpi" and asked == "cuda":
        raise UsageError("--device cuda needs --backend gloo or nccl: commprof passes MPI host buffers only")
    if asked == "cuda" and not cuda_devices():
        raise UsageError("--device cuda needs a CUDA GPU and none is visible; use --device cpu")
    return asked


def require_cuda() -> None:
    """NCCL needs a GPU: say so before any rank starts."""
    if not cuda_devices():
        raise UsageError("backend nccl needs a CUDA GPU and none is visible; use --backend gloo or mpi")


_HELD: dict[int, socket.socket] = {}
"""Ports free_port() handed out, each still bound by a socket of this process (see free_port)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that stays free for the job it is for: a socket of this process keeps it bound,
    not listening, with SO_REUSEADDR, until release_port(port) or this process's exit. Rank 0's store binds it
    beside that socket (SO_REUSEADDR too), while every other bind(0) and connect() on the host passes it by:
    a port merely free a moment ago could be taken, before rank 0 binds it, by another job's gloo listener
    or client socket (several jobs at once on one host)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    _HELD[port] = s
    return port


def release_port(port: int) -> None:
    """Let go of a port free_port() holds (nothing if it holds none)."""
    held = _HELD.pop(port, None)
    if held is not None:
        held.close()
