"""The wrong-value counter on a real Comm: every collective's check counts exactly the elements corrupted.
(Closed-form check data and rank discovery: tests/unit/test_closed_forms.py, tests/unit/test_world_discovery.py.)"""

import pytest

from commprof.base.world import World
from commprof.bench.collectives import COLLECTIVES
from commprof.comm import init_comm
from commprof.comm.dtypes import DTYPES


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
