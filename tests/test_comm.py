"""Comm over real processes: every op at world sizes 1-3 on gloo and 1, 2, 4 on MPI (mpiexec from the mpich wheel)."""

import sys
from pathlib import Path

import pytest
from spawn import spawn

WORKER = str(Path(__file__).parent / "comm_worker.py")


# each backend at 1 and 2 ranks, one at an odd count (3, gloo), the other at a power of two above 2 (4, MPI):
# Comm's own code is the backends' alike at every count (as tests/test_kernels.py)
@pytest.mark.parametrize("backend,nproc", [("gloo", 1), ("gloo", 2), ("gloo", 3), ("mpi", 1), ("mpi", 2),
                                           ("mpi", 4)])
def test_every_op_matches_closed_form(backend, nproc):
    proc = spawn([sys.executable, WORKER, backend], nproc=nproc, backend=backend)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(f"{backend} ok") == nproc
