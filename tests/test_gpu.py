"""The CUDA path, run for real: `python3 -m pytest -m gpu` on a machine with a GPU (skipped elsewhere).

One GPU is enough: NCCL at one rank, and two gloo ranks sharing the GPU with CUDA tensors (--device cuda).
What is checked: the driver's GPU count (read without torch) against torch's; bench's closed-form checks and
CUDA-event times; run's split and peak memory on the device; profile's routed DDP reducer and CUDA phases;
the trace's stream spans against their launches; NVTX ranges balanced as on CPU. Timing against an
independent loop, the split on calibrated kernels and the host waits commprof adds: benchmarks/gpu_truth.py.
"""

import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
from spawn import commprof, env_for_tests

pytestmark = pytest.mark.gpu

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(Path(__file__).parent / "support"))


def ok(proc):
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    return proc


def test_the_driver_sees_the_gpus_torch_sees():
    import torch

    from commprof.base.backends import cuda_devices, default_backend

    assert cuda_devices() == torch.cuda.device_count() > 0
    assert default_backend() == "nccl"


def test_bench_on_nccl_checks_and_times_every_collective(tmp_path):
    out = tmp_path / "b.json"
    ok(commprof("bench", "--backend", "nccl", "--nproc", "1", "-b", "64K", "-e", "4M", "-f", "8", "-n", "5",
                "-w", "2", "--json", str(out)))
    doc = json.loads(out.read_text())
    assert doc["env"]["clock"] == "cuda" and doc["env"]["backend"] == "nccl"
    rows = doc["results"]
    assert {r["collective"] for r in rows} == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                                               "all_to_all", "sendrecv", "barrier"}
    assert all(r["wrong"] == 0 for r in rows)
    assert all(r["time_us"] > 0 for r in rows if r["collective"] != "barrier")


def test_bench_moves_cuda_tensors_over_gloo_between_two_ranks(tmp_path):
    out = tmp_path / "b.json"
    ok(commprof("bench", "all_reduce", "broadcast", "--backend", "gloo", "--device", "cuda", "--nproc", "2",
                "-b", "64K", "-e", "1M", "-f", "4", "-n", "5", "-w", "2", "--json", str(out)))
    doc = json.loads(out.read_text())
    assert doc["env"]["clock"] == "cuda" and doc["env"]["world_size"] == 2
    assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in doc["results"])


@pytest.mark.parametrize("backend,nproc", [("nccl", "1"), ("gloo", "2")])
def test_run_splits_a_ddp_step_on_the_device_and_reads_its_memory(tmp_path, backend, nproc):
    out = tmp_path / "r.json"
    ok(commprof("run", "--strategy", "ddp", "--backend", backend, "--device", "cuda", "--nproc", nproc,
                "--model", "mnist-cnn", "--steps", "6", "--bucket-mb", "0.04", "--json", str(out)))
    doc = json.loads(out.read_text())
    assert doc["env"]["clock"] == "cuda"
    for row in doc["summary"]["per_rank"]:
        assert row["compute_ms"] > 0 and row["comm_ms"] > 0
        assert row["exposed_comm_ms"] <= row["comm_ms"] + 1e-6
        assert row["compute_ms"] + row["exposed_comm_ms"] <= row["wall_ms"] * 1.001
        # torch.cuda.max_memory_allocated: at least the parameters, gradients and SGD's momentum-free state
        assert row["peak_mem_bytes"] >= sum(row["held_bytes"].values()) > 0


@pytest.mark.parametrize("comm", ["blocking", "async", "ddp"])
def test_profile_splits_a_cuda_script_on_the_device(tmp_path, comm):
    out = tmp_path / "p.json"
    ok(commprof("profile", "--backend", "nccl", "--nproc", "1", "--json", str(out), "--",
                str(SCRIPTS / "gpu_train.py"), "--comm", comm, "--steps", "8", "--mib", "64",
                "--forward-ms", "2", "--backward-ms", "3"))
    doc = json.loads(out.read_text())
    s = doc["summary"]
    assert doc["steps"]["measured"] == 8 - 4
    # forward 2 ms and backward 3 ms of sleep kernels: compute is the device's time, not the host's launches
    assert 4.5 < s["compute_ms"] < 7.0, s
    if comm == "ddp":  # one bucket, the whole parameter; at one rank NCCL's in-place all-reduce moves nothing
        volume = doc["volume"]["all_reduce"]
        assert volume["calls_per_step"] == 1 and volume["payload_bytes_per_step"] == 64 << 20, volume
        return
    assert s["comm_ms"] > 0
    if comm == "async":  # the all_gather runs under forward's kernel
        assert s["overlap_ms"] > 0.8 * s["comm_ms"] and s["exposed_comm_ms"] < 0.2 * s["comm_ms"], s
    else:
        assert s["exposed_comm_ms"] > 0.8 * s["comm_ms"] and s["overlap_ms"] < 0.2 * s["comm_ms"], s


def test_trace_puts_stream_spans_after_their_launches(tmp_path):
    traced = tmp_path / "t"
    ok(commprof("run", "--strategy", "ddp", "--backend", "nccl", "--nproc", "1", "--model", "mnist-cnn",
                "--steps", "4", "--trace", str(traced)))
    events = json.loads((traced / "rank0.trace.json").read_text())
    threads = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    bound_us = next(e["args"]["anchor_bound_ns"] for e in events if "anchor_bound_ns" in e.get("args", {})) / 1e3
    assert 0 <= bound_us < 1000
    host, stream = {}, {}
    for e in sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"]):
        where = threads.get(e["tid"], "")
        if where == "stream: ranges":
            stream.setdefault(e["name"], []).append(e)
        elif not where.startswith("stream"):  # the training thread, or autograd's where it issued an op
            host.setdefault(e["name"], []).append(e)
    assert any(k.startswith("forward") for k in stream) and any(threads[t].startswith("stream: comm")
                                                                 for t in threads)
    for name, spans in stream.items():  # the k-th time the stream ran a range, it had been pushed k times
        assert len(spans) == len(host.get(name, ())), name
        for ran, pushed in zip(spans, host[name]):
            assert ran["ts"] >= pushed["ts"] - bound_us - 1, (name, ran, pushed)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the NVTX recorder")
def test_nvtx_ranges_on_cuda_are_balanced_and_named_as_on_cpu(tmp_path):
    import nvtx_recorder

    lib = nvtx_recorder.build(tmp_path)
    prefix = tmp_path / "rec"
    env = env_for_tests(**nvtx_recorder.recorder_env(lib, prefix, {}))
    ok(commprof("run", "--strategy", "ddp", "--backend", "nccl", "--nproc", "1", "--steps", "3", "--warmup", "1",
                "--bucket-mb", "0.04", "--batch-size", "8", "--eval-samples", "0", env=env))
    records = [r for r in nvtx_recorder.read_records(prefix) if r["domain"] == "commprof"]
    assert records and not nvtx_recorder.unbalanced(records)
    pushes = [r for r in records if r["kind"] == "push"]
    count = Counter((r["category"], r["message"].split(" ")[0]) for r in pushes)
    assert count[("iteration", "iteration")] == 3
    assert count[("compute", "forward")] == count[("compute", "backward")] == count[("optimizer", "step")] == 3
    assert count[("comm", "all_reduce")] == 3 * 3  # 87,360 gradient bytes in 40 KiB buckets
    assert all(r["message"].startswith("all_reduce (world) ") for r in pushes if r["category"] == "comm")
