"""`commprof bench --algo`: the hand-written algorithms through the bench, end to end — same checks
and JSON as the library's rows plus bytes sent and the α–β model; NVTX step ranges; bad input."""

import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
from spawn import commprof, env_for_tests

from commprof import kernels

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
import nvtx_recorder  # noqa: E402


# through the bench at an odd and an even rank count; every algorithm at 1-4 ranks on both backends against
# the library and its closed form: tests/test_kernels.py
@pytest.mark.parametrize("backend,nproc", [("gloo", 3), ("mpi", 2)])
def test_every_algorithm_beside_the_library(tmp_path, backend, nproc):
    out = tmp_path / "r.json"
    proc = commprof("bench", "--algo", "all", "--backend", backend, "--nproc", str(nproc), "-b", "8", "-e", "64K",
                    "-f", "16", "-n", "2", "-w", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert all(r["wrong"] == 0 for r in results)
    seen = {(r["collective"], r["algo"]) for r in results}
    for collective, by_name in kernels.ALGORITHMS.items():
        assert (collective, "library") in seen
        assert {(collective, name) for name in by_name} <= seen
    p2p = [r for r in results if r["collective"] == "sendrecv"]
    assert p2p and results[:len(p2p)] == p2p  # the point-to-point sweep comes first
    for rec in results:
        if rec["algo"] == "library":
            assert "model_us" not in rec
            continue
        module = kernels.find(rec["collective"], rec["algo"])
        assert rec["sent_bytes"] == rec["sent_bytes_model"], rec["collective"] + "/" + rec["algo"]
        esize = rec["nbytes"] // rec["count"]
        assert rec["sent_bytes"] == [module.sent_bytes(nproc, r, rec["count"], esize, 0) for r in range(nproc)]
        fit = rec["alpha_beta"]
        assert fit["alpha_us"] >= 0 and fit["beta_ns_per_B"] >= 0 and fit["points"] >= 2
        want = module.cost(nproc, rec["nbytes"], fit["alpha_us"] * 1e-6, fit["beta_ns_per_B"] * 1e-9) * 1e6
        assert rec["model_us"] == pytest.approx(want)
        assert rec["time_over_model"] == pytest.approx(rec["time_us"] / want)
        assert rec["steps"] == module.steps(nproc, rec["nbytes"])
    assert "algorithm rabenseifner" in proc.stdout and "α–β model from this run's sendrecv sweep" in proc.stdout


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the NVTX recorder")
def test_each_algorithm_step_is_its_own_nvtx_range(tmp_path):
    lib = nvtx_recorder.build(tmp_path)
    prefix = tmp_path / "rec"
    env = env_for_tests(**nvtx_recorder.recorder_env(lib, prefix, {}))
    proc = commprof("bench", "all_reduce", "--algo", "ring", "--backend", "mpi", "--nproc", "3",
                    "-b", "1K", "-e", "1K", "-n", "4", "-w", "2", env=env)
    assert proc.returncode == 0, proc.stderr
    records = nvtx_recorder.read_records(prefix)
    assert not nvtx_recorder.unbalanced(records)
    pids = {r["pid"] for r in records if r["domain"] == "commprof"}
    assert len(pids) == 3
    for pid in pids:
        pushes = Counter((r["category"], r["message"]) for r in records
                         if r["pid"] == pid and r["kind"] == "push" and r["domain"] == "commprof")
        calls = (1 + 2 + 4) * 2  # (check + warm-up + timed) × out-of-place and in-place
        steps = {m for c, m in pushes if c == "kernel"}
        assert steps == {f"ring::{phase}::step{s}" for phase in ("reduce_scatter", "all_gather") for s in (0, 1)}
        assert all(pushes[("kernel", m)] == calls for m in steps)
        # 4 steps per call, each one sendrecv; the 1 KiB vector in 3 blocks of 344, 340, 340 B
        sendrecvs = sum(v for (c, m), v in pushes.items() if c == "comm" and m.startswith("sendrecv"))
        assert sendrecvs == 4 * calls + (1 + 2 + 4)  # plus the sendrecv sweep for the fit (one mode)


@pytest.mark.parametrize("args,message", [
    (["--algo", "nope"], "unknown algorithm 'nope'"),
    (["broadcast", "--algo", "bruck"], "--algo bruck implements all_gather, not broadcast"),
    (["all_reduce", "--algo", "ring", "-d", "int32", "-o", "avg"], "avg of integers"),
])
def test_bad_algorithm_input_is_one_line(args, message):
    proc = commprof("bench", "--nproc", "1", *args)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
