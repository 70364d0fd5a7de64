"""`commprof run` end to end, as a user runs it: tables, JSON, saved state, real-format data, bad input."""

import json
import math

import numpy as np
import pytest
import torch
from invariants import check_run
from spawn import commprof
from support.idx_files import write_idx

FIGURES = ("wall_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "overlap_ms")


def run_json(tmp_path, *args, name="out.json"):
    out = tmp_path / name
    proc = commprof("run", *args, "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    check_run(doc)
    return doc, proc


def test_ddp_json_has_every_figure_per_rank_per_iteration(tmp_path):
    log = tmp_path / "live.jsonl"
    doc, proc = run_json(tmp_path, "--strategy", "ddp", "--model", "mnist-cnn", "--nproc", "2", "--steps", "5",
                         "--warmup", "1", "--batch-size", "16", "--samples", "1000", "--bucket-mb", "0.02",
                         "--live", "--live-window", "2", "--metrics-port", "off", "--live-log", str(log))
    assert {"env", "config", "iterations", "summary", "volume"} <= set(doc)
    assert "ms/iteration" not in proc.stderr  # the progress line is for a terminal only (tests/test_fit.py)
    assert len(doc["iterations"]) == 2 * 4
    for it in doc["iterations"]:
        assert set(FIGURES) <= set(it)
        assert it["overlap_ms"] <= min(it["compute_ms"], it["comm_ms"]) + 1e-9
        assert it["compute_ms"] + it["exposed_comm_ms"] <= it["wall_ms"] + 1e-9
    s = doc["summary"]
    assert set(FIGURES) | {"overlap_pct", "throughput", "peak_mem_bytes"} <= set(s)
    assert 0 <= s["overlap_pct"] <= 100
    assert s["throughput"] == pytest.approx(32 / (s["iteration_ms"] / 1e3))
    assert s["across_ranks"]["wall_ms"]["skew"] == pytest.approx(
        s["across_ranks"]["wall_ms"]["max"] - s["across_ranks"]["wall_ms"]["min"])
    assert doc["steps"]["per_epoch"] == math.ceil(1000 / 32)
    v = doc["volume"]["all_reduce"]
    assert v["payload_bytes_per_step"] == v["predicted_payload_bytes_per_step"] == 21840 * 4
    assert v["calls_per_step"] > 1  # 20 KiB buckets: several all_reduces per step
    assert v["wire_bytes_per_step"] == v["payload_bytes_per_step"]  # ring all_reduce at n=2: 2(n-1)/n = 1
    assert v["bytes_per_epoch"] == v["payload_bytes_per_step"] * doc["steps"]["per_epoch"]
    params = doc["summary"]["per_rank"][0]["held_bytes"]
    assert params["params"] == params["grads"] == 21840 * 4 and params["optimizer"] == 21840 * 4
    for words in ("wall ms", "exposed ms", "overlap %", "payload/step", "predicted", "samples/s"):
        assert words in proc.stdout
    # --live: the 4 measured steps in 2 windows of both ranks, their bytes the volume table's
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    windows = [x for x in lines if "end" not in x]
    assert [(w["first_step"], w["last_step"]) for w in windows] == [(1, 2), (3, 4)] and lines[-1]["end"] == "complete"
    for r in (0, 1):
        sent = sum(op["bytes"] for w in windows for op in w["ranks"][r]["ops"] if op["op"] == "all_reduce")
        assert sent == v["payload_bytes_per_step"] * 4


def test_saved_state_of_fsdp_equals_single(tmp_path):
    common = ["--model", "gpt2-tiny", "--steps", "3", "--warmup", "0", "--seq-len", "16", "--eval-samples", "0"]
    run_json(tmp_path, "--strategy", "single", "--batch-size", "8", *common, "--save-state", str(tmp_path / "a.pt"),
             name="a.json")
    doc, _ = run_json(tmp_path, "--strategy", "fsdp", "--nproc", "2", "--batch-size", "4", *common,
                      "--save-state", str(tmp_path / "b.pt"), name="b.json")
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=2e-5, rtol=1e-4)
    assert doc["metrics"]["loss"][0] > 0 and "tokens_per_s" in doc["summary"]


def test_real_mnist_files_one_epoch_with_accuracy(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 48), ("t10k", 20)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n, dtype=np.uint8))
    doc, proc = run_json(tmp_path, "--strategy", "zero2", "--nproc", "2", "--data", "mnist", "--data-dir",
                         str(tmp_path), "--epochs", "2", "--batch-size", "10", "--warmup", "1",
                         "--loss-threshold", "100")
    assert doc["steps"]["per_epoch"] == math.ceil(48 / 20) and doc["steps"]["total"] == 6
    assert doc["metrics"]["eval_samples"] == 20 and 0 <= doc["metrics"]["accuracy"] <= 1
    assert doc["metrics"]["steps_to_threshold"] == 1
    assert "held-out accuracy" in proc.stdout


