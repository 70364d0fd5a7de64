"""Interposition (commprof/comm/interpose.py): an unchanged torch.distributed script's collectives go
through Comm — results as torch's, and every call in the op log with its bytes and group — on 2 and 3 real
gloo ranks (tests/interpose_worker.py): called by `torch.distributed`'s names, by distributed_c10d's, and
through torch's object collectives; what Comm has no form for is counted as unseen, once."""

import json
import sys
from pathlib import Path

import pytest
from spawn import spawn

WORKER = str(Path(__file__).with_name("interpose_worker.py"))


@pytest.mark.parametrize("nproc", [2, 3])
def test_a_plain_script_is_seen_call_by_call(nproc):
    proc = spawn([sys.executable, WORKER], nproc=nproc, backend="gloo")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = sorted((json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")),
                   key=lambda d: d["rank"])
    assert [d["rank"] for d in lines] == list(range(nproc))
    for d in lines:
        assert d["failures"] == []
        assert d["unseen"] == {"all_to_all_single": 1, "all_gather_into_tensor": 1, "gather": 1, "scatter": 1}
        assert d["ops"] == (24 if d["rank"] < 2 else 22)  # ranks 0 and 1 also ran the pair's two ops
