"""`commprof profile -- SCRIPT`: unchanged scripts (tests/scripts/) measured call by call on real gloo ranks,
started by commprof's launcher and by mpiexec — bytes and groups of every op, iterations found, the script's
output and exit code passed through, its failures shown once, and DDP/FSDP2 training to the same parameters
as the same script run without commprof."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from invariants import check_run
from spawn import commprof, env_for_tests, spawn

from commprof.base.backends import free_port
from commprof.intercept import seen

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


def outside(doc):
    return {op: (v["calls"], v["payload_bytes"]) for op, v in doc["outside_iterations"].items()}


def profiled(tmp_path, text: str, nproc: int, env=None):
    """`text` as a script under `commprof profile --nproc N`, which must succeed: its JSON, and the process."""
    script, out = tmp_path / "script.py", tmp_path / "out.json"
    script.write_text(text)
    proc = commprof("profile", "--nproc", str(nproc), "--json", str(out), str(script), env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text()), proc


@pytest.mark.parametrize("launcher,nproc", [("gloo", 2), ("gloo", 3), ("mpi", 2)])
def test_every_call_of_a_plain_script_is_seen(tmp_path, launcher, nproc):
    doc, proc = profile(tmp_path, "--nproc", str(nproc), "--backend", launcher, script="collectives.py",
                        script_args=("--steps", "6", "--exit", "3"), code=3)
    for r in range(nproc):  # the script's own output, and its exit code (3), passed through
        assert f"script rank {r} of {nproc} finished" in proc.stdout
    assert doc["steps"] == {"found": 6, "measured": 2, "warmup": 4, "per_epoch": 6}  # --warmup 4 by default
    assert volume(doc) == {"all_reduce": (1, 4000), "all_gather": (1, nproc * 1000),
                           "broadcast (ranks0-1)": (1, 400), "send": (1, 200), "recv": (1, 200)}
    assert doc["volume"]["all_reduce"]["wire_bytes_per_step"] == round(4000 * 2 * (nproc - 1) / nproc)
    assert doc["volume"]["send"]["bytes_per_epoch"] == 6 * 200
    assert doc["unseen"] == {}
    assert len(doc["iterations"]) == nproc * 2
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


def test_the_trace_holds_the_iterations_the_json_does(tmp_path):
    # the last optimizer step opens an iteration that no step ends (the script's teardown): not one, in the
    # JSON, in the trace, or for what reads the trace (findings, predict)
    from commprof.perfmodel import timeline

    doc, _ = profile(tmp_path, "--nproc", "2", "--trace", str(tmp_path / "tr"), script="straggler_train.py",
                     script_args=("--steps", "7"))
    assert doc["steps"] == {"found": 7, "measured": 3, "warmup": 4, "per_epoch": 7}  # --warmup 4 by default
    events = json.loads((tmp_path / "tr" / "trace.json").read_text())["traceEvents"]
    for rank in (0, 1):
        mine = [e for e in events if e.get("ph") == "X" and e.get("cat") == "iteration" and e["pid"] == rank + 1]
        iterations = sorted((e for e in mine if e["name"] != "measured"), key=lambda e: e["ts"])
        assert [e["name"] for e in iterations] == ["iteration 0", *(f"iteration {i} (aligned)" for i in (1, 2, 3)),
                                                   *(f"iteration {i}" for i in range(4, 7))]
        (measured,) = [e for e in mine if e["name"] == "measured"]
        assert iterations[3]["ts"] + iterations[3]["dur"] <= measured["ts"] <= iterations[4]["ts"]
        last_end = iterations[-1]["ts"] + iterations[-1]["dur"]
        assert measured["ts"] + measured["dur"] == pytest.approx(last_end, abs=0.002)  # µs: on its very stamp
    assert len(timeline.load(str(tmp_path / "out.json")).iterations) == 3


def _state(path):
    return torch.load(path)


@pytest.mark.parametrize("script,extra", [("ddp_train.py", ("--seed-by-rank",)), ("ddp_train.py", ("--hook",)),
                                          ("ddp_train.py", ("--find-unused",)), ("fsdp2_train.py", ())])
def test_native_training_is_seen_and_unchanged(tmp_path, script, extra):
    plain = tmp_path / "plain.pt"
    proc = spawn([sys.executable, str(SCRIPTS / script), "--steps", "6", "--state", str(plain), *extra],
                 nproc=2, backend="gloo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    profiled = tmp_path / "profiled.pt"
    doc, proc = profile(tmp_path, "--nproc", "2", script=script,
                        script_args=("--steps", "6", "--state", str(profiled), *extra))
    warm = doc["steps"]["warmup"]
    assert warm == 4  # the default: iterations 1-3 aligned, their ops outside every measured one like 0's
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
        buffers = 4 * 128 + 8
        assert volume(doc) == {"all_reduce": reduced, "broadcast": (2, buffers)}
        assert doc["summary"]["exposed_comm_ms"] > 0  # the reducer's wait at the end of backward
        # outside: DDP's constructor checks the model (an all_gather of parameter counts, a broadcast of rank
        # 0's sizes and strides: an int64 each), broadcasts every parameter and buffer from rank 0 (the float32
        # ones in one flat broadcast, num_batches_tracked in another), then each warm-up step's like any step's;
        # at the second forward the reducer broadcasts its bucket order from rank 0 (not with
        # find_unused_parameters, which keeps its buckets): an int32 per parameter and one more, one per bucket
        shapes = 8 * sum(2 * v.dim() for v in tensors)
        order = (0, 0) if "--find-unused" in extra else (2, 4 * (len(tensors) + 1 + 1))
        assert outside(doc) == {"all_gather": (1, 2 * 8), "all_reduce": (warm * reduced[0], warm * reduced[1]),
                           "broadcast": (1 + 2 + 2 * warm + order[0],
                                         shapes + params + buffers + warm * buffers + order[1])}
        assert doc["unseen"] == {}
    else:  # FSDP2: each unit gathered for forward and again for backward, its gradients reduce-scattered
        assert volume(doc) == {"all_gather": (6, 2 * params), "reduce_scatter": (3, params)}
        # outside: the warm-up step's, and the script's full_tensor() of every parameter at the end (functional
        # all-gathers, through Comm like the rest)
        assert doc["unseen"] == {}
        assert outside(doc) == {"all_gather": (6 * warm + len(tensors), 2 * params * warm + params),
                           "reduce_scatter": (3 * warm, params * warm)}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_pipelining_schedule_is_seen(tmp_path, schedule):
    doc, _ = profile(tmp_path, "--nproc", "2", script="pipeline_train.py",
                     script_args=("--steps", "6", "--schedule", schedule, "--micro-batches", "4"))
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


def test_the_script_imports_what_python_would_give_it(tmp_path):
    # `python script.py` puts the script's directory first and not the directory it runs in; `python -m
    # commprof` puts the latter first, where it shadowed PYTHONPATH and the installed packages
    here, lib, code = tmp_path / "here", tmp_path / "lib", tmp_path / "code"
    for folder, where in ((here, "the directory it ran in"), (lib, "PYTHONPATH"), (code, None)):
        folder.mkdir()
        if where is not None:
            (folder / "shadowed.py").write_text(f"WHERE = {where!r}\n")
    (code / "sibling.py").write_text("WHERE = 'beside the script'\n")
    script = code / "script.py"
    script.write_text("import os, shadowed, sibling, torch.distributed as dist\n"
                      "dist.init_process_group()\n"
                      "os.write(1, f'{dist.get_rank()}: {shadowed.WHERE}, {sibling.WHERE}\\n'.encode())\n"
                      "dist.destroy_process_group()\n")
    env = env_for_tests(PYTHONPATH=str(lib))
    alone = subprocess.run([sys.executable, str(script)], env={**env, "RANK": "0", "WORLD_SIZE": "1",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}, cwd=here,
                           capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0, alone.stderr[-2000:]
    assert alone.stdout == "0: PYTHONPATH, beside the script\n"
    proc = commprof("profile", "--nproc", "2", str(script), env=env, cwd=str(here))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(line for line in proc.stdout.splitlines() if re.match(r"\d: ", line)) == \
        [f"{r}: PYTHONPATH, beside the script" for r in range(2)]


FUNCTIONAL = """\
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
dist.init_process_group()
r, n, world = dist.get_rank(), dist.get_world_size(), dist.group.WORLD
for _ in range(3):
    assert funcol.all_reduce(torch.ones(8), "sum", world).wait().tolist() == [float(n)] * 8
    assert funcol.all_reduce(torch.full((4,), float(r)), "avg", world).wait().tolist() == [(n - 1) / 2] * 4
    assert funcol.all_gather_single(torch.full((2,), float(r)), 0, world).wait().tolist() == \\
        [float(i) for i in range(n) for _ in range(2)]
    assert funcol.reduce_scatter_tensor(torch.ones(4 * n), "sum", 0, world).wait().tolist() == [float(n)] * 4
    assert funcol.broadcast(torch.full((3,), float(r)), 0, world).wait().tolist() == [0.0] * 3
    assert funcol.all_to_all_single(torch.full((n,), float(r)), None, None, world).wait().tolist() == \\
        [float(i) for i in range(n)]
    out = funcol.all_reduce_coalesced([torch.ones(2), torch.full((3,), float(r))], "sum", world)
    assert [t.wait().tolist() for t in out] == [[float(n)] * 2, [n * (n - 1) / 2] * 3]
    out = funcol.all_gather_into_tensor_coalesced([torch.full((2,), float(r)), torch.full((1, 3), 10.0 + r)], world)
    assert [t.wait().tolist() for t in out] == [[float(i) for i in range(n) for _ in range(2)],
                                                [[10.0 + i] * 3 for i in range(n)]]
    out = funcol.reduce_scatter_tensor_coalesced([torch.arange(2.0 * n), torch.ones(n, 2)], "sum", [0, 0], world)
    assert [t.wait().tolist() for t in out] == [[2.0 * r * n, (2.0 * r + 1) * n], [[float(n)] * 2]]
    dist.all_reduce(torch.ones(8))
