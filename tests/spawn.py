"""Start real ranks for tests: N local processes with torchrun's variables (gloo), or mpiexec -n N (MPI).

    proc = spawn([sys.executable, "script.py"], nproc=3, backend="gloo")
"""

from __future__ import annotations

import os
import subprocess
import sys

from commprof.comm import free_port
from commprof.launch import find_mpiexec

TIMEOUT_S = 180


def env_for_tests(**extra: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for key in ("COMMPROF_DEBUG", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT"):
        env.pop(key, None)
    return {**env, **extra}


def spawn(command: list[str], *, nproc: int, backend: str, env: dict | None = None,
          timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run `command` as `nproc` ranks and wait; stdout/stderr of all ranks, exit code = worst rank's."""
    env = env_for_tests() if env is None else env
    if backend == "mpi":
        return subprocess.run([find_mpiexec(), "-n", str(nproc), *command], env=env, capture_output=True,
                              text=True, timeout=timeout)
    port = str(free_port())
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**env, "RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(r),
                              "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
        for r in range(nproc)
    ]
    outs = [p.communicate(timeout=timeout) for p in procs]
    code = max((p.returncode for p in procs), key=abs)
    return subprocess.CompletedProcess(command, code, "".join(o for o, _ in outs), "".join(e for _, e in outs))


def commprof(*args: str, env: dict | None = None, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run the commprof CLI as a user would (its own launcher does the rest)."""
    return subprocess.run([sys.executable, "-m", "commprof", *args], env=env_for_tests() if env is None else env,
                          capture_output=True, text=True, timeout=timeout)
