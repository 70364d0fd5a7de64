"""`commprof run --torch-profiler DIR`: one Kineto trace per rank with what Holistic Trace Analysis
reads — distributedInfo (backend, rank, world_size) and one ProfilerStep per measured iteration — on gloo
(written by Kineto) and MPI (added by commprof); commprof's ranges in it as user annotations, range for
range what commprof's own trace of the same run holds. (The annotator's Kineto sink, in one process:
tests/unit/test_kineto_sink.py.)"""

import json
from collections import Counter
from pathlib import Path

import pytest
from spawn import commprof
from test_trace import trace_spans

from commprof.record import trace
from commprof.record.annotate import MEASURED

UNWARMED = "Profiler won't be using warmup"


def load(directory: Path, rank: int) -> dict:
    (path,) = directory.glob(f"rank{rank}.*.pt.trace.json")
    return json.loads(path.read_text())


def profiler_steps(doc: dict) -> dict[str, dict]:
    return {e["name"]: e for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}


@pytest.mark.parametrize("backend,warmup", [("gloo", 2), ("mpi", 1), ("gloo", 0)])
def test_one_kineto_trace_per_rank_of_the_measured_iterations(tmp_path, backend, warmup):
    out, steps = tmp_path / "kineto", 4
    proc = commprof("run", "--strategy", "ddp", "--backend", backend, "--nproc", "2", "--steps", str(steps),
                    "--warmup", str(warmup), "--batch-size", "8", "--eval-samples", "0", "--torch-profiler", str(out))
    assert proc.returncode == 0, proc.stderr
    # the profiler warms up on the last warm-up iteration; with none, torch's own warning stays (it is true)
    assert (UNWARMED in proc.stderr) == (warmup == 0), proc.stderr
    for rank in (0, 1):
        doc = load(out, rank)
        info = doc["distributedInfo"]
        assert (info["rank"], info["world_size"]) == (rank, 2) and info["backend"] == backend
        assert set(profiler_steps(doc)) == {f"ProfilerStep#{k}" for k in range(warmup, steps)}
        iterations = {e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("iteration ")}
        assert iterations == {f"iteration {k}" for k in range(warmup, steps)}


def kineto_spans(doc: dict, names: set[str], step: dict) -> list[tuple[str, int]]:
    """commprof's ranges (user annotations named in `names`) inside one ProfilerStep, on its thread, as
    (name, depth among them) in start order."""
    end = step["ts"] + step["dur"]
    xs = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                 and e["tid"] == step["tid"] and e["name"] in names and step["ts"] <= e["ts"] <= end),
                key=lambda e: (e["ts"], -e["dur"]))
    out, ends = [], []
    for e in xs:
        while ends and ends[-1] <= e["ts"]:
            ends.pop()
        out.append((e["name"], len(ends)))
        ends.append(e["ts"] + e["dur"])
    return out


def chrome_iterations(spans: list[tuple]) -> dict[str, list[tuple[str, int]]]:
    """commprof's Chrome trace spans, grouped by `iteration k`, as (name, depth from that iteration)."""
    out: dict[str, list] = {}
    current, base = [], 0
    for name, category, depth, _ in spans:
        if category == "iteration" and name.startswith("iteration "):
            current, base = out.setdefault(name, []), depth
        if name != MEASURED:
            current.append((name, depth - base))
    return out


def test_commprof_ranges_in_kineto_as_in_its_own_trace(tmp_path):
    steps, warmup = 4, 2
    proc = commprof("run", "--strategy", "ddp", "--nproc", "2", "--steps", str(steps), "--warmup", str(warmup),
                    "--bucket-mb", "0.04", "--batch-size", "8", "--eval-samples", "0",
                    "--torch-profiler", str(tmp_path / "kineto"), "--trace", str(tmp_path / "trace"))
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        doc = load(tmp_path / "kineto", rank)
        _, spans = trace_spans(trace.load(tmp_path / "trace" / f"rank{rank}.trace.json"))
        mine = chrome_iterations(spans)
        names = {name for ranges in mine.values() for name, _ in ranges}
        for k in range(warmup, steps):
            step = profiler_steps(doc)[f"ProfilerStep#{k}"]
            seen = kineto_spans(doc, names, step)
            assert seen == mine[f"iteration {k}"]  # names, nesting, order and so counts: range for range
            phases = [name for name, depth in seen if depth == 1 and not name.startswith("wait ")]
            assert phases == ["data", "forward", "backward", "step"], seen
            waits = [name for name, depth in seen if name.startswith("wait ")]
            # every op commprof names is one torch's gloo backend ran in the same step (on its own threads)
            ops = Counter(name.split()[0] for name, depth in seen if depth > 1 and not name.startswith("wait "))
            end = step["ts"] + step["dur"]
            gloo = Counter(e["name"].removeprefix("gloo:") for e in doc["traceEvents"]
                           if e.get("name", "").startswith("gloo:") and step["ts"] <= e["ts"] <= end)
            assert ops == gloo and ops["all_reduce"] > 1, (ops, gloo)
            assert waits == ["wait all_reduce (world)"] * ops["all_reduce"]  # DDP waits on each bucket once
