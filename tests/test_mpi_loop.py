"""The minimal loops benchmarks/vs_c.py compares commprof with: benchmarks/baseline/mpi_loop.c (built with the venv's
mpicc), vs_c.py's bare mpi4py loop and its bare torch.distributed loop on gloo, 2 ranks, a few small sizes,
2 iterations. Their JSON lines are well formed, their times positive, and their rows — (collective,
bytes, mode), after rounding — exactly those `commprof bench` plans for the same sizes and backend."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spawn import env_for_tests, spawn

from commprof.bench.config import BenchConfig
from commprof.bench.runner import plan

ROOT = Path(__file__).resolve().parents[1]
MPICC = Path(sys.executable).parent / "mpicc"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
SIZES = (4, 7, 8, 12, 1024)
"""4 B rounds to nothing for all_gather/reduce_scatter on 2 ranks, 7 B down to 4 or 0, 12 B to 8 (a repeat)."""


def expected_rows(backend: str) -> list[tuple[str, int, bool]]:
    rows = []
    for size in SIZES:  # one plan per size: the loops take a list, bench a range
        cfg = BenchConfig(COLLECTIVES, backend=backend, min_bytes=size, max_bytes=size)
        rows += [(p.collective.name, p.count * 4, m) for p in plan(cfg, 2).points for m in p.modes]
    seen, unique = set(), []
    for row in sorted(rows, key=lambda r: COLLECTIVES.index(r[0])):  # a sweep: collective by collective
        if row not in seen:
            seen.add(row)
            unique.append(row)
    return unique


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    if not MPICC.exists():
        pytest.skip(f"no mpicc next to this Python ({MPICC}): the mpich wheel is not installed")
    out = tmp_path_factory.mktemp("mpi_loop") / "mpi_loop"
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "baseline" / "build_mpi_loop.sh"), str(out)],
                          env={**os.environ, "MPICC": str(MPICC)}, capture_output=True, text=True)
    if proc.returncode:
        pytest.skip("benchmarks/baseline/mpi_loop.c does not build here (no C compiler for mpicc?): "
                    f"{proc.stderr[-500:]}")
    return out


def check(stdout: str, backend: str = "mpi") -> list[dict]:
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert [(r["collective"], r["nbytes"], r["inplace"]) for r in lines] == expected_rows(backend)
    for r in lines:
        assert r["time_us"] > 0 and r["median_us"] > 0 and r["iters"] == 2, r
    return lines


@pytest.mark.parametrize("level", ["single", "funneled", "multiple"])
def test_c_loop(binary, level):
    sizes = ",".join(map(str, SIZES))
    proc = spawn([str(binary), "-s", sizes, "-n", "2", "-w", "1", "--thread", level], nproc=2, backend="mpi",
                 timeout=30)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for r in check(proc.stdout):
        assert r["world_size"] == 2 and r["thread"] == level and r["thread_provided"] == level
        assert [p["rank"] for p in r["per_rank"]] == [0, 1] and all(p["mean_us"] > 0 for p in r["per_rank"])


def test_c_loop_refuses_bad_options(binary):
    proc = spawn([str(binary), "--thread", "several"], nproc=2, backend="mpi", timeout=30)
    assert proc.returncode != 0 and "--thread takes single" in proc.stderr


def test_mpi4py_loop():
    sizes = ",".join(map(str, SIZES))
    proc = spawn([sys.executable, str(ROOT / "benchmarks" / "vs_c.py"), "--sizes", sizes, "-n", "2", "-w", "1",
                  "--worker", "mpi4py"], nproc=2, backend="mpi", timeout=30,
                 env=env_for_tests(MPI4PY_RC_THREAD_LEVEL="funneled"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(r["thread_provided"] == "funneled" for r in check(proc.stdout))


def test_torch_loop():
    sizes = ",".join(map(str, SIZES))
    proc = spawn([sys.executable, str(ROOT / "benchmarks" / "vs_c.py"), "--sizes", sizes, "-n", "2", "-w", "1",
                  "--worker", "torch"], nproc=2, backend="gloo", timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(r["thread_provided"] is None for r in check(proc.stdout, "gloo"))
