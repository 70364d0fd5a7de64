"""--bind-cores (commprof/base/world.py bind_cores): each rank of a host on its own run of the cores the job may use,
as every rank's env in the JSON says, under commprof's launcher and under mpiexec, for profile and bench; and
more ranks than cores is one line and exit 2, before any rank starts."""

import json
import os
from pathlib import Path

import pytest
from spawn import commprof

SCRIPTS = Path(__file__).with_name("scripts")
CORES = sorted(os.sched_getaffinity(0))


def _shares(nproc: int) -> list[list[int]]:
    share = len(CORES) // nproc
    return [CORES[r * share:(r + 1) * share] for r in range(nproc)]


@pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores")
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_each_rank_runs_on_its_own_cores(tmp_path, backend):
    out = tmp_path / "p.json"
    proc = commprof("profile", "--nproc", "2", "--backend", backend, "--bind-cores", "--json", str(out), "--",
                    str(SCRIPTS / "collectives.py"), "--steps", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["env"]["cores"] == _shares(2)
    # unbound (the default): every rank may run anywhere
    proc = commprof("profile", "--nproc", "2", "--backend", backend, "--json", str(out), "--",
                    str(SCRIPTS / "collectives.py"), "--steps", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["env"]["cores"] == [CORES, CORES]


@pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores")
def test_bench_ranks_are_bound_too(tmp_path):
    out = tmp_path / "b.json"
    proc = commprof("bench", "all_reduce", "--nproc", "2", "--bind-cores", "-b", "1K", "-e", "1K",
                    "-n", "2", "-w", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["env"]["cores"] == _shares(2)


def test_more_ranks_than_cores_is_one_line_exit_2(tmp_path):
    nproc = len(CORES) + 1
    proc = commprof("profile", "--nproc", str(nproc), "--bind-cores", "--", str(SCRIPTS / "collectives.py"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--bind-cores" in lines[0] and f"{nproc} ranks" in lines[0], proc.stderr