# fp16's loss scaling on both kinds of gradient exchange (bf16's tensors on the wire: tests/test_tensor.py)
@pytest.mark.parametrize("strategy, precision", [("zero2", "fp16"), ("ddp", "fp16")])
def test_mixed_precision_runs(tmp_path, strategy, precision):
    doc, _ = run_json(tmp_path, "--strategy", strategy, "--model", "bert-tiny", "--nproc", "2", "--steps", "3",
                      "--warmup", "1", "--batch-size", "4", "--seq-len", "16", "--precision", precision)
    assert all(math.isfinite(x) for x in doc["metrics"]["loss"])
    if (strategy, precision) == ("zero2", "fp16"):  # zero2 all-reduces nothing but the agreed overflow flag
        assert doc["volume"]["all_reduce"]["payload_bytes_per_step"] == 4
    for op, v in doc["volume"].items():
        assert v["payload_bytes_per_step"] == v["predicted_payload_bytes_per_step"], op


def test_list_models():
    proc = commprof("run", "--list-models")
    assert proc.returncode == 0
    for name in ("mnist-cnn", "resnet18", "mobilenet_v2", "vgg16", "alexnet", "densenet121", "squeezenet1_0",
                 "gpt2", "bert"):
        assert name in proc.stdout


@pytest.mark.parametrize("args,words", [
    (["--strategy", "nope"], "unknown strategy 'nope'"),
    (["--model", "nope"], "unknown model 'nope'"),
    (["--batch-size", "10", "--grad-accum", "3"], "not divisible by --grad-accum 3"),
    (["--strategy", "fsdp", "--nproc", "1"], "fsdp shards over ranks and needs at least 2"),
    (["--strategy", "single", "--nproc", "2"], "single runs on one process"),
    (["--strategy", "mpi-dp", "--backend", "gloo"], "mpi-dp runs on --backend mpi"),
    (["--data", "mnist"], "give --data-dir"),
    (["--steps", "3", "--epochs", "1"], "not both"),
    (["--steps", "2", "--warmup", "2"], "leaves no measured step"),
    (["--model", "gpt2-tiny", "--data", "text", "--data-dir", "/nonexistent/input.txt"], "/nonexistent/input.txt"),
    (["--model", "resnet18", "--frozen-backbone", "--optimizer", "lamb"], "invalid choice: 'lamb'"),
    (["--model", "resnet18", "--head-width", "512"], "--head-width sizes the --frozen-backbone head"),
    (["--model", "resnet18", "--frozen-backbone", "--head-width", "0"], "--head-width must be at least 1"),
    (["--link-rate", "fast"], "cannot read rate 'fast' of --link-rate"),
    (["--link-rate", "intra=25GB/s"], "--link-rate intra=25GB/s: give a rate and a latency"),
    (["--link-rate", "/nonexistent/bench.json"], "/nonexistent/bench.json"),
])
def test_bad_input_is_one_line_exit_2(args, words):
    proc = commprof("run", "--nproc", "1", *args, "--steps", "3") if "--steps" not in args else commprof("run", *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commprof: error:") and words in lines[0], proc.stderr


def test_missing_data_file_is_one_line(tmp_path):
    proc = commprof("run", "--strategy", "ddp", "--nproc", "2", "--data", "mnist", "--data-dir", str(tmp_path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "train-images-idx3-ubyte" in lines[0], proc.stderr


def test_a_one_stage_pipeline_is_refused_before_any_rank_starts():
    for strategy in ("pipeline-gpipe", "torch-pipeline-1f1b"):
        proc = commprof("run", "--strategy", strategy, "--nproc", "1", "--steps", "3")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip() == f"commprof: error: strategy {strategy} needs at least 2 stages (--stages), got 1"
