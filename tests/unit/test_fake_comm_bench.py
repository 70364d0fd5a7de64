"""bench's prepared cases (bench/collectives.py) on a fake Comm, in process: for every collective, at 1 to 5
ranks, in both modes, for a float and an integer type and each reduction, `init` then `run` then `wrong`
finds no element off the closed form (bench/data.py) — the check `commprof bench -c 1` makes on real ranks
(tests/test_bench_cli.py: every collective on gloo at 3 ranks and MPI at 2), here at every rank count.

    pytest tests/unit/test_fake_comm_bench.py
"""

from __future__ import annotations

import pytest
import torch
from support.fake_comm import FakeWorld

from commprof.bench.collectives import COLLECTIVES

CASES = [(name, dtype, op) for name, coll in COLLECTIVES.items()
         for dtype, ops in ((torch.float32, ("sum", "max", "min", "avg")), (torch.int32, ("sum", "prod")))
         for op in (ops if coll.reduces else ("sum",))]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("name,dtype,op", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_every_case_checks_clean_at_every_rank_count(name, dtype, op, ranks):
    if name == "sendrecv" and ranks == 1:
        pytest.skip("sendrecv pairs ranks")
    if op == "avg" and dtype != torch.float32:
        pytest.skip("avg is for floating types")
    coll = COLLECTIVES[name]
    count = 7 * ranks if coll.split else 13  # odd: no size that happens to divide evenly
    root = ranks - 1

    def rank(comm):
        wrong = []
        for inplace in (False, True):
            case = coll.prepare(comm, count, dtype, op, inplace, root)
            case.init()
            case.run()
            wrong.append(case.wrong())
        return wrong
    assert FakeWorld(ranks).run(rank) == [[0, 0]] * ranks


def test_a_wrong_result_is_counted():
    coll = COLLECTIVES["all_reduce"]

    def rank(comm):
        case = coll.prepare(comm, 8, torch.float32, "sum", False, 0)
        case.init()
        case.run()
        case.output.view(-1)[3] += 1  # one element off
        return case.wrong()
    assert FakeWorld(2).run(rank) == [1, 1]
