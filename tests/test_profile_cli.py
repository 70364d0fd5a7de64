"""`commprof profile -- SCRIPT`: unchanged scripts (tests/scripts/) measured call by call on real gloo ranks,
started by commprof's launcher and by mpiexec — bytes and groups of every op, iterations found, the script's
output and exit code passed through, its failures shown once, and DDP/FSDP2 training to the same parameters
as the same script run without commprof."""

import json
import sys
from pathlib import Path

import pytest
import torch
from invariants import check_run
from spawn import commprof, spawn

SCRIPTS = Path(__file__).with_name("scripts")


def profile(tmp_path, *args, script, script_args=(), code=0, name="out.json"):
    out = tmp_path / name
    proc = commprof("profile", *args, "--json", str(out), "--", str(SCRIPTS / script), *script_args)
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    check_run(doc)
    return doc, proc


def volume(doc):
    return {op: (v["calls_per_step"], v["payload_bytes_per_step"]) for op, v in doc["volume"].items()}


@pytest.mark.parametrize("launcher,nproc", [("gloo", 2), ("gloo", 3), ("mpi", 2)])
def test_every_call_of_a_plain_script_is_seen(tmp_path, launcher, nproc):
    doc, proc = profile(tmp_path, "--nproc", str(nproc), "--backend", launcher, script="collectives.py",
                        script_args=("--steps", "4", "--exit", "3"), code=3)
    for r in range(nproc):  # the script's own output, and its exit code (3), passed through
        assert f"script rank {r} of {nproc} finished" in proc.stdout
    assert doc["steps"] == {"found": 4, "measured": 3, "warmup": 1, "per_epoch": 4}
    assert volume(doc) == {"all_reduce": (1, 4000), "all_gather": (1, nproc * 1000),
                           "broadcast (ranks0-1)": (1, 400), "send": (1, 200), "recv": (1, 200)}
    assert doc["volume"]["all_reduce"]["wire_bytes_per_step"] == round(4000 * 2 * (nproc - 1) / nproc)
    assert doc["volume"]["send"]["bytes_per_epoch"] == 4 * 200
    assert doc["unseen"] == {}
    assert len(doc["iterations"]) == nproc * 3
    for it in doc["iterations"]:
        assert it["comm_ms"] > 0 and it["compute_ms"] > 0
        assert set(it["comm_by_group_ms"]) == ({"world", "ranks0-1"} if it["rank"] < 2 else {"world"})
    assert "commprof profile" in proc.stdout and "transfer volume" in proc.stdout


def test_the_scripts_own_marks_and_a_group_left_alive(tmp_path):
    doc, _ = profile(tmp_path, "--nproc", "2", "--warmup", "2", "--trace", str(tmp_path / "tr"),
                     script="collectives.py", script_args=("--steps", "5", "--explicit", "--no-destroy"))
    assert doc["steps"]["found"] == 5 and doc["steps"]["measured"] == 3
    assert volume(doc)["all_reduce"] == (1, 4000)
    # the two warm-up iterations' ops are outside every measured one
    assert doc["outside_iterations"]["all_reduce"]["calls"] == 2
    events = json.loads((tmp_path / "tr" / "trace.json").read_text())["traceEvents"]
    spans = [(e["pid"] - 1, e["name"].split(" ")[0]) for e in events if e.get("ph") == "X"]  # rank r: pid r + 1
    for rank in (0, 1):  # the script's own phases and every op, on every rank's timeline
        assert spans.count((rank, "forward")) == 5 and spans.count((rank, "iteration")) == 5
        assert spans.count((rank, "all_reduce")) == 2 * 5  # its NVTX range, and its span on "comm (world)"


def _state(path):
    return torch.load(path)


@pytest.mark.parametrize("script,extra", [("ddp_train.py", ()), ("ddp_train.py", ("--hook",)),
                                          ("ddp_train.py", ("--find-unused",)), ("fsdp2_train.py", ())])
