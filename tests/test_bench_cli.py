"""`commprof bench` end to end: real ranks on gloo and MPI, the JSON parsed and checked, every bad input."""

import csv
import json

import pytest
from spawn import commprof, env_for_tests
from support.nccl_log import parse

from commprof.bench.collectives import COLLECTIVES
from commprof.comm import free_port

KEYS = {"collective", "backend", "world_size", "dtype", "redop", "inplace", "nbytes", "count", "time_us",
        "algbw_GBps", "busbw_GBps", "wrong", "time_us_min_rank", "time_us_max_rank", "slowest_rank",
        "p50_us", "p99_us", "times_us", "per_rank"}
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}


# Every backend and every world size 1-4 once (tests/test_comm.py runs six pairs op by op): a rank
# alone, the non-power-of-two rounding, and oversubscription.
@pytest.mark.parametrize("backend,nproc", [("gloo", 1), ("mpi", 2), ("gloo", 3), ("mpi", 4)])
def test_sweep_every_collective(tmp_path, backend, nproc):
    out, table = tmp_path / "r.json", tmp_path / "r.csv"
    proc = commprof("bench", "--backend", backend, "--nproc", str(nproc), "-b", "8", "-e", "4K", "-f", "8",
                    "-n", "3", "-w", "1", "-d", "float32,int8", "--json", str(out), "--csv", str(table))
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    env = doc["env"]
    assert (env["backend"], env["world_size"], env["clock"]) == (backend, nproc, "cpu")
    assert env["oversubscribed"] == (nproc > 2) or env["slots_per_host"] != 2
    assert len(env["devices"]) == nproc and env["hosts"]
    assert env.get("mpi_thread_level") == ("funneled" if backend == "mpi" else None)  # MPICH locks under multiple
    results = doc["results"]
    assert {r["collective"] for r in results} == set(COLLECTIVES)
    for rec in results:
        assert KEYS <= rec.keys()
        assert rec["wrong"] == 0, rec
        assert rec["world_size"] == nproc and rec["backend"] == backend
        assert len(rec["times_us"]) == nproc and all(len(row) == 3 for row in rec["times_us"])
        assert rec["time_us_min_rank"] <= rec["time_us"] <= rec["time_us_max_rank"]
        assert rec["p50_us"] <= rec["p99_us"]
        if rec["collective"] == "barrier":
            continue
        esize = 4 if rec["dtype"] == "float32" else 1
        assert rec["nbytes"] == rec["count"] * esize
        if rec["collective"] in ("all_gather", "reduce_scatter", "all_to_all"):
            assert rec["count"] % nproc == 0  # rounded as nccl-tests does
        assert rec["algbw_GBps"] == pytest.approx(rec["nbytes"] / (rec["time_us"] * 1e3))
        factor = FACTOR.get(rec["collective"], lambda n: 1.0)(nproc)
        assert rec["busbw_GBps"] == pytest.approx(rec["algbw_GBps"] * factor)
    rows = list(csv.DictReader(table.open()))
    assert len(rows) == len(results)
    # the table: nccl-tests' columns and one line per collective
    for word in ("out-of-place", "in-place", "algbw (GB/s)", "busbw (GB/s)", "#wrong", "count", "redop"):
        assert word in proc.stdout
    if nproc > 2:
        assert "OVERSUBSCRIBED" in proc.stdout
    if nproc == 3:
        assert "rounded down to multiples of 3 ranks" in proc.stdout


def test_all_ops_and_dtypes_skip_what_the_backend_lacks(tmp_path):
    out = tmp_path / "r.json"
    proc = commprof("bench", "all_reduce", "--backend", "mpi", "--nproc", "2", "-b", "64", "-e", "64",
                    "-n", "2", "-w", "0", "-o", "all", "-d", "all", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())["results"]
    combos = {(r["dtype"], r["redop"]) for r in results}
    assert ("float16", "prod") in combos and ("uint8", "max") in combos
    assert not any(op == "avg" or dt == "bfloat16" for dt, op in combos)  # MPI has neither
    assert "skipped, MPI has no avg reduce op" in proc.stdout
    assert all(r["wrong"] == 0 for r in results)


