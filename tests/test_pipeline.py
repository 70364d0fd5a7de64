"""Pipelines: GPipe and 1F1B train to the parameters of `single` on a dp × pp grid of real gloo ranks, moving
exactly the predicted activation bytes (2, 3 and 4 stages, time balance and a frozen first stage run in process
on a fake Comm: tests/unit/test_fake_comm_models.py); the bubble of a calibrated pipeline matches
(p − 1)/(m + p − 1); bad input fails in one line. (Schedules and partitions as pure functions:
tests/unit/test_partition_schedule.py.)"""

import json
import sys
from pathlib import Path

import pytest
from invariants import check_run
from spawn import commprof, spawn
from test_strategies import run_worker

HERE = Path(__file__).parent
PIPES = ["pipeline-gpipe", "pipeline-1f1b"]


def _pipeline_rows(nproc: int, model: str, **extra) -> list[dict]:
    replicas = extra.get("dp", 1)
    spec = {"model": model, "replicas": replicas, "extra": {"micro_batches": 2, **extra}}
    rows = run_worker(nproc, "gloo", strategies=PIPES, **spec)
    for row in rows:
        assert row["max_abs_diff"] <= 2e-5, row
        assert all(got for got in row["measured_by_rank"])  # every stage moved bytes
    return rows


def test_hybrid_dp_by_pp_on_four_ranks():
    rows = _pipeline_rows(4, "mnist-cnn", dp=2, pp=2)
    for row in rows:
        keys = set(row["measured_by_rank"][0])
        assert keys == {"send (pp 0→1)", "recv (pp 0→1)", "all_reduce (dp)"}
        assert row["measured_by_rank"][0]["all_reduce (dp)"] == (260 + 5020) * 4  # stage 0: conv1 + conv2


def test_calibrated_bubble_matches_prediction():
    # both schedules in one job: four ranks start once
    proc = spawn([sys.executable, str(HERE / "bubble_worker.py"),
                  json.dumps({"schedules": list(PIPES), "micro_batches": [8]})], nproc=4, backend="gloo",
                 timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [(r["schedule"], r["micro_batches"]) for r in rows] == [(s, 8) for s in PIPES]
    for row in rows:
        for measured in row["measured"]:
            assert measured == pytest.approx(row["predicted"], rel=0.15), row


def test_run_reports_bubble_and_boundaries(tmp_path):
    out = tmp_path / "pipe.json"
    proc = commprof("run", "--strategy", "pipeline-1f1b", "--model", "mnist-cnn", "--nproc", "2", "--steps", "4",
                    "--micro-batches", "4", "--batch-size", "8", "--eval-samples", "64", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    check_run(doc)
    assert "bubble ms" in proc.stdout and "pp 0→1" in proc.stdout
    assert all("bubble_ms" in it and it["bubble_ms"] >= 0 for it in doc["iterations"])
    pipe = doc["pipeline"]
    assert pipe["predicted_bubble_fraction"] == pytest.approx(1 / 5)
    assert 0 < doc["summary"]["bubble_fraction"] < 1
    b = pipe["boundaries"][0]
    assert b["activation_bytes_per_step"] == b["predicted_activation_bytes_per_step"] == 4 * 2 * 20 * 4 * 4 * 4
    assert [s["peak_micro_batches_in_flight"] for s in pipe["per_stage"]] == [2, 1]
    assert doc["metrics"]["accuracy"] is not None and doc["metrics"]["eval_samples"] == 64
    assert doc["volume"]["send (pp 0→1)"]["payload_bytes_per_step"] == b["activation_bytes_per_step"]


@pytest.mark.parametrize("args, message", [
    # known only once a rank has built the model: the ranks' error, said once (5 stages: a unit test,
    # tests/unit/test_partition_schedule.py)
    (["--stages", "2", "--nproc", "2", "--cuts", "9"],
     "--cuts 9 must increase strictly within 1…3 (the model has 4 layers)"),
    (["--stages", "2", "--micro-batches", "3"], "--batch-size 32 is not divisible by --micro-batches 3"),
    (["--stages", "2", "--dp", "2", "--nproc", "2"], "must equal the 2 ranks"),
    (["--stages", "2", "--cuts", "a"], "comma-separated"),
])
def test_bad_pipeline_input_fails_in_one_line(args, message):
    proc = commprof("run", "--strategy", "pipeline-gpipe", "--model", "mnist-cnn", "--steps", "3", *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_stages_flag_is_refused_by_data_parallel_strategies():
    proc = commprof("run", "--strategy", "ddp", "--stages", "2", "--steps", "3")
    assert proc.returncode == 2 and "--stages does not apply to strategy ddp" in proc.stderr


@pytest.mark.parametrize("nproc,model", [(2, "mnist-cnn"), (3, "gpt2-tiny")])
def test_torch_pipeline_schedules_match_single(nproc, model):
    spec = {"model": model, "replicas": 1, "batch": 4, "extra": {"micro_batches": 4}}
    rows = run_worker(nproc, "gloo", strategies=["torch-pipeline-gpipe", "torch-pipeline-1f1b"], **spec)
    for row in rows:  # the worker also checks measured == predicted on every rank
        assert row["max_abs_diff"] <= 2e-5, row
        act = row["pipeline"]["boundaries"][0]["bytes_per_micro"]
        assert row["measured_by_rank"][0] == {"send (pp)": 4 * act, "recv (pp)": 4 * act}
