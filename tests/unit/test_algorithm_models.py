"""The hand-written algorithms' models, without ranks: the α–β fit recovers a closed-form line, the block
bounds and the fold to a power of two follow their closed forms, and every algorithm in kernels/ has a
unique name per collective and the whole module interface, with the cost its formula gives."""

import pytest

from commprof import kernels
from commprof.kernels.common import Fold, bounds
from commprof.perfmodel import alphabeta


def test_alpha_beta_fit_recovers_a_closed_form():
    alpha, beta = 20e-6, 0.5e-9
    points = [(m, alpha + beta * m) for m in (8, 1 << 10, 1 << 16, 1 << 22)]
    fit = alphabeta.fit(points)
    assert fit.alpha_s == pytest.approx(alpha) and fit.beta_s_per_byte == pytest.approx(beta)
    assert fit.max_rel_err < 1e-9
    assert alphabeta.fit(points[:1]) is None  # one size cannot separate α from β
    flat = alphabeta.fit([(8, 1e-5), (1 << 20, 0.9e-5)])  # a falling line: latency only
    assert flat.beta_s_per_byte == 0 and 0.9e-5 < flat.alpha_s < 1e-5


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
