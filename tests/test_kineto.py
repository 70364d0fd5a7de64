"""`commprof run --torch-profiler DIR`: one Kineto trace per rank with what Holistic Trace Analysis
reads — distributedInfo (backend, rank, world_size) and one ProfilerStep per iteration — on gloo
(written by Kineto) and MPI (added by commprof)."""

import json

import pytest
from spawn import commprof


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_one_kineto_trace_per_rank_with_distributed_info(tmp_path, backend):
    out = tmp_path / "kineto"
    proc = commprof("run", "--strategy", "ddp", "--backend", backend, "--nproc", "2", "--steps", "3", "--warmup", "1",
                    "--batch-size", "8", "--eval-samples", "0", "--torch-profiler", str(out))
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        (path,) = out.glob(f"rank{rank}.*.pt.trace.json")
        doc = json.loads(path.read_text())
        info = doc["distributedInfo"]
        assert (info["rank"], info["world_size"]) == (rank, 2) and info["backend"] == backend
        steps = {e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
        assert steps == {"ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"}
