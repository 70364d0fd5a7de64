"""`tensor` trains to the parameters of `single` on the same global batch, and every rank's measured
payload per step equals its prediction (tests/strategy_worker.py checks each rank): transformers split
2 and 4 ways, image heads, the dp × tp grid, mixed precision. (Bad degrees, refused before any group:
tests/unit/test_tensor_degrees.py.)"""

import json
import sys
from pathlib import Path

import pytest
from spawn import spawn

HERE = Path(__file__).parent
# gpt2-tiny/bert-tiny in the worker: batch 4 × seq_len 16 positions × d_model 32, fp32, 2 blocks.
BLOCK_ACTIVATION = 4 * 16 * 32 * 4


def run_tensor(nproc: int, **spec) -> dict:
    spec = {"backend": "gloo", "strategies": ["tensor"], "replicas": 1, **spec}
    proc = spawn([sys.executable, str(HERE / "strategy_worker.py"), json.dumps(spec)], nproc=nproc,
                 backend="gloo", timeout=300)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]  # params and every rank's volume
    assert len(rows) == 1
    return rows[0]


@pytest.mark.parametrize("model,nproc,spec,all_reduces", [
    ("gpt2-tiny", 4, {}, 4),  # per block: attention and MLP, one all_reduce forward and one backward each
    ("bert-tiny", 2, {}, 4),
    # recomputing a block in backward runs its 2 forward all_reduces again; 2 micro-batches of 2
    ("gpt2-tiny", 2, {"grad_accum": 2, "checkpoint": True}, 6),
])
def test_transformer_matches_single(model, nproc, spec, all_reduces):
    row = run_tensor(nproc, model=model, extra={"tp": nproc}, **spec)
    assert row["max_abs_diff"] <= 2e-5
    assert row["measured"] == {"all_reduce (tp)": 2 * all_reduces * BLOCK_ACTIVATION}


def test_bf16_sends_the_matmul_outputs_in_bf16():
    row = run_tensor(2, model="gpt2-tiny", extra={"tp": 2, "precision": "bf16"}, atol=1e-3)
    # forward: row-parallel outputs in bf16 (2 bytes); backward: gradients of fp32 LayerNorm outputs
    assert row["measured"] == {"all_reduce (tp)": 2 * (2 * BLOCK_ACTIVATION // 2 + 2 * BLOCK_ACTIVATION)}


def test_image_heads():
    cnn = run_tensor(2, model="mnist-cnn", extra={"tp": 2})
    assert cnn["max_abs_diff"] <= 2e-5
    # batch 4: fc1's 320 inputs' gradient backward, fc2's 10 outputs forward
    assert cnn["measured"] == {"all_reduce (tp)": 4 * (320 + 10) * 4}
    frozen = run_tensor(2, model="squeezenet1_0", frozen=True, batch=2, steps=2, lr=0.01, extra={"tp": 2})
    assert frozen["max_abs_diff"] <= 2e-5
    # fc1 column, fc2 row (4096 outputs), fc3 whole; the frozen backbone's output needs no gradient
    assert frozen["measured"] == {"all_reduce (tp)": 2 * 4096 * 4}


def test_hybrid_dp_times_tp():
    row = run_tensor(4, model="gpt2-tiny", extra={"tp": 2, "dp": 2}, replicas=2)
    assert row["max_abs_diff"] <= 2e-5
    assert row["measured"] == {"all_reduce (tp)": 8 * BLOCK_ACTIVATION,
                               "all_reduce (dp)": row["held_bytes"]["params"]}  # every gradient held
