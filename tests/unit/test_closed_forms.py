"""The bench's check data: the closed forms of every reduction (sum, prod, min, max, avg) and of all_to_all
equal brute force over the ranks' inputs, an offset window included."""

import pytest
import torch

from commprof.bench import data


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
