"""`tensor` and commprof's pipelines (gpipe, 1f1b) on transformers, image heads and frozen backbones, in process
on a fake Comm (tests/support/fake_worker.py runs tests/strategy_worker.py's check on a FakeWorld): each trains
to `single`'s parameters on the same global batch, every rank's payload per step equals its prediction, and
the bytes are the closed forms written out below. The jobs keep one real gloo run of each grid
(tests/test_tensor.py, tests/test_pipeline.py: dp × tp and dp × pp on four ranks), the calibrated bubble, and
torch's own pipelining.

    pytest tests/unit/test_fake_comm_models.py
"""

from __future__ import annotations

import pytest
from support.fake_worker import worker_rows

BLOCK_ACTIVATION = 4 * 16 * 32 * 4
"""gpt2-tiny/bert-tiny in the worker: batch 4 × seq_len 16 positions × d_model 32, fp32, 2 blocks."""
PIPES = ["pipeline-gpipe", "pipeline-1f1b"]


def tensor_row(nproc: int, **spec) -> dict:
    (row,) = worker_rows(nproc, **{"strategies": ["tensor"], "replicas": 1, **spec})
    return row


# ---- tensor: one all_reduce forward and one backward per row-parallel layer --------------------------------
@pytest.mark.parametrize("model,nproc,spec,all_reduces", [
    ("gpt2-tiny", 4, {}, 4),  # per block: attention and MLP, one all_reduce forward and one backward each
    ("bert-tiny", 2, {}, 4),
    # recomputing a block in backward runs its 2 forward all_reduces again; 2 micro-batches of 2
    ("gpt2-tiny", 2, {"grad_accum": 2, "checkpoint": True}, 6),
])
def test_transformer_matches_single(model, nproc, spec, all_reduces):
    row = tensor_row(nproc, model=model, extra={"tp": nproc}, **spec)
    assert row["measured"] == {"all_reduce (tp)": 2 * all_reduces * BLOCK_ACTIVATION}


def test_bf16_sends_the_matmul_outputs_in_bf16():
    row = tensor_row(2, model="gpt2-tiny", extra={"tp": 2, "precision": "bf16"}, atol=1e-3)
    # forward: row-parallel outputs in bf16 (2 bytes); backward: gradients of fp32 LayerNorm outputs
    assert row["measured"] == {"all_reduce (tp)": 2 * (2 * BLOCK_ACTIVATION // 2 + 2 * BLOCK_ACTIVATION)}


def test_image_heads():
    cnn = tensor_row(2, model="mnist-cnn", extra={"tp": 2})
    # batch 4: fc1's 320 inputs' gradient backward, fc2's 10 outputs forward
    assert cnn["measured"] == {"all_reduce (tp)": 4 * (320 + 10) * 4}
    frozen = tensor_row(2, model="squeezenet1_0", frozen=True, batch=2, steps=2, lr=0.01, extra={"tp": 2})
    # fc1 column, fc2 row (4096 outputs), fc3 whole; the frozen backbone's output needs no gradient
    assert frozen["measured"] == {"all_reduce (tp)": 2 * 4096 * 4}


# ---- pipelines: each boundary's activation forward and its gradient back, per micro-batch ---------------
def pipeline_rows(nproc: int, model: str, **extra) -> list[dict]:
    rows = worker_rows(nproc, strategies=PIPES, model=model, replicas=extra.get("dp", 1),
                       extra={"micro_batches": 2, **extra})
    for row in rows:
        assert all(got for got in row["measured_by_rank"])  # every stage moved bytes
    return rows


def test_two_stages_match_single_on_the_cnn_and_1f1b_holds_fewer_activations():
    rows = pipeline_rows(2, "mnist-cnn", micro_batches=4)
    for row in rows:
        bound = row["pipeline"]["boundaries"][0]
        assert bound["shape"] == [1, 20, 4, 4]  # conv2's pooled output of one micro-batch of 1
        per_step = 4 * bound["bytes_per_micro"]
        assert row["measured_by_rank"][0] == {"send (pp 0→1)": per_step, "recv (pp 0→1)": per_step}
        assert row["pipeline"]["layers"] == [[0, 1], [2, 3]]  # 5,280 vs 16,560 parameters
    gpipe, f1b1 = (row["pipeline"] for row in rows)
    per_micro = gpipe["activation_bytes_per_micro"][0]
    assert per_micro > 0 and f1b1["activation_bytes_per_micro"][0] == per_micro
    assert gpipe["peak_activation_bytes"] == 4 * per_micro  # stage 0 holds all 4 micro-batches
    assert f1b1["peak_activation_bytes"] == 2 * per_micro  # 1F1B: at most p − s = 2


def test_three_stages_by_measured_time_on_gpt2():
    rows = pipeline_rows(3, "gpt2-tiny", balance="time")
    # micro-batch 2 × 16 tokens × d_model 32 × fp32 per boundary, twice per step each way
    act = 2 * 16 * 32 * 4
    middle = rows[0]["measured_by_rank"][1]
    assert middle == {"recv (pp 0→1)": 2 * act, "send (pp 0→1)": 2 * act,
                      "recv (pp 1→2)": 2 * act, "send (pp 1→2)": 2 * act}


def test_four_stages_and_a_frozen_first_stage():
    rows = pipeline_rows(4, "gpt2-tiny")
    assert [len(r["measured_by_rank"]) for r in rows] == [4, 4]
    (frozen,) = worker_rows(2, strategies=["pipeline-gpipe"], model="squeezenet1_0", frozen=True, batch=2, steps=2,
                            lr=0.01, replicas=1, extra={"micro_batches": 2, "cuts": [1]})
    # the frozen backbone trains nothing, so no gradient goes back to it
    boundary = frozen["pipeline"]["boundaries"][0]
    assert frozen["measured_by_rank"][0] == {"send (pp 0→1)": 2 * boundary["bytes_per_micro"]}
    assert frozen["held_bytes"]["grads"] == 0
