"""`tensor` on real gloo ranks: the dp × tp grid trains to the parameters of `single` on the same global
batch, and every rank's measured payload per step equals its prediction (tests/strategy_worker.py checks each
rank). Transformers split 2 and 4 ways, image heads and mixed precision run in process on a fake Comm
(tests/unit/test_fake_comm_models.py); bad degrees, refused before any group: tests/unit/test_tensor_degrees.py."""

import json
import sys
from pathlib import Path

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


def test_hybrid_dp_times_tp():
    row = run_tensor(4, model="gpt2-tiny", extra={"tp": 2, "dp": 2}, replicas=2)
    assert row["max_abs_diff"] <= 2e-5
    assert row["measured"] == {"all_reduce (tp)": 8 * BLOCK_ACTIVATION,
                               "all_reduce (dp)": row["held_bytes"]["params"]}  # every gradient held
