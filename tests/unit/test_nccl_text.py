"""`commprof bench --format nccl-tests` prints what nccl-tests prints: rendered from recorded results
(tests/recorded/bench-2) and from values built here, compared line by line with nccl-tests' format strings
(src/common.cu) and with a real nccl-tests log; a parser written for nccl-tests logs (tests/support/nccl_log.py)
reads a real log, then commprof's, unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.nccl_log import parse

from commprof.base.backends import DTYPES
from commprof.bench.config import BenchConfig
from commprof.report import nccl_text
from commprof.report.nccl_text import RankLine, block, render, time_str

# A real nccl-tests log, verbatim: all_reduce_perf on two nodes, 512M to 8G. From
# https://github.com/NVIDIA/nccl-tests/issues/252 (comment of 2024-09-24, "with -x NCCL_ALGO=RING").
REAL_LOG = """\
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
   536870912     134217728     float     sum      -1    10052   53.41   93.46      0   9676.9   55.48   97.09      0
  1073741824     268435456     float     sum      -1    20079   53.48   93.58      0    19265   55.74   97.54      0
  2147483648     536870912     float     sum      -1    39871   53.86   94.26      0    39357   54.56   95.49      0
  4294967296    1073741824     float     sum      -1    77194   55.64   97.37      0    79688   53.90   94.32      0
  8589934592    2147483648     float     sum      -1   158070   54.34   95.10      0   158561   54.17   94.80      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 95.3009
"""
# The line above the column names, as an nccl-tests run printed it (trailing spaces kept): reduce_scatter_perf in
# https://github.com/NVIDIA/nccl-tests/issues/128 (comment of 2023-02-02).
REAL_MODES_LINE = "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place" + " " * 10

RECORDED = Path(__file__).resolve().parents[1] / "recorded"
RANKS = [RankLine(0, 4242, "vm", -1, None, "AMD EPYC 7B13"), RankLine(1, 4243, "vm", -1, None, "AMD EPYC 7B13")]
BENCH_2 = BenchConfig(collectives=("all_reduce", "all_gather", "broadcast"), backend="gloo", min_bytes=8,
                      max_bytes=1 << 20, step_factor=8, iters=3, warmup=1)
"""bench-2's command: -b 8 -e 1M -f 8 -n 3 -w 1 (tests/recorded/README.md)."""


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return json.loads((RECORDED / "bench-2" / "bench.json").read_text())["results"]


def _record(**over) -> dict:
    rec = {"collective": "all_reduce", "algo": "library", "world_size": 2, "dtype": "float32", "redop": "sum",
           "root": None, "inplace": False, "nbytes": 1024, "count": 256, "time_us": 10.0, "algbw_GBps": 0.1,
           "busbw_GBps": 0.1, "wrong": 0}
    return {**rec, **over}


def test_the_parser_reads_a_real_nccl_tests_log():
    [run] = parse(REAL_LOG)
    assert len(run.rows) == 5 and (run.out_of_bounds, run.ok, run.avg_busbw) == (0, True, 95.3009)
    first, last = run.rows[0], run.rows[-1]
    assert (first.size, first.count, first.type, first.redop, first.root) == (536870912, 134217728, "float", "sum", -1)
    assert (first.out_of_place.time_us, first.out_of_place.busbw, first.in_place.time_us) == (10052, 93.46, 9676.9)
    assert (last.out_of_place.time_us, last.in_place.busbw, last.in_place.wrong) == (158070, 94.80, 0)
    # nccl-tests' average: the mean busbw of every row's two modes, as nccl_text.avg_busbw takes it
    both = [m.busbw for r in run.rows for m in (r.out_of_place, r.in_place)]
    assert sum(both) / len(both) == pytest.approx(run.avg_busbw, abs=0.001)


def test_the_column_header_is_nccl_tests_own():
    marks, names, units = nccl_text.columns()[1:]
    assert marks == REAL_MODES_LINE
    assert [names.rstrip(), units.rstrip()] == REAL_LOG.splitlines()[:2]


def test_a_row_is_a_real_logs_row_character_for_character():
    # the first row of the real log, measured by commprof: every width, precision and gap as nccl-tests has it
    oop = _record(nbytes=536870912, count=134217728, time_us=10052.2, algbw_GBps=53.41, busbw_GBps=93.46)
    ip = {**oop, "inplace": True, "time_us": 9676.94, "algbw_GBps": 55.48, "busbw_GBps": 97.09}
    assert nccl_text.row({False: oop, True: ip}) == REAL_LOG.splitlines()[2]


def test_the_time_has_nccl_tests_precision():
    assert [time_str(t) for t in (0.5, 99.994, 99.996, 100.0, 9999.94, 9999.96, 10000.0, 1234567.0)] == [
        "   0.50", "  99.99", " 100.00", "  100.0", " 9999.9", "10000.0", "  10000", "1234567"]