dist.destroy_process_group()
"""


SCALAR_DDP = """\
import os, torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group()
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(1.0))
    def forward(self, x): return (x * self.a).sum()
m = nn.parallel.DistributedDataParallel(M())
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(6):
    opt.zero_grad(); m(torch.ones(3) * (dist.get_rank() + 1)).backward(); opt.step()
os.write(1, f"a {m.module.a.item()}\\n".encode())  # one write: the two ranks share the pipe
dist.destroy_process_group()
"""


def test_ddp_of_scalar_parameters_checks_the_model_as_torch_does(tmp_path):
    # every parameter a scalar: DDP's model check still broadcasts rank 0's (empty) sizes and strides, as
    # torch's C++ does, so a rank whose model differs fails there on every rank; then one flat broadcast of
    # the parameters and an all_reduce of the 4-byte gradient a step; at the second forward the reducer's bucket
    # order (an int32 per parameter and one more, one per bucket: 4 + 8 bytes)
    doc, proc = profiled(tmp_path, SCALAR_DDP, 2)
    assert outside(doc) == {"all_gather": (1, 2 * 8), "broadcast": (2 + 2, 0 + 4 + 12), "all_reduce": (4, 4 * 4)}
    assert volume(doc) == {"all_reduce": (1, 4)}
    # the gradient (3 + 6) / 2 = 4.5 a step, the same on both ranks
    finals = [float(line.split()[1]) for line in proc.stdout.splitlines()  # the script's own "a VALUE" lines
              if re.fullmatch(r"a -?\d+(\.\d+)?(e-?\d+)?", line.strip())]
    assert finals == pytest.approx([1.0 - 6 * 0.1 * 4.5] * 2, abs=1e-6), proc.stdout[:300]


@pytest.mark.parametrize("nproc", [2, 3])
def test_functional_collectives_go_through_comm_once_each(tmp_path, nproc):
    # the ops DTensor, tensor parallelism and FSDP2's clip_grad_norm_ and full_tensor() dispatch: timed and
    # counted with their bytes beside the script's own all_reduce, each once, the coalesced forms too
    script = tmp_path / "funcol.py"
    script.write_text(FUNCTIONAL)
    out = tmp_path / "out.json"
    proc = commprof("profile", "--nproc", str(nproc), "--json", str(out), str(script))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["unseen"] == {}
    # each coalesced call one op over its tensors end to end, as gloo sends it: an all_reduce of 5 floats, an
    # all_gather of 5 a rank, a reduce_scatter of 4 a rank
    assert outside(doc) == {"all_reduce": (3 * 4, 3 * (32 + 16 + 20 + 32)), "all_gather": (3 * 2, 3 * nproc * (8 + 20)),
                            "reduce_scatter": (3 * 2, 3 * nproc * (16 + 16)), "broadcast": (3, 3 * 12),
                            "all_to_all": (3, 3 * nproc * 4)}
    assert "unseen" not in proc.stdout


BY_THE_BACKEND = """\
import torch, torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.distributed.device_mesh import init_device_mesh
dist.init_process_group()
rank, n = dist.get_rank(), dist.get_world_size()
world = dist.group.WORLD
pair = dist.new_group([0, 1])
alone = init_device_mesh("cpu", (1, n), mesh_dim_names=("dp", "tp")).get_group("dp")  # DeviceMesh's: one rank
for _ in range(3):
    t = torch.full((4,), float(rank + 1))
    world.allreduce([t]).wait()                      # the group's own method
    assert t.tolist() == [n * (n + 1) / 2] * 4, t
    out = torch.zeros(2 * n)
    world._allgather_base(out, torch.full((2,), float(rank))).wait()
    assert out.tolist() == [float(r) for r in range(n) for _ in range(2)], out
    part = torch.zeros(3)
    world._reduce_scatter_base(part, torch.arange(3.0 * n)).wait()
    assert part.tolist() == [n * (3.0 * rank + i) for i in range(3)], part
    if rank < 2:
        u = torch.full((8,), float(rank))
        pair.broadcast(u, 1).wait()
        assert u.tolist() == [1.0] * 8
    if rank == 0:
        c10d.isend(torch.ones(3), 1).wait()          # by distributed_c10d's name
    elif rank == 1:
        got = torch.zeros(3)
        c10d.irecv(got, 0).wait()
        assert got.tolist() == [1.0] * 3
    dist.all_reduce(torch.ones(2))                   # the interposed function: once, not twice
    alone.allreduce([torch.ones(5)]).wait()
    box = [torch.zeros(1) for _ in range(n)] if rank == 0 else []
    opts = dist.GatherOptions()
    opts.rootRank = 0
    world.gather([box] if rank == 0 else [], [torch.ones(1)], opts).wait()