@pytest.mark.parametrize("args,message", [
    (["nonsense"], "unknown collective 'nonsense'"),
    (["-d", "float8"], "unknown dtype 'float8'"),
    (["-o", "mulsum"], "reduce op mulsum: nccl-tests' mulsum is NCCL's PREMUL_SUM"),
    (["-o", "xor"], "unknown reduce op 'xor'"),
    (["-b", "1M", "-e", "1K"], "-b 1048576 is larger than -e 1024"),
    (["-b", "12Q"], "cannot read size '12Q'"),
    (["-n", "0"], "-n 0 must be at least 1"),
    (["--backend", "mpi", "-o", "avg"], "MPI has no avg reduce op"),
    (["--backend", "mpi", "-d", "bfloat16"], "MPI has no bfloat16 reductions"),
    (["-o", "avg", "-d", "int32", "all_reduce"], "gloo has no avg reduction for int32"),
    (["--backend", "nccl"], "backend nccl needs a CUDA GPU"),
    (["--backend", "tcp"], "invalid choice: 'tcp'"),
    (["--backend", "mpi", "--device", "cuda"], "--device cuda needs --backend gloo or nccl"),
    (["--device", "gpu"], "invalid choice: 'gpu'"),
    (["--nproc", "2", "--root", "5"], "--root 5 is outside 0..1"),
    (["--format", "nccl-tests", "--algo", "library,ring"], "--format nccl-tests prints the library's collectives"),
    (["--format", "nccl-tests", "--group-sizes", "1"], "nccl-tests prints one communicator of every rank, as "
                                                       "nccl-tests runs: drop --group-sizes"),
    (["--format", "nccl-tests", "barrier"], "nccl-tests has no barrier test"),
    (["--format", "nccl"], "argument --format: invalid choice: 'nccl'"),
    (["--format", "nccl-tests", "--nproc", "1,2"], "--format nccl-tests prints one job's text: a grid (--nproc)"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    proc = commprof("bench", "-e", "64", *args)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commprof: error:"), proc.stderr
    assert message in lines[0]


def test_missing_peer_at_rendezvous_times_out():
    port = str(free_port())
    env = env_for_tests(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    proc = commprof("bench", "all_reduce", "-e", "64", "--timeout", "2", env=env, timeout=60)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[-1].startswith(f"commprof: error: rank 0: rendezvous at 127.0.0.1:{port}"), proc.stderr
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr


def test_mpi_thread_level_follows_mpi4pys_variable(tmp_path):
    out = tmp_path / "r.json"
    proc = commprof("bench", "broadcast", "--backend", "mpi", "--nproc", "2", "-b", "8", "-e", "8", "-n", "1",
                    "-w", "0", "--json", str(out), env=env_for_tests(MPI4PY_RC_THREAD_LEVEL="multiple"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["env"]["mpi_thread_level"] == "multiple"


def test_format_nccl_tests_is_what_nccl_tests_parsers_read():
    proc = commprof("bench", "all_reduce", "--backend", "gloo", "--nproc", "2", "-b", "8", "-e", "64K", "-f", "8",
                    "-n", "5", "-w", "1", "--format", "nccl-tests")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not any("\u2500" <= ch <= "\u257f" for ch in proc.stdout), proc.stdout  # no Rich box drawing
    [run] = parse(proc.stdout)
    assert [row.size for row in run.rows] == [8, 64, 512, 4096, 32768]
    assert all((row.count, row.type, row.redop, row.root) == (row.size // 4, "float", "sum", -1) for row in run.rows)
    # gloo has no out-of-place all_reduce: blank columns, read as such, and said on stderr
    assert all(row.out_of_place is None and row.in_place.wrong == 0 and row.in_place.time_us > 0 for row in run.rows)
    assert "all_reduce: the out-of-place columns are blank: torch.distributed has no out-of-place all_reduce" \
        in proc.stderr
    assert (run.out_of_bounds, run.ok) == (0, True) and run.avg_busbw >= 0
    lines = proc.stdout.splitlines()
    assert lines[0] == ("# nThread 1 nGpus 1 minBytes 8 maxBytes 65536 step: 8(factor) warmup iters: 1 iters: 5 "
                        "agg iters: 1 validation: 1 graph: 0")
    ranks = [ln for ln in lines if ln.startswith("#  Rank ")]
    assert [ln.split()[2] for ln in ranks] == ["0", "1"] and all(" device -1 [cpu] " in ln for ln in ranks)
    assert lines[-2:] == ["#", ""]