def test_a_recorded_sweep_line_by_line(results):
    text = render(results, BENCH_2, RANKS)
    blocks = text.split("#\n\n")
    assert len(blocks) == 4 and blocks[-1] == ""  # a block per collective, each ending in `#` and an empty line
    ar = blocks[0].splitlines()
    assert ar[:9] == [
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 1048576 step: 8(factor) warmup iters: 1 iters: 3 agg iters: 1 "
        "validation: 1 graph: 0",
        "#",
        "# Using devices",
        "#  Rank  0 Group  0 Pid   4242 on         vm device -1 [cpu] AMD EPYC 7B13",
        "#  Rank  1 Group  0 Pid   4243 on         vm device -1 [cpu] AMD EPYC 7B13",
        "#",
        REAL_MODES_LINE,
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw"
        " #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"
        "       ",
    ]
    # gloo has no out-of-place all_reduce: its four columns blank, as nccl-tests prints an unmeasured mode
    blank = " " * 32
    assert ar[9] == "           8             2     float     sum      -1" + blank + "    366.7    0.00    0.00      0"
    assert ar[14] == "      262144         65536     float     sum      -1" + blank + "   2552.1    0.10    0.10      0"
    assert ar[15:] == ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 0.0212914 "]
    ag = blocks[1].splitlines()
    assert ag[:9] == ar[:9]  # one header per collective, as one per nccl-tests binary
    # all_gather's count is a rank's share (nccl-tests' paramcount), its redop none, both modes
    assert ag[9] == ("           8             1     float    none      -1    386.5    0.00    0.00      0"
                     "    334.1    0.00    0.00      0")
    broadcast = blocks[2].splitlines()[9]
    assert broadcast.startswith("           8             2     float    none       0 ")  # its root


def test_the_parser_reads_commprofs_output_unchanged(results):
    runs = parse(render(results, BENCH_2, RANKS))
    names = list(dict.fromkeys(r["collective"] for r in results))
    assert len(runs) == len(names) == 3
    for name, run in zip(names, runs):
        recs = [r for r in results if r["collective"] == name]
        sizes = list(dict.fromkeys(r["nbytes"] for r in recs))
        assert [row.size for row in run.rows] == sizes
        assert (run.out_of_bounds, run.ok) == (0, True)
        assert run.avg_busbw == pytest.approx(sum(r["busbw_GBps"] for r in recs) / len(recs), rel=1e-5)
        for row in run.rows:
            by_mode = {r["inplace"]: r for r in recs if r["nbytes"] == row.size}
            ref = next(iter(by_mode.values()))
            share = 2 if name == "all_gather" else 1  # nccl-tests' count: what each rank passes
            assert (row.count, row.type, row.root) == (ref["count"] // share, "float", -1 if ref["root"] is None else 0)
            assert row.redop == (ref["redop"] or "none")
            for inplace, mode in ((False, row.out_of_place), (True, row.in_place)):
                rec = by_mode.get(inplace)
                if rec is None:
                    assert mode is None
                    continue
                decimals = 0 if rec["time_us"] >= 1e4 else 1 if rec["time_us"] >= 100 else 2
                assert mode.time_us == pytest.approx(rec["time_us"], abs=0.5 * 10 ** -decimals)
                assert mode.busbw == pytest.approx(rec["busbw_GBps"], abs=0.005)
                assert mode.algbw == pytest.approx(rec["algbw_GBps"], abs=0.005)
                assert mode.wrong == rec["wrong"] == 0


def test_unchecked_values_read_n_a_and_a_wrong_one_fails():
    sweep = SimpleNamespace(**{**vars(BENCH_2), "check": 0, "blocking": True, "step_bytes": 4096})
    unchecked = [_record(wrong=None), _record(inplace=True, wrong=None)]
    lines = block(unchecked, sweep, RANKS[:1]).splitlines()
    assert lines[0].startswith("# nThread 1 nGpus 1 minBytes 8 maxBytes 1048576 step: 4096(bytes) ")
    assert lines[0].endswith(" validation: 0 graph: 0")
    assert lines[1] == "# Blocking Enabled: wait for completion and barrier after each collective "
    [row] = [ln for ln in lines if not ln.startswith("#")][:1]
    assert row.endswith("    N/A") and row.count("N/A") == 2
    [run] = parse("\n".join(lines))
    assert run.rows[0].out_of_place.wrong is None and run.rows[0].in_place.wrong is None
    failed = block([_record(wrong=3), _record(inplace=True)], BENCH_2, RANKS)
    assert "# Out of bounds values : 1 FAILED\n" in failed
    [run] = parse(failed)
    assert (run.ok, run.out_of_bounds, run.rows[0].out_of_place.wrong, run.rows[0].in_place.wrong) == (False, 1, 3, 0)


def test_an_unmeasured_in_place_mode_and_every_root_in_one_block():
    # torch.distributed has no in-place all_to_all: the row ends in blank in-place columns
    a2a = [_record(collective="all_to_all", redop=None, nbytes=64, count=16)]
    [run] = parse(block(a2a, BENCH_2, RANKS))
    assert run.rows[0].in_place is None and run.rows[0].out_of_place.time_us == 10.0 and run.rows[0].count == 8
    # -r all: every root's rows in one run, told apart by the root column, as nccl-tests' broadcast_perf prints them
    roots = [_record(collective="broadcast", redop=None, root=r, inplace=True) for r in (0, 1)]
    [run] = parse(render(roots, BENCH_2, RANKS))
    assert [(row.root, row.redop) for row in run.rows] == [(0, "none"), (1, "none")]


def test_a_gpu_rank_line_and_a_fractional_factor():
    gpu = RankLine(3, 77, "node-a", 1, 0x1B, "NVIDIA H100 80GB HBM3")
    assert nccl_text.rank_line(gpu) == ("#  Rank  3 Group  0 Pid     77 on     node-a device  1 [0x1b] "
                                        "NVIDIA H100 80GB HBM3")
    sweep = SimpleNamespace(**{**vars(BENCH_2), "step_factor": 1.5})
    assert " step: 1.5(factor) " in nccl_text.header(sweep, [gpu])[0]


def test_every_dtype_has_nccl_tests_name():
    assert set(nccl_text.TYPE_NAMES) == set(DTYPES)
    assert [nccl_text.TYPE_NAMES[d] for d in ("float32", "float16", "bfloat16", "float64", "int32")] == [
        "float", "half", "bfloat16", "double", "int32"]
