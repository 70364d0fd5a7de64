"""`--nproc N`: start N local ranks of the same commprof command, so one command needs neither torchrun
nor mpiexec.

gloo/nccl: N child processes with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, …) and a
rendezvous on 127.0.0.1 at a free port. mpi: mpiexec -n N (the mpich wheel's, next to this Python, or
the system's). If one rank fails, the others get a moment to report and are then stopped: a dead
rank never leaves the rest hanging. COMMPROF_RANK_WRAPPER (a command line, `{rank}` replaced by the rank)
is put in front of every rank's command — how `commprof nsys` gives each rank its own Nsight report.
Exercised by: `pytest tests/test_launch.py`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from commprof.comm import YIELD_ENV, free_port
from commprof.errors import UsageError
from commprof.world import usable_cores

GRACE_S = 3.0
"""How long the other ranks may take to report their own error after one rank failed."""


class _Terminated(Exception):
    """SIGTERM reached the launcher: pass it on to the ranks (so they can close their traces)."""


def _on_term(signum, frame):
    raise _Terminated


def launch(argv: list[str], *, nproc: int, backend: str, oversubscribed: bool) -> int:
    """Run `commprof <argv>` as `nproc` local ranks; returns the job's exit code."""
    signal.signal(signal.SIGTERM, _on_term)
    env = dict(os.environ)
    # One rank per core gets one intra-op thread per core it owns, as torchrun does by default.
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() // nproc)))
    # Large CPU buffers on huge pages, as NumPy gets them: otherwise a 16 MiB MPI op on a torch
    # buffer measures TLB misses (4.5-5 ms against 2.8-3.2 ms here), not the transport.
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    command = [sys.executable, "-m", "commprof", *argv]
    wrapper = os.environ.get("COMMPROF_RANK_WRAPPER", "")
    if backend == "mpi":  # mpiexec knows the rank, the wrapper reads it from the environment
        return _mpiexec(shlex.split(wrapper.replace("{rank}", "%q{PMI_RANK}")) + command, nproc, env,
                        oversubscribed)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(nproc),
               LOCAL_WORLD_SIZE=str(nproc), COMMPROF_LAUNCHER="commprof")
    children = [
        subprocess.Popen(shlex.split(wrapper.replace("{rank}", str(r))) + command,
                         env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(nproc)
    ]
    return _supervise(children)


def find_mpiexec() -> str:
    """mpiexec next to this Python (the mpich wheel's), else on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if not found:
        raise UsageError("backend mpi needs mpiexec and none was found: install an MPI, "
                         "or pip install 'commprof[mpich]'")
    return found


def _mpiexec(command: list[str], nproc: int, env: dict, oversubscribed: bool) -> int:
    mpiexec = find_mpiexec()
    flags = []
    if oversubscribed:
        env.update({k: env.get(k, v) for k, v in YIELD_ENV.items()})
        version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
        if "Open MPI" in version or "OpenRTE" in version:
            flags.append("--oversubscribe")
    proc = subprocess.Popen([mpiexec, "-n", str(nproc), *flags, *command], env=env)
    return _supervise([proc])


def _supervise(children: list[subprocess.Popen]) -> int:
    """Wait for every child; after the first failure, stop the rest once GRACE_S has passed."""
    failed_at, code = None, 0
    try:
        while any(p.poll() is None for p in children):
            for rank, p in enumerate(children):
                rc = p.poll()
                if rc not in (None, 0) and failed_at is None:
                    failed_at, code = time.monotonic(), _exit_code(rank, rc, len(children))
            if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
                _stop(children)
            time.sleep(0.05)
    except KeyboardInterrupt:
        _stop(children)
        return 130
    except _Terminated:
        _stop(children)
        return 128 + signal.SIGTERM
    if failed_at is None:
        for rank, p in enumerate(children):
            if p.returncode:
                return _exit_code(rank, p.returncode, len(children))
    return code


def _exit_code(rank: int, rc: int, n: int) -> int:
    if rc < 0:  # killed by a signal: nobody else will say so
        who = f"rank {rank}" if n > 1 else "mpiexec"
        sys.stderr.write(f"commprof: error: {who} was killed by signal {signal.Signals(-rc).name}\n")
        return 128 - rc
    if rc > 128 and rc - 128 in signal.valid_signals():  # a shell, nsys or mpiexec passing a rank's signal on
        who = f"rank {rank}" if n > 1 else "a rank"
        sys.stderr.write(f"commprof: error: {who} exited with status {rc} ({signal.Signals(rc - 128).name})\n")
    return rc


def _stop(children: list[subprocess.Popen]) -> None:
    for p in children:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 2.0
    for p in children:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
