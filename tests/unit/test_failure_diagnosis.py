"""How a failing job is told apart, without a job: COMMPROF_FAULT specs parse and a bad one is named, the
flight records' first divergence names the earliest call the ranks disagree on (a desync, not a stall),
and the first failure a job claims is the one it reports."""

import pytest

from commprof.base import job
from commprof.base.errors import UsageError
from commprof.comm.failure import faults, flight


def test_fault_specs_parse_and_bad_ones_are_named():
    got = faults.parse("stall:rank=1:seq=5, die:rank=0:op=all_gather:signal=TERM,desync:rank=2:at=start")
    assert got == [faults.Fault("stall", rank=1, seq=5), faults.Fault("die", rank=0, op="all_gather", signal="TERM"),
                   faults.Fault("desync", rank=2, at="start")]
    for bad, words in (("melt:rank=1", "unknown fault 'melt'"), ("stall:rank=x", "rank='x'"),
                       ("stall:when=3", "unknown field 'when'"), ("die:signal=NOPE", "unknown signal 'NOPE'"),
                       ("stall:seq=0", "seq=0"), ("stall:at=end", "at='end'"),
                       # digits Python's int() takes or not, a sleep that overflows, a handler that is no signal
                       ("stall:rank=\u00b2", "is not a whole number"), ("slow:rank=\u0661", "is not a whole number"),
                       ("slow:ms=1e300", "from 0 to 3600000 ms"), ("die:signal=_IGN", "unknown signal '_IGN'"),
                       ("slow:op=all_reduce_typo", "not an op commprof counts")):
        with pytest.raises(UsageError, match=words):
            faults.parse(bad)


def test_a_fault_on_a_rank_the_job_does_not_have_is_said(monkeypatch):
    monkeypatch.setenv(faults.ENV, "slow:rank=1:op=all_reduce,die:rank=99")
    assert faults.check(4) == ["COMMPROF_FAULT: rank=99 in 'die': the job has ranks 0-3, so it never fires"]
    assert faults.check(100) == []  # every rank there: nothing to say


def snap(rank, ring, busy=None, groups=None):
    groups = groups or {"world": [0, 1]}
    seqs = {}
    for label, seq, *_ in ring:
        seqs[label] = max(seqs.get(label, 0), seq)
    return {"rank": rank, "busy": busy, "groups": groups, "seqs": seqs, "ring": ring}


def test_first_divergence_names_the_earliest_differing_call():
    same = [["world", 1, "all_reduce", 8, "float32"], ["world", 2, "all_reduce", 4096, "float32"]]
    assert flight.first_divergence({0: snap(0, same), 1: snap(1, same)}) is None
    other = same[:1] + [["world", 2, "all_gather", 8192, "float32"]]
    line = flight.first_divergence({0: snap(0, same, "all_reduce (world)"), 1: snap(1, other, "all_gather (world)")})
    assert line == ("desync at all_reduce seq 2 (world): rank 0 called all_reduce 4 KiB float32, "
                    "rank 1 called all_gather 8 KiB float32")
    # one rank issued one more: a desync when the other is blocked elsewhere, a stall when it is idle
    short = same[:1]
    line = flight.first_divergence({0: snap(0, same, "all_reduce (world)"), 1: snap(1, short, "barrier (world)")})
    assert line and line.startswith("desync at all_reduce seq 2 (world): rank 0 called all_reduce 4 KiB float32, "
                                    "rank 1 called nothing at this seq")
    assert flight.first_divergence({0: snap(0, same, "all_reduce (world)"), 1: snap(1, short)}) is None
    # point-to-point never counts; a ring that lost its oldest ops is compared where both hold them
    p2p = [["pp", 0, "send", 64, "float32"]] + same
    assert flight.first_divergence({0: snap(0, p2p), 1: snap(1, same[1:])}) is None


def test_the_first_claim_of_a_job_wins(tmp_path, monkeypatch):
    monkeypatch.setenv(job.ENV, str(tmp_path))
    assert job.claim(3, "rank 1 was killed by SIGKILL", None)
    assert not job.claim(1, "rank 0: all_reduce failed", 0)
    assert job.failure(tmp_path) == {"code": 3, "message": "rank 1 was killed by SIGKILL", "rank": None}
