"""The hand-written algorithms in kernels/: every one at 3 ranks on gloo and 2 on MPI, every dtype,
odd sizes, both modes; results equal the closed form, the library collective and `expected`, and
the bytes each rank sends equal `sent_bytes` (tests/kernel_worker.py does the checking)."""

import sys
from pathlib import Path

import pytest
from spawn import spawn

from commprof import kernels

WORKER = str(Path(__file__).with_name("kernel_worker.py"))


# every dtype, op and size against each backend's own collective, at an odd count on gloo (3) and a pair on MPI:
# the algorithms' paths at 1 to 8 ranks, results and bytes, run in process on a fake Comm in the fast lane
# (tests/unit/test_fake_comm_kernels.py); here, that real point-to-point carries them alike
@pytest.mark.parametrize("backend,nproc", [("gloo", 3), ("mpi", 2)])
def test_every_algorithm_matches_library_closed_form_and_byte_formula(backend, nproc):
    proc = spawn([sys.executable, WORKER, backend], nproc=nproc, backend=backend)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_worker_catches_a_wrong_byte_count(monkeypatch):
    # The same worker, run in-process on one rank, must report a formula that is off.
    import kernel_worker

    module = kernels.ALGORITHMS["all_gather"]["bruck"]
    monkeypatch.setattr(module, "sent_bytes", lambda n, rank, count, itemsize, root=0: 1)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert kernel_worker.main("gloo", ["all_gather/bruck"]) == 1
