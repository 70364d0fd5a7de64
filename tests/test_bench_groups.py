"""`commprof bench --group-sizes` under the tests' own 4-rank launch (torchrun's variables, or mpiexec): the
first k ranks measure while the others wait, or every disjoint group of k measures at once (--concurrent).
Records carry their group, the arithmetic over groups is checked, the trace shows which ranks ran what."""

import json
import statistics
import sys

import pytest
from spawn import commprof, env_for_tests, spawn

BENCH = [sys.executable, "-m", "commprof", "bench"]
SMALL = ["-b", "8", "-e", "4K", "-f", "32", "-n", "3", "-w", "1"]
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def _mean_of_rank_means(rows):
    return statistics.fmean(statistics.fmean(row) for row in rows)


def _events(trace_dir):
    doc = json.loads((trace_dir / "trace.json").read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if e.get("ph") == "X"]


def test_first_k_ranks_of_a_four_rank_launch(tmp_path):
    out, trace = tmp_path / "g.json", tmp_path / "trace"
    proc = spawn([*BENCH, "all_reduce", "all_gather", "broadcast", "--group-sizes", "1,2,4", *SMALL,
                  "--json", str(out), "--trace", str(trace)], nproc=4, backend="gloo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert {(r["group_size"], r["groups"], r["world_size"], r["concurrent"]) for r in results} == {
        (1, 1, 4, False), (2, 1, 4, False), (4, 1, 4, False)}
    for rec in results:
        k = rec["group_size"]
        assert rec["wrong"] == 0, rec
        assert len(rec["times_us"]) == k  # only the group's ranks timed anything
        assert rec["time_us"] == pytest.approx(_mean_of_rank_means(rec["times_us"]))
        assert rec["bus_factor"] == pytest.approx(FACTOR[rec["collective"]](k))
        if rec["collective"] == "all_gather":
            assert rec["count"] % k == 0  # rounded for the group, not the job
    # the same sizes for every group size, so the scaling table has no holes where the sizes allow
    sizes = {k: {r["nbytes"] for r in results if r["collective"] == "broadcast" and r["group_size"] == k}
             for k in (1, 2, 4)}
    assert sizes[1] == sizes[2] == sizes[4] == {8, 256}
    assert "across rank counts" in proc.stdout and "2 ranks time (us)" in proc.stdout
    assert "all_reduce · gloo · 2 ranks of 4" in proc.stdout
    # who ran what: ranks 2 and 3 never touched the group of the first two, rank 1 did
    ran = {(e["pid"] - 1, e["name"].split(" (")[1].split(")")[0]) for e in _events(trace)  # rank r: pid r + 1
           if e["name"].startswith(("all_reduce (", "all_gather (", "broadcast ("))}
    assert {(0, "ranks0-1"), (1, "ranks0-1"), (3, "world")} <= ran
    assert not {(2, "ranks0-1"), (3, "ranks0-1"), (1, "rank0")} & ran


def test_concurrent_groups_measure_at_once(tmp_path):
    out = tmp_path / "c.json"
    proc = spawn([*BENCH, "all_reduce", "reduce_scatter", "--group-sizes", "2,4", "--concurrent", *SMALL,
                  "--json", str(out)], nproc=4, backend="gloo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    pairs = [r for r in results if r["group_size"] == 2]
    assert pairs and all(r["groups"] == 2 and r["concurrent"] for r in pairs)
    for rec in pairs:
        assert rec["wrong"] == 0
        assert len(rec["times_us"]) == 4 and len(rec["group_time_us"]) == 2
        # group g is ranks 2g, 2g+1: its time is theirs alone, the record's is over all four
        for g in range(2):
            assert rec["group_time_us"][g] == pytest.approx(_mean_of_rank_means(rec["times_us"][2 * g:2 * g + 2]))
            assert rec["group_busbw_GBps"][g] == pytest.approx(
                rec["nbytes"] / (rec["group_time_us"][g] * 1e3) * rec["bus_factor"])
        assert rec["time_us"] == pytest.approx(statistics.fmean(rec["group_time_us"]))
    whole = [r for r in results if r["group_size"] == 4]
    assert whole and all(r["groups"] == 1 and "group_time_us" not in r for r in whole)
    assert "2 groups of 2 ranks measured at once" in proc.stdout
    assert "2 groups of 2 time (us)" in proc.stdout  # the scaling table's column


def test_concurrent_groups_on_mpi_with_a_hand_written_algorithm(tmp_path):
    """Three ranks in groups of two: one pair measures, rank 2 waits; the ring's bytes are the pair's."""
    out = tmp_path / "m.json"
    proc = spawn([*BENCH, "all_reduce", "--backend", "mpi", "--algo", "library,ring", "--group-sizes", "2",
                  "--concurrent", *SMALL, "--json", str(out)], nproc=3, backend="mpi")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert {r["algo"] for r in results} == {"library", "ring"}
    for rec in results:
        assert (rec["group_size"], rec["groups"], rec["world_size"]) == (2, 1, 3)
        assert rec["wrong"] == 0 and len(rec["times_us"]) == 2
        if rec["algo"] == "ring":
            assert rec["sent_bytes"] == rec["sent_bytes_model"]
    assert "rank 2 waited while ranks0-1 measured" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--nproc", "2", "--group-sizes", "3"], "--group-sizes 3 is more than the 2 rank(s) of the job"),
    (["--nproc", "2", "--group-sizes", "0"], "--group-sizes 0 must be at least 1"),
    (["--nproc", "2", "--group-sizes", "2,x"], "--group-sizes 2,x: 'x' is not a whole number"),
    (["--nproc", "2", "--concurrent"], "--concurrent runs groups of --group-sizes ranks at once"),
    (["--nproc", "4", "--group-sizes", "2,4", "--root", "2"], "--root 2 is outside 0..1 of the smallest group"),
    (["--nproc", "2", "--groups", "rack"], "--groups 'rack': give intra, inter or intra,inter"),
    (["--nproc", "2", "--groups", "intra", "--group-sizes", "2"], "--groups and --group-sizes each lay out"),
    (["--nproc", "2", "--groups", "inter"], "--groups inter needs at least 2 hosts, this job runs on 1"),
])
def test_bad_group_sizes_are_one_line_exit_2(args, message):
    proc = commprof("bench", "all_reduce", "-e", "64", *args, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commprof: error:"), proc.stderr
    assert message in lines[0]


def test_group_larger_than_the_launch_is_one_line_exit_2():
    proc = spawn([*BENCH, "all_reduce", "-e", "64", "--group-sizes", "3"], nproc=2, backend="gloo",
                 env=env_for_tests(), timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert lines == ["commprof: error: --group-sizes 3 is more than the 2 rank(s) of the job"], proc.stderr
