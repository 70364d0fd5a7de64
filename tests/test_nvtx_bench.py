"""NVTX from `commprof bench`, seen by a real injection library (the mechanism Nsight Systems uses)."""

import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
from spawn import commprof, env_for_tests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
import nvtx_recorder  # noqa: E402


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the NVTX recorder")
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_every_measured_op_is_one_comm_range(tmp_path, backend):
    lib = nvtx_recorder.build(tmp_path)
    prefix = tmp_path / "rec"
    env = env_for_tests(**{k: v for k, v in nvtx_recorder.recorder_env(lib, prefix, {}).items()})
    proc = commprof("bench", "all_reduce", "all_gather", "--backend", backend, "--nproc", "2",
                    "-b", "1K", "-e", "1K", "-n", "4", "-w", "2", env=env)
    assert proc.returncode == 0, proc.stderr
    records = nvtx_recorder.read_records(prefix)
    pids = {r["pid"] for r in records if r["domain"] == "commprof"}
    assert len(pids) == 2  # one file per rank
    assert not nvtx_recorder.unbalanced(records)
    for pid in pids:
        pushes = Counter((r["category"], r["message"]) for r in records
                         if r["pid"] == pid and r["kind"] == "push" and r["domain"] == "commprof")
        # per mode: 1 checked run + 2 warm-up + 4 timed iterations
        all_reduce_modes = 2 if backend == "mpi" else 1  # torch has no out-of-place all_reduce
        assert pushes[("comm", "all_reduce (world) 1 KiB float32")] == 7 * all_reduce_modes
        assert pushes[("comm", "all_gather (world) 1 KiB float32")] == 7 * 2
        assert pushes[("iteration", "measured")] == 1  # the whole sweep: Nsight's capture range
        # each phase of each mode a range of its own around its ops: check, warm-up, timed
        modes = {"all_reduce": ("out-of-place", "in-place")[2 - all_reduce_modes:],
                 "all_gather": ("out-of-place", "in-place")}
        phases = {("iteration", f"{phase} {name} {mode}") for name, both in modes.items() for mode in both
                  for phase in ("check", "warm-up", "timed")}
        assert all(pushes[p] == 1 for p in phases)
        assert set(pushes) == {("comm", "all_reduce (world) 1 KiB float32"),
                               ("comm", "all_gather (world) 1 KiB float32"),
                               ("iteration", "measured")} | phases
