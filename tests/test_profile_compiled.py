"""`commprof profile` on scripts written the ways PyTorch is used today (tests/scripts/modern_train.py): a
mesh that makes the default group itself, FSDP2 over TP on a 2-D mesh, torch.compile of DDP and of FSDP2,
compiled autograd with DDP's python reducer (by dynamo's flag, and as PyTorch's tutorial writes it: each backward
inside `compiled_autograd._enable(torch.compile(...))`), DDP with a static graph and with unused parameters, and
`dist.all_reduce` calls inside a torch.compile(fullgraph=True) function (a graph break would raise). Each exits 0
with the plain run's losses to the bit, and commprof's counts equal an independent count: gloo's own
`gloo:<op>` events, recorded by torch.profiler in the plain run, op for op (what commprof leaves to torch is
in `unseen`, by name). Half the modes are profiled under commprof's launcher, half under
`torchrun -m commprof profile`."""

import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from spawn import commprof, env_for_tests, spawn

SCRIPT = Path(__file__).with_name("scripts") / "modern_train.py"

GLOO_NAMES = {"reduce_scatter": "all_reduce"}
"""commprof's op name → gloo's event name where they differ: gloo runs reduce_scatter_tensor as an all_reduce
(ProcessGroupGloo's `_reduce_scatter_base`) and its event is named for it."""

MODES = [("fsdp_tp", 4, "torchrun"),
         ("compile_ddp,ddp_static,ddp_unused,compiled_sync,compile_fsdp,compiled_autograd_ctx,compiled_autograd", 2,
          "commprof")]
"""The modes, and the ranks and launcher of each job: modes on one default group share a job (one start-up,
one dynamo import), compiled_autograd last (it sets dynamo's global configuration). fsdp_tp's mesh, made by
init_device_mesh alone, is mesh_tp's too (TP + SP inside each unit): mesh_tp alone runs by hand."""


def losses(stdout: str) -> list[str]:
    """Each rank's printed loss of each mode (ranks print side by side: two may share a line)."""
    return sorted(re.findall(r"rank \d+ \w+ loss -?0x[0-9a-f.]+p[-+]\d+", stdout))


def commprof_counts(doc: dict) -> Counter:
    """Every op rank 0 ran, by gloo's event name: the measured iterations' and those outside them, and what
    ran as torch's own (`unseen` holds every rank's: divided by the world size, each rank ran as many)."""
    out = Counter()
    name = lambda key: GLOO_NAMES.get(key.split(" (")[0], key.split(" (")[0])  # noqa: E731  "op (group)" → op
    measured = doc["steps"]["measured"]
    for op, v in doc["volume"].items():
        out[name(op)] += round(v["calls_per_step"] * measured)
    for op, v in doc["outside_iterations"].items():
        out[name(op)] += v["calls"]
    world = doc["env"]["world_size"]
    for op, calls in doc["unseen"].items():
        assert calls % world == 0, doc["unseen"]
        out[op] += calls // world
    return out


@pytest.mark.parametrize("mode,nproc,launcher", MODES, ids=[m.split(",")[0] for m, _, _ in MODES])
def test_todays_idioms_are_counted_op_for_op_and_train_unchanged(tmp_path, mode, nproc, launcher):
    env = env_for_tests(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    plain = spawn([sys.executable, str(SCRIPT), "--mode", mode, "--count-gloo", str(tmp_path / "gloo")],
                  nproc=nproc, backend="gloo", env=env)
    assert plain.returncode == 0, plain.stderr[-3000:]
    out = tmp_path / "out.json"
    args = ("profile", "--json", str(out), str(SCRIPT), "--mode", mode)
    if launcher == "commprof":
        proc = commprof(args[0], "--nproc", str(nproc), *args[1:], env=env)
    else:
        proc = spawn([sys.executable, "-m", "commprof", *args], nproc=nproc, backend="gloo", env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # no warning the plain run does not print (commprof's global module hooks made torch warn at each
    # torch.compile(module) call)
    warned = lambda stderr: {line.split("UserWarning:", 1)[1] for line in stderr.splitlines()  # noqa: E731
                             if "UserWarning:" in line}
    assert warned(proc.stderr) <= warned(plain.stderr), warned(proc.stderr) - warned(plain.stderr)
    assert losses(proc.stdout) == losses(plain.stdout) and len(losses(plain.stdout)) == nproc * len(mode.split(","))
    doc = json.loads(out.read_text())
    assert doc["steps"]["measured"] >= 1
    assert doc["env"]["backend"] == "gloo" and "backend gloo" in proc.stdout  # a mesh's group: not 'undefined'

    gloo = Counter(json.loads((tmp_path / "gloo.rank0").read_text()))
    assert commprof_counts(doc) == gloo
    if mode.startswith("compile"):
        assert doc["unseen"] == {}  # DDP's bucket-order broadcast too: counted, through the reducer's group


def test_compiled_autograd_as_the_tutorial_writes_it_under_torchrun(tmp_path):
    # the form that exited 1 under profile (a callback queued inside compiled autograd without fullgraph),
    # under the other launcher: its losses and counts against the plain run are checked in the job above
    env = env_for_tests(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    out = tmp_path / "out.json"
    proc = spawn([sys.executable, "-m", "commprof", "profile", "--json", str(out), str(SCRIPT), "--mode",
                  "compiled_autograd_ctx"], nproc=2, backend="gloo", env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert len(losses(proc.stdout)) == 2 and "UserWarning" not in proc.stderr, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["steps"]["measured"] >= 1 and doc["env"]["backend"] == "gloo" and doc["volume"]["all_reduce"]
