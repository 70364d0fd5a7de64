"""The --live terminal line fits the width it is given by priority: who or what costs the step, how much a step
and since which step first; then the loop's iteration and ETA; then the rest (the window's steps, the share, the
host's contention). A piece is shown whole or not at all: no number is cut. Windows built as the ranks fold them
(live/window.py) and combined as rank 0 combines them (live/combine.py); nothing is started."""

from __future__ import annotations

import random
import re

import pytest

from commprof.live.combine import Held, combine
from commprof.live.monitor import line
from commprof.live.window import Fold

MS = 1_000_000
WINDOW = 20


def _windows(first: int, busy_by_rank, blocked_by_rank, seed=0):
    """One window per rank of the WINDOW steps from `first`: each step `busy` ms of its own and `blocked` ms
    waiting on its one all_reduce (± 0.5 ms)."""
    rnd = random.Random(seed)
    out = []
    for rank, (busy, blocked) in enumerate(zip(busy_by_rank, blocked_by_rank)):
        fold = Fold(rank=rank, host="h", window=WINDOW)
        for step in range(first, first + WINDOW):
            b = max(0.0, blocked + rnd.uniform(-0.5, 0.5))
            wall = busy + b + rnd.uniform(-0.5, 0.5)
            op = ("all_reduce", 1 << 20, len(busy_by_rank), 0, 3 * MS, False, "world")
            got = fold.add({"step": step, "wall_ms": wall, "exposed_comm_ms": b, "bubble_ms": 0.0}, [op],
                           [("all_reduce", 0, int(b * MS))])
        out.append(got)
    return out


@pytest.fixture
def straggling():
    """The window of steps 1220-1239 of a job whose rank 1 has been late since step 1200 (the window before)."""
    held = Held()
    for first in (1200, 1220):
        job = combine(_windows(first, [10.0, 30.0, 10.0], [21.0, 1.0, 21.0], seed=first))
        held.update(job)
    return job


def _numbers(text: str) -> list[str]:
    return re.findall(r"[\d][\d.:/-]*\d|\d", text)


@pytest.mark.parametrize("width", [80, 120])
def test_the_line_says_who_how_much_and_since_when_within_the_width(straggling, width):
    f = straggling["findings"][0]
    assert (f["kind"], f["rank"], f["since_step"]) == ("straggler", 1, 1200), f
    text = line(straggling, width, iteration=1240, total=5000, eta_s=41)
    assert len(text) <= width, text
    assert "straggler rank 1" in text and f"+{f['ms_per_step']:.1f} ms/step" in text, text
    assert "since step 1200" in text, text
    whole = line(straggling, iteration=1240, total=5000, eta_s=41)  # every piece: longer than 120 columns
    assert len(whole) > 120 and "live: steps 1220-1239" in whole
    assert set(_numbers(text)) <= set(_numbers(whole)), (text, whole)  # no number cut short
    if width >= 120:
        assert "iteration 1240/5000" in text and "ETA 0:00:41" in text, text


def test_the_rest_goes_before_the_iteration_and_the_eta(straggling):
    at = {w: line(straggling, w, iteration=1240, total=5000, eta_s=41) for w in (200, 120, 80)}
    assert "live: steps 1220-1239" in at[200] and "live: steps" not in at[120]
    assert "iteration 1240/5000" in at[80] and "ETA" not in at[80]  # the iteration before the time left
    # without a width, what the line always said, and the iteration and ETA where given
    assert line(straggling).startswith("live: steps 1220-1239 ") and "since step 1200" in line(straggling)


def test_a_contended_window_and_one_without_a_finding_fit_too(straggling):
    busy = {**straggling, "contention": {"contended": True, "others_cores": 1.2}}
    assert "(contended: others used 1.20 core(s))" in line(busy, 200, iteration=1240, total=5000, eta_s=41)
    text = line(busy, 120, iteration=1240, total=5000, eta_s=41)
    assert len(text) <= 120 and "(contended)" in text and "since step 1200" in text, text
    quiet = {**straggling, "findings": []}
    assert line(quiet, 80, iteration=1240) == "iteration 1240 · live: steps 1220-1239 " \
        f"{straggling['step_ms']:.1f} ms/step · no finding above 3 %"


def test_no_width_gets_a_longer_line_nor_a_number_cut_short(straggling):
    whole = line(straggling, iteration=1240, total=5000, eta_s=41)
    for width in range(12, 160):
        text = line(straggling, width, iteration=1240, total=5000, eta_s=41)
        assert len(text) <= width, (width, text)
        assert set(_numbers(text.rstrip("…"))) <= set(_numbers(whole)), (width, text)
        if width >= 50:  # room for who, how much and since when, each whole
            assert "rank 1 +" in text and "since step 1200" in text, (width, text)
