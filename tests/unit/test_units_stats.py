"""Sizes, sweeps, statistics and nccl-tests' bandwidth maths."""

import pytest

from commprof.base.errors import UsageError
from commprof.base.stats import bandwidths, summarize
from commprof.base.units import format_bytes, parse_rate, parse_size
from commprof.bench.collectives import COLLECTIVES
from commprof.bench.config import BenchConfig


@pytest.mark.parametrize("text,value", [("8", 8), ("64K", 65536), ("16M", 16 << 20), ("1G", 1 << 30),
                                        ("1.5K", 1536), ("64KiB", 65536), ("2m", 2 << 20)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("bad", ["", "abc", "-8", "8X", "K"])
def test_parse_size_rejects(bad):
    with pytest.raises(UsageError, match="cannot read size"):
        parse_size(bad)


@pytest.mark.parametrize("text,value", [("25", 25.0), ("25GB/s", 25.0), ("200Gbit/s", 25.0), (" 1.5 TB/s", 1500.0),
                                        ("400 Mbit/s", 0.05), ("800MB/s", 0.8)])
def test_parse_rate_in_GBps(text, value):
    assert parse_rate(text, "--link-rate") == pytest.approx(value)


@pytest.mark.parametrize("bad", ["", "fast", "1Gb/s", "1Gbps", "-3", "25 GB", "1e3"])
def test_parse_rate_rejects_what_it_cannot_read_for_sure(bad):
    with pytest.raises(UsageError, match="cannot read rate"):
        parse_rate(bad, "--link-rate")


def test_format_bytes():
    assert [format_bytes(n) for n in (8, 1024, 1536, 16 << 20, 1 << 30)] == \
        ["8 B", "1 KiB", "1.5 KiB", "16 MiB", "1 GiB"]


def test_sweeps_multiply_and_add():
    assert BenchConfig(("all_reduce",), backend="gloo", min_bytes=8, max_bytes=64).sizes() == [8, 16, 32, 64]
    assert BenchConfig(("all_reduce",), backend="gloo", min_bytes=8, max_bytes=200, step_factor=4).sizes() == \
        [8, 32, 128]
    assert BenchConfig(("all_reduce",), backend="gloo", min_bytes=100, max_bytes=400, step_bytes=100).sizes() == \
        [100, 200, 300, 400]
    assert BenchConfig(("all_reduce",), backend="gloo", min_bytes=64, max_bytes=64, step_factor=1).sizes() == [64]


def test_sweep_rejects_inverted_range():
    with pytest.raises(UsageError, match="-b 128 is larger than -e 64"):
        BenchConfig(("all_reduce",), backend="gloo", min_bytes=128, max_bytes=64).sizes()


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_bus_factors_are_nccl_tests(n):
    # nccl-tests: allreduce 2(n-1)/n; allgather, reducescatter, alltoall (n-1)/n; others 1.
    expect = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "all_to_all": (n - 1) / n, "broadcast": 1.0, "reduce": 1.0, "sendrecv": 1.0}
    for name, factor in expect.items():
        assert COLLECTIVES[name].bus_factor(n) == pytest.approx(factor)


def test_bandwidths_use_1e9_bytes_per_gb():
    algbw, busbw = bandwidths(16 << 20, 1000.0, 1.5)  # 16 MiB in 1 ms
    assert algbw == pytest.approx((16 << 20) / 1e-3 / 1e9)
    assert busbw == pytest.approx(algbw * 1.5)
    assert bandwidths(0, 5.0, 2.0) == (0.0, 0.0)


def test_summarize_aggregates_over_ranks_then_iterations():
    times = [[1000, 3000, 2000], [4000, 4000, 4000]]  # ns: rank 0 mean 2 us, rank 1 mean 4 us
    s = summarize(times, "avg")
    assert s["time_us"] == pytest.approx(3.0)
    assert (s["time_us_min_rank"], s["time_us_max_rank"], s["slowest_rank"]) == (2.0, 4.0, 1)
    assert s["min_us"] == pytest.approx(2.5) and s["max_us"] == pytest.approx(3.5)
    assert s["p50_us"] == pytest.approx(3.0)
    assert s["per_rank"][0]["p50_us"] == pytest.approx(2.0)
    assert summarize(times, "max")["time_us"] == pytest.approx(4.0)
    assert summarize(times, "min")["time_us"] == pytest.approx(2.0)
    assert summarize(times, "max")["p99_us"] == pytest.approx(4.0)