dist.destroy_process_group()
"""


@pytest.mark.skipif(seen.Backend is None, reason="this torch's Backend has no Python constructor (2.11 or older)")
def test_what_reaches_the_backend_by_other_ways_is_counted_once(tmp_path):
    # a group's own methods (the default group's, a new_group's, DeviceMesh's) and isend/irecv by
    # distributed_c10d's name, which no wrapper sees, reach the group's backend: each counted there, once, with
    # its bytes; an interposed all_reduce is not counted twice
    doc, _ = profiled(tmp_path, BY_THE_BACKEND, 3)
    assert doc["unseen"] == {"gather": 3 * 3}  # Comm has no gather: gloo's, counted on every rank
    assert outside(doc) == {"all_reduce": (3 * 2, 3 * (16 + 8)), "all_gather": (3, 3 * 3 * 8),
                            "reduce_scatter": (3, 3 * 3 * 12), "broadcast (ranks0-1)": (3, 3 * 32),
                            "send": (3, 3 * 12), "all_reduce (rank0)": (3, 3 * 20)}


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
    # whether rank 1 had reached its all_reduce when rank 0 claimed the failure is the script's own race: the
    # line says so when it had not
    (line,) = proc.stderr.strip().splitlines()
    assert re.fullmatch(rf"commprof: error: rank 0: {re.escape(str(script))} exited with status 5"
                        r"(; rank 1 was in no op)?", line), line


def test_a_syntax_error_shows_as_python_shows_it(tmp_path):
    script = tmp_path / "typo.py"
    script.write_text("import torch\nx = (1,\n")
    proc = commprof("profile", "--nproc", "2", "--timeout", "60", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.count("SyntaxError") == 1 and 'typo.py", line 2' in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "runpy" not in proc.stderr and "commprof/" not in proc.stderr


def test_the_op_times_follow_the_volume_table_and_the_findings_every_table(tmp_path):
    # the findings came first, before the header and the tables; no table gave each op's time
    def key(op, group):  # the volume table's name of an op of a group
        return op if group == "world" else f"{op} ({group})"

    doc, proc = profile(tmp_path, "--nproc", "2", script="ddp_train.py", script_args=("--steps", "8"))
    out = proc.stdout
    header, volume, ops = (out.index(s) for s in ("commprof profile · ", "transfer volume per rank", "time per op"))
    last_table = out.index("ms/iteration (slowest rank)")  # the summary line after the tables
    assert header < volume < ops < last_table, out
    assert out.index("\nfindings") > last_table, out  # a finding, or "findings: none above 3 % of the step"
    measured = doc["steps"]["measured"]
    assert measured == 4 and {key(r["op"], r["group"]) for r in doc["op_times"]} == set(doc["volume"]), doc
    for r in doc["op_times"]:  # rank 0's ops of the measured iterations: the volume table's, with their times
        v = doc["volume"][key(r["op"], r["group"])]
        assert r["count"] == v["calls_per_step"] * measured, (r, v)
        assert r["payload_bytes"] == v["payload_bytes_per_step"] * measured, (r, v)
        assert 0 < r["min_us"] <= r["median_us"] <= r["p99_us"] <= r["max_us"] and r["rank"] == 0, r
        assert key(r["op"], r["group"]) in out[ops:last_table] and f" {r['count']} " in out[ops:last_table]


CPP_ALLREDUCE = """
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

