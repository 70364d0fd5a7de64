"""nccl-tests command lines through the `commprof` entry point users call: `all_reduce_perf` replaced by
`commprof bench all_reduce`, run for real on gloo (or refused, one line, when a flag has no meaning here);
what the flags asked is checked in the CSV and JSON the run writes, and in its NVTX ranges."""

import csv
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
from spawn import commprof, env_for_tests

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
import nvtx_recorder  # noqa: E402


def one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commprof: error: "), proc.stderr
    return lines[0]


@pytest.mark.parametrize("nccl_tests,words", [
    ("-b 8 -e 128M -f 2 -g 2", "-g 2: one GPU per rank: use --nproc 2"),
    ("-t 4 -g 1", "-t 4: one thread per rank: use --nproc 4"),
    ("-b 8 -e 1M -G 10", "-G 10: each op is issued by torch.distributed"),
    ("-p 1", "-p 1: every rank is a process of its own"),
    ("-a 4", "-a '4': give 0 (rank 0), 1 (avg), 2 (min), 3 (max)"),
    ("-r any", "--root 'any': give a rank or all"),
    ("-c -1", "-c -1 must be at least 0"),
    ("-m 0", "-m 0 must be at least 1"),
])
def test_flags_without_a_meaning_here_are_one_line(nccl_tests, words):
    assert words in one_error_line(commprof("bench", "all_reduce", *nccl_tests.split()))


def test_an_unknown_flag_keeps_argparses_error():
    assert "unrecognized arguments: --nope" in one_error_line(commprof("bench", "all_reduce", "--nope"))


def test_an_all_reduce_perf_command_line_runs(tmp_path):
    table, out = tmp_path / "out.csv", tmp_path / "out.json"
    proc = commprof("bench", "all_reduce", *"-b 8 -e 64K -f 2 -a 1 -c 1 -m 2 -z 0 -n 5 -w 1".split(),
                    "-F", str(table), "--json", str(out), "--backend", "gloo", "--nproc", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"csv: {table}" in proc.stderr.splitlines() and f"json: {out}" in proc.stderr.splitlines()
    results = json.loads(out.read_text())["results"]
    rows = list(csv.DictReader(table.open()))
    assert len(rows) == len(results) == 14  # 8 B … 64 KiB, ×2: 14 sizes, in-place only (torch has no other)
    assert [int(r["nbytes"]) for r in rows] == [8 << i for i in range(14)]
    for row, rec in zip(rows, results):
        assert (rec["agg"], rec["agg_iters"], rec["blocking"], rec["check_iters"]) == ("avg", 2, False, 1)
        assert (row["agg"], row["agg_iters"], row["blocking"], row["check_iters"]) == ("avg", "2", "False", "1")
        assert (row["iters"], row["warmup"], row["wrong"]) == ("5", "1", "0")
        assert all(len(times) == 5 for times in rec["times_us"])  # -n 5 iterations, each of -m 2 ops
        assert float(row["time_us"]) == pytest.approx(rec["time_us"])


def test_rank0_min_and_max_pick_from_the_same_per_rank_times(tmp_path):
    """-a 0 is rank 0's own mean, -a 2 and -a 3 the least and largest rank mean: the same raw times, read
    three ways, in three runs that each must agree with its own raw times."""
    for flag, pick in (("0", lambda means: means[0]), ("2", min), ("3", max)):
        out = tmp_path / f"a{flag}.json"
        proc = commprof("bench", "all_gather", "-b", "1K", "-e", "1K", "-n", "4", "-w", "1", "-a", flag,
                        "--nproc", "2", "--json", str(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
        for rec in json.loads(out.read_text())["results"]:
            means = [sum(row) / len(row) for row in rec["times_us"]]
            assert rec["time_us"] == pytest.approx(pick(means)), (flag, rec["time_us"], means)


def test_blocking_with_aggregation_runs_and_says_so(tmp_path):
    """-z 1 -m 4: -n iterations of four ops each, recorded as asked (how the ops nest: the NVTX test)."""
    out = tmp_path / "z1.json"
    proc = commprof("bench", "all_reduce", "-b", "4K", "-e", "4K", "-n", "8", "-w", "1", "--nproc", "2",
                    "-z", "1", "-m", "4", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rec,) = json.loads(out.read_text())["results"]
    assert (rec["blocking"], rec["agg_iters"], rec["wrong"]) == (True, 4, 0)
    assert [len(row) for row in rec["times_us"]] == [8, 8] and min(min(row) for row in rec["times_us"]) > 0


def test_every_root_in_turn(tmp_path):
    out, table = tmp_path / "r.json", tmp_path / "r.csv"
    proc = commprof("bench", "broadcast", "reduce", "all_reduce", "-r", "all", "-b", "64", "-e", "256", "-n", "2",
                    "-w", "0", "--nproc", "3", "--backend", "mpi", "--json", str(out), "--csv", str(table))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    for name in ("broadcast", "reduce"):
        roots = Counter(r["root"] for r in results if r["collective"] == name)
        assert set(roots) == {0, 1, 2} and len(set(roots.values())) == 1, roots  # the same rows for each root
    assert {r["root"] for r in results if r["collective"] == "all_reduce"} == {None}
    assert all(r["wrong"] == 0 for r in results)
    rows = list(csv.DictReader(table.open()))
    assert [row["root"] for row in rows] == ["" if r["root"] is None else str(r["root"]) for r in results]
    assert "# broadcast root 2 avg bus bandwidth" in proc.stdout


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the NVTX recorder")
def test_check_warm_up_and_timed_ranges_have_their_own_names(tmp_path):
    lib = nvtx_recorder.build(tmp_path)
    prefix = tmp_path / "rec"
    env = env_for_tests(**nvtx_recorder.recorder_env(lib, prefix, {}))
    proc = commprof("bench", "all_gather", "--backend", "gloo", "--nproc", "2", "-b", "1K", "-e", "1K",
                    "-n", "3", "-w", "2", "-c", "2", "-m", "2", "-z", "1", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [r for r in nvtx_recorder.read_records(prefix) if r["domain"] == "commprof"]
    assert not nvtx_recorder.unbalanced(records)
    for pid in {r["pid"] for r in records}:
        mine = [r for r in records if r["pid"] == pid]
        pushes = Counter(r["message"] for r in mine if r["kind"] == "push" and r["category"] == "iteration")
        phases = {f"{phase} all_gather {mode}" for phase in ("check", "warm-up", "timed")
                  for mode in ("out-of-place", "in-place")}
        assert set(pushes) == phases | {"measured"} and all(pushes[p] == 1 for p in phases), pushes
        ops = _ops_by_parent(mine)
        for mode in ("out-of-place", "in-place"):  # -c 2 checks; -w 2 and -n 3 iterations of -m 2 ops
            assert (ops[f"check all_gather {mode}"], ops[f"warm-up all_gather {mode}"],
                    ops[f"timed all_gather {mode}"]) == (2, 4, 6), ops


def _ops_by_parent(records: list[dict]) -> Counter:
    """How many comm ranges each phase range holds, from one process's push/pop sequence."""
    stack, held = [], Counter()
    for r in records:
        if r["kind"] == "push":
            if r["category"] == "comm" and stack:
                held[stack[-1]] += 1
            stack.append(r["message"])
        else:
            stack.pop()
    return held
