"""`commprof nsys [--output DIR] -- <bench|run> …`: the Nsight Systems command for a commprof job, printed,
and run where `nsys` is installed.

    commprof nsys -- run --strategy ddp --nproc 2 --steps 20
    commprof nsys --output prof -- bench all_reduce --backend mpi --nproc 4

One report per rank (DIR/rank<r>.nsys-rep): commprof's own launcher (--nproc) puts `nsys profile` in
front of each rank's command (COMMPROF_RANK_WRAPPER); under torchrun/mpiexec/srun give the printed
`nsys profile …` prefix to each rank yourself. Traces: cuda, nvtx, osrt (--trace to change; commprof's
NVTX ranges already name every MPI call, and Nsight Systems 2023.4's MPI interposer crashed MPICH 5
ranks, so `mpi` is opt-in: --trace cuda,nvtx,osrt,mpi). Capture: only the measured part — the NVTX
range `measured` in domain `commprof` (the iterations after --warmup for `run`, the whole sweep for
`bench`). Beside each thread's push/pop ranges, every op is an in-flight range from issue to completion on
its group's own row, domain `commprof comm (<group>)` (`nvtx_sum` style StartEnd). Exercised by:
`pytest tests/test_nsys.py` (with the real nsys: tools/install_nsys.sh).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys

from commprof.base.errors import UsageError
from commprof.launcher.launch import find_mpiexec

CAPTURE = "measured@commprof"
"""The NVTX range (message@domain) Nsight starts and stops the capture on."""

TRACES = "cuda,nvtx,osrt"
"""What nsys traces by default: kernels and copies, commprof's ranges, and the OS calls it blocks in."""


INSTALL = "tools/install_nsys.sh from commprof's source repository, or NVIDIA's Nsight Systems package"
"""Where to get `nsys`, as the help and the error without it say."""

DESCRIPTION = f"""\
Profile a commprof bench or run job with Nsight Systems, one report per rank (DIR/rank<r>.nsys-rep): the
command is printed, then run where nsys is installed (get it with {INSTALL}). With commprof's own launcher (--nproc)
each rank runs under its own `nsys profile`; under torchrun, mpiexec or srun, put the printed `nsys profile`
prefix in front of each rank's command yourself. Only the measured part is captured: the iterations after
--warmup for run, the whole sweep for bench. Traces cuda,nvtx,osrt by default; --trace cuda,nvtx,osrt,mpi
adds Nsight's own MPI rows.

examples:
  commprof nsys -- run --strategy ddp --nproc 2 --steps 20
  commprof nsys --output prof -- bench all_reduce --backend mpi --nproc 4
  commprof nsys --print-only -- run --strategy fsdp --nproc 2
"""
"""`commprof nsys --help`: what the module's docstring says, for users."""


def add_parser(subparsers, summary: str) -> None:
    p = subparsers.add_parser("nsys", help=summary, description=DESCRIPTION)
    p.add_argument("--output", default="nsys", metavar="DIR", help="where the reports go (default ./nsys)")
    p.add_argument("--trace", default=TRACES, metavar="LIST",
                   help=f"nsys --trace list (default {TRACES}; add mpi for nsys's own MPI rows)")
    p.add_argument("--print-only", action="store_true", help="print the command, do not run it")
    p.add_argument("job", nargs=argparse.REMAINDER, help="-- then the bench or run command line")
    p.set_defaults(func=main)


def _backend(job: list[str]) -> str | None:
    for i, arg in enumerate(job):
        if arg == "--backend" and i + 1 < len(job):
            return job[i + 1]
        if arg.startswith("--backend="):
            return arg.split("=", 1)[1]
    return None


def profile_prefix(output: str, backend: str | None, traces: str = TRACES) -> list[str]:
    """`nsys profile …` for one rank; `{rank}` stands for the rank number."""
    flags = ["nsys", "profile", f"--trace={traces}", "--capture-range=nvtx", f"--nvtx-capture={CAPTURE}",
             "--capture-range-end=stop", "--force-overwrite=true", f"--output={output}/rank{{rank}}"]
    if "mpi" in traces.split(","):
        flags.insert(3, f"--mpi-impl={_mpi_impl()}")
    return flags


def _mpi_impl() -> str:
    """nsys's name for the MPI that `mpiexec` here belongs to: openmpi, else mpich (the wheel's)."""
    try:
        version = subprocess.run([find_mpiexec(), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (UsageError, OSError, subprocess.TimeoutExpired):
        return "mpich"
    return "openmpi" if "Open MPI" in version or "OpenRTE" in version else "mpich"


def command(output: str, job: list[str], traces: str = TRACES) -> tuple[dict, list[str]]:
    """(environment, argv) that profile `commprof <job>` one report per rank."""
    if not job or job[0] not in ("bench", "run"):
        raise UsageError("commprof nsys needs a job: commprof nsys -- run … (or -- bench …)")
    wrapper = shlex.join(profile_prefix(output, _backend(job), traces))
    # registered strings are what the nvtx package sends; 0 also lets plain ones match the capture range
    env = {"COMMPROF_RANK_WRAPPER": wrapper, "NSYS_NVTX_PROFILER_REGISTER_ONLY": "0"}
    return env, ["commprof", *job]


def main(args: argparse.Namespace) -> int:
    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    env, argv = command(args.output, job, args.trace)
    shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(argv)
    print(shown)
    bare = shlex.join(profile_prefix(args.output, _backend(job), args.trace)).replace("{rank}", "%q{RANK}")
    print(f"# under torchrun/srun/mpiexec, in front of each rank's command (%q{{…}} = that rank's variable): {bare}")
    print(f"# then: nsys stats --report nvtx_sum,nvtx_gpu_proj_sum,cuda_gpu_kern_sum {args.output}/rank0.nsys-rep")
    if args.print_only:
        return 0
    if shutil.which("nsys") is None:
        raise UsageError(f"Nsight Systems' nsys is not on PATH: get it with {INSTALL}, then run again "
                         "(--print-only prints the command without running it)")
    os.makedirs(args.output, exist_ok=True)
    return subprocess.call([sys.executable, "-m", "commprof", *job], env={**os.environ, **env})
