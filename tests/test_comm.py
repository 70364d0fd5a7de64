"""Comm over real processes: every op at world sizes 1-4 on gloo and on MPI (mpiexec from the mpich wheel)."""

import sys
from pathlib import Path

import pytest
from spawn import spawn

WORKER = str(Path(__file__).parent / "comm_worker.py")


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
@pytest.mark.parametrize("nproc", [1, 2, 3, 4])
def test_every_op_matches_closed_form(backend, nproc):
    proc = spawn([sys.executable, WORKER, backend], nproc=nproc, backend=backend)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(f"{backend} ok") == nproc
