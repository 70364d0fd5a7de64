"""The hand-written algorithms in kernels/: every one at 1 to 4 ranks on gloo and MPI, every dtype,
odd sizes, both modes; results equal the closed form, the library collective and `expected`, and
the bytes each rank sends equal `sent_bytes` (tests/kernel_worker.py does the checking)."""

import sys
from pathlib import Path

import pytest
from spawn import spawn

from commprof import kernels
from commprof.kernels.common import Fold, bounds

WORKER = str(Path(__file__).with_name("kernel_worker.py"))


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
@pytest.mark.parametrize("nproc", [1, 2, 3, 4])
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


def test_blocks_and_fold_closed_forms():
    assert bounds(10, 4) == [0, 3, 6, 8, 10]
    assert bounds(2, 4) == [0, 1, 2, 2, 2]
    fold = Fold(6)  # p = 4, rem = 2: pairs (0,1), (2,3) fold; 4, 5 stay
    assert (fold.p, fold.rem) == (4, 2)
    assert [fold.core(r) for r in range(6)] == [None, 0, None, 1, 2, 3]
    assert [fold.real(c) for c in range(4)] == [1, 3, 4, 5]
    assert [fold.first(c) for c in range(5)] == [0, 2, 4, 5, 6]


def test_names_are_unique_per_collective_and_modules_fill_the_interface():
    for collective, by_name in kernels.ALGORITHMS.items():
        for name, module in by_name.items():
            assert (module.COLLECTIVE, module.NAME) == (collective, name)
            for fn in ("run", "expected", "sent_bytes", "steps", "cost"):
                assert callable(getattr(module, fn)), (name, fn)
            assert module.cost(1, 1 << 20, 1e-5, 1e-9) == 0  # one rank: nothing to send
    assert kernels.ALGORITHMS["all_reduce"]["ring"].cost(4, 1 << 20, 1e-5, 1e-9) == pytest.approx(
        6 * 1e-5 + 2 * 3 / 4 * (1 << 20) * 1e-9)
