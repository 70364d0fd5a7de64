"""A rank's shared-memory segments go with its job (job.note_shared_memory, launch._remove_shared_memory):
MPICH maps /dev/shm/mpich_shm_* at MPI_Init and removes it at a clean MPI_Finalize only, so a failed MPI job
left one behind each time (2 MiB, never reclaimed). Here a real segment in /dev/shm, mapped by this process as
MPICH maps its own, is noted in a job folder and removed by the launcher's clean-up; a file the job did not
map stays."""

import mmap
import os
import uuid
from pathlib import Path

import pytest

from commprof.base import job
from commprof.launcher import launch

SHM = Path("/dev/shm")


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this machine")
def test_what_the_ranks_mapped_is_removed_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setenv(job.ENV, str(tmp_path))
    mine, other = SHM / f"commprof_test_{uuid.uuid4().hex}", SHM / f"commprof_test_{uuid.uuid4().hex}"
    try:
        for path in (mine, other):
            path.write_bytes(b"\0" * mmap.PAGESIZE)
        with open(mine, "r+b") as f, mmap.mmap(f.fileno(), mmap.PAGESIZE) as mapped:
            job.note_shared_memory()
            mapped[0] = 1
        assert (tmp_path / f"shm.{os.getpid()}").exists()
        assert str(mine) in job.shared_memory(tmp_path) and str(other) not in job.shared_memory(tmp_path)
        launch._remove_shared_memory(tmp_path)
        assert not mine.exists() and other.exists()
        launch._remove_shared_memory(tmp_path)  # gone already (its rank's MPI_Finalize): nothing to say
    finally:
        for path in (mine, other):
            path.unlink(missing_ok=True)


def test_without_a_job_folder_nothing_is_noted(monkeypatch):
    monkeypatch.delenv(job.ENV, raising=False)
    job.note_shared_memory()  # a rank under a launcher of its own (torchrun, a bare mpiexec): no folder
