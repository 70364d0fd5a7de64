"""Rank discovery from a launcher's variables (torchrun, Open MPI, MPICH, Slurm, none), bad variables
refused with a UsageError, and the first host of a Slurm node list."""

import pytest

from commprof.base.errors import UsageError
from commprof.base.world import World, discover, first_host


def test_discover_launchers():
    torchrun = discover({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                         "MASTER_ADDR": "h0", "MASTER_PORT": "2950"})
    assert torchrun == World(3, 4, 1, 2, "torchrun", "h0", 2950)
    ompi = discover({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                     "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert (ompi.rank, ompi.world_size, ompi.launcher, ompi.master_addr) == (1, 2, "mpiexec", None)
    mpich = discover({"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"})
    assert (mpich.rank, mpich.world_size, mpich.local_world_size) == (2, 3, 3)
    slurm = discover({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                      "SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "1234"})
    assert (slurm.rank, slurm.world_size, slurm.local_world_size, slurm.launcher) == (5, 8, 4, "srun")
    assert (slurm.master_addr, slurm.master_port) == ("gpu07", 21234)
    alone = discover({})
    assert (alone.world_size, alone.launched) == (1, False)


def test_discover_rejects_bad_variables():
    with pytest.raises(UsageError, match="RANK=4 is outside 0..3"):
        discover({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(UsageError, match="is not a whole number"):
        discover({"RANK": "x", "WORLD_SIZE": "4"})


def test_first_host():
    assert first_host("node1") == "node1"
    assert first_host("gpu[03-05,09],cpu1") == "gpu03"