def test_native_training_is_seen_and_unchanged(tmp_path, script, extra):
    plain = tmp_path / "plain.pt"
    proc = spawn([sys.executable, str(SCRIPTS / script), "--steps", "4", "--state", str(plain), *extra],
                 nproc=2, backend="gloo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    profiled = tmp_path / "profiled.pt"
    doc, proc = profile(tmp_path, "--nproc", "2", script=script,
                        script_args=("--steps", "4", "--state", str(profiled), *extra))
    a, b = _state(plain), _state(profiled)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    tensors = [v for k, v in a.items() if v.dtype == torch.float32 and "running" not in k]
    params = 4 * sum(v.numel() for v in tensors)
    if script == "ddp_train.py":
        info = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
        assert params == 4 * info["params"]
        # every bucket through the reducer's routed group (or the script's own hook, interposed: once either
        # way); with find_unused_parameters, the reducer's used-parameter map too (an int32 per parameter);
        # BatchNorm's buffers broadcast each forward, one flat per dtype
        reduced = (2, params + 4 * len(tensors)) if "--find-unused" in extra else (1, params)
        assert volume(doc) == {"all_reduce": reduced, "broadcast": (2, 4 * 128 + 8)}
        assert doc["summary"]["exposed_comm_ms"] > 0  # the reducer's wait at the end of backward
    else:  # FSDP2: each unit gathered for forward and again for backward, its gradients reduce-scattered
        assert volume(doc) == {"all_gather": (6, 2 * params), "reduce_scatter": (3, params)}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_pipelining_schedule_is_seen(tmp_path, schedule):
    doc, _ = profile(tmp_path, "--nproc", "2", script="pipeline_train.py",
                     script_args=("--steps", "4", "--schedule", schedule, "--micro-batches", "4"))
    act = 4 * 32 * 4  # a micro-batch of 4 samples × 32 floats
    assert volume(doc) == {"send": (4, 4 * act), "recv": (4, 4 * act)}
    assert doc["summary"]["bubble_ms"] > 0


def test_a_missing_script_and_one_without_a_process_group_get_one_line(tmp_path):
    proc = commprof("profile", "--nproc", "2", str(tmp_path / "nothere.py"))
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "nothere.py' does not exist" in proc.stderr
    script = tmp_path / "plain.py"
    script.write_text("print('no process group here')\n")
    proc = commprof("profile", "--nproc", "2", str(script))
    assert proc.returncode == 2
    assert proc.stdout.count("no process group here") == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "never initialised a torch.distributed process group" in lines[0]


def test_functional_collectives_are_counted_as_unseen(tmp_path):
    script = tmp_path / "funcol.py"
    script.write_text("import torch, torch.distributed as dist\n"
                      "import torch.distributed._functional_collectives as funcol\n"
                      "dist.init_process_group()\n"
                      "for _ in range(3):\n"
                      "    out = funcol.all_reduce(torch.ones(8), 'sum', dist.group.WORLD)\n"
                      "    assert out.wait().tolist() == [2.0] * 8\n"
                      "    dist.all_reduce(torch.ones(8))\n"
                      "dist.destroy_process_group()\n")
    out = tmp_path / "out.json"
    proc = commprof("profile", "--nproc", "2", "--json", str(out), str(script))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["unseen"] == {"functional all_reduce": 2 * 3}  # both ranks, three calls each
    assert doc["outside_iterations"]["all_reduce"]["calls"] == 3  # the plain ones: seen (no optimizer here)
    assert "unseen (ran as torch's own" in proc.stdout and "functional all_reduce ×6" in proc.stdout


def test_the_first_rank_to_exit_non_zero_sets_the_jobs_code(tmp_path):
    # rank 1 waits in a collective that rank 0 never joins: its lost peer must not hide rank 0's own status
    script = tmp_path / "quits.py"
    script.write_text("import sys, torch, torch.distributed as dist\n"
                      "dist.init_process_group()\n"
                      "if dist.get_rank() == 0:\n"
                      "    sys.exit(5)\n"
                      "dist.all_reduce(torch.ones(4))\n")
    proc = commprof("profile", "--nproc", "2", "--timeout", "60", str(script))
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [f"commprof: error: rank 0: {script} exited with status 5"]


def test_a_syntax_error_shows_as_python_shows_it(tmp_path):
    script = tmp_path / "typo.py"
    script.write_text("import torch\nx = (1,\n")
    proc = commprof("profile", "--nproc", "2", "--timeout", "60", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.count("SyntaxError") == 1 and 'typo.py", line 2' in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "runpy" not in proc.stderr and "commprof/" not in proc.stderr