dist.init_process_group()
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
pg = c10d._get_default_group()
bor = dist.AllreduceOptions()
bor.reduceOp = dist.ReduceOp.BOR
for step in range(6):
    model(torch.ones(2, 4)).sum().backward()
    pg.allreduce([torch.ones(250)]).wait()                         # C++: the backend commprof puts in front sees it
    pg.allreduce([torch.ones(75, dtype=torch.int32)], bor).wait()  # C++, a reduction commprof has no form for
    opt.step()
dist.destroy_process_group()
"""


def test_torch_record_counts_the_cpp_calls_commprof_could_not(tmp_path):
    # torch's flight record of rank 0 holds every all_reduce of the measured iterations: the one commprof's backend
    # routed (torch 2.12 on) and the bitwise one it has no form for, which only the record counts
    doc, proc = profiled(tmp_path, CPP_ALLREDUCE, 2)
    record, measured = doc["torch_record"], doc["steps"]["measured"]
    assert record["buffer_size"] > 0 and record["set_by"] == "commprof" and not record["wrapped"]
    assert record["iterations"] == record["measured"] == measured == 2
    routed = seen.Backend is not None  # torch 2.11 and earlier put nothing of commprof's in front of gloo
    assert volume(doc) == ({"all_reduce": (1, 1000)} if routed else {})
    only = (1, 300) if routed else (2, 1300)
    got = record["volume"]["all_reduce"]
    assert (got["calls_per_step"], got["payload_bytes_per_step"]) == only and list(record["volume"]) == ["all_reduce"]
    (row,) = record["rows"]
    assert (row["record_calls"], row["record_payload_bytes"]) == (2 * measured, 1300 * measured)
    assert row["status"] == ("record more" if routed else "record only") and not record["agree"]
    table = proc.stdout[proc.stdout.index("transfer volume"):]
    shown = next(line for line in table.splitlines() if "all_reduce *" in line)
    assert ("300 B" if routed else "1.3 KiB") in shown, table
    assert "counted from torch's flight record of rank 0" in table
    if routed:  # the bitwise all_reduce is unseen: rank 0's measured ones are the record's, the rest neither's
        assert doc["unseen"] == {"allreduce": 2 * 6} and record["in_neither"] == {"allreduce": 2 * 6 - measured}


def test_torch_record_agrees_with_every_count_of_a_ddp_script(tmp_path):
    doc, _ = profile(tmp_path, "--nproc", "2", script="ddp_train.py", script_args=("--steps", "6"))
    record, measured = doc["torch_record"], doc["steps"]["measured"]
    assert record["iterations"] == measured == 2 and record["agree"] and record["volume"] == {}
    assert {r["key"]: (r["record_calls"], r["record_payload_bytes"]) for r in record["rows"]} == \
        {key: (v["calls_per_step"] * measured, v["payload_bytes_per_step"] * measured)
         for key, v in doc["volume"].items()}
    assert all(r["status"] == "agree" for r in record["rows"]) and record["in_neither"] == {}
