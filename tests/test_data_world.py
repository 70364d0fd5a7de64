"""Closed-form check data against brute force, the wrong-value counter on a real Comm, and rank discovery."""

import pytest
import torch

from commprof.bench import data
from commprof.bench.collectives import COLLECTIVES
from commprof.comm import init_comm
from commprof.comm.dtypes import DTYPES
from commprof.errors import UsageError
from commprof.world import World, discover, first_host


@pytest.mark.parametrize("n", range(1, 8))
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg"])
def test_reduce_closed_forms_match_brute_force(n, op):
    count = 37
    stack = torch.stack([data.reduce_input(op, r, n, count).double() for r in range(n)])
    brute = {"sum": stack.sum(0), "prod": stack.prod(0), "min": stack.min(0).values,
             "max": stack.max(0).values, "avg": stack.mean(0)}[op]
    assert torch.equal(data.reduce_expected(op, n, count), brute)
    # an offset window is the same formula further along
    assert torch.equal(data.reduce_expected(op, n, 5, offset=30), brute[30:35])


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_all_to_all_closed_form(n):
    inputs = [data.all_to_all_input(r, n, 3).view(n, 3) for r in range(n)]
    for r in range(n):
        received = torch.cat([inputs[s][r] for s in range(n)])
        assert torch.equal(data.all_to_all_expected(r, n, 3), received)


@pytest.fixture(scope="module")
def comm1():
    world = World(rank=0, world_size=1, local_rank=0, local_world_size=1, launcher="none")
    comm = init_comm(world, backend="gloo", timeout_s=30)
    yield comm
    comm.close()


@pytest.mark.parametrize("name", [c for c in COLLECTIVES if c != "barrier"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "uint8"])
def test_check_counts_corrupted_values(comm1, name, dtype):
    inplace = name not in ("all_to_all", "sendrecv")
    case = COLLECTIVES[name].prepare(comm1, 12, DTYPES[dtype], "sum", inplace, 0)
    case.init()
    case.run()
    assert case.wrong() == 0
    # corrupt three output elements: the check must see exactly three
    case.init()
    case.run()
    case.output[[0, 5, 11]] += 1
    assert case.wrong() == 3


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
