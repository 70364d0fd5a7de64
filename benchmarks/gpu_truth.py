"""commprof's GPU path against measurements made without it, on one CUDA GPU:

  timing  `commprof bench` per-op time ÷ an independent loop of torch.cuda.Events around the same op (same
          sizes, modes, iterations; rounds interleaved): NCCL at 1 rank, gloo at 2 ranks on CUDA tensors;
          and the bench's whole wall time ÷ the loop's (commprof's own cost on the GPU path)
  split   `commprof profile` of tests/scripts/gpu_train.py (forward and backward are calibrated
          torch.cuda._sleep kernels, the comm one all_gather) against the script's own --truth: compute,
          comm, overlap and exposed, a blocking op and an async op hidden behind compute
  run     `commprof run --model resnet18` (ddp and torch-ddp on NCCL; ddp on 2 gloo ranks on CUDA): its
          table, and its peak memory against torch.cuda.max_memory_allocated of a plain DDP loop
  syncs   host waits on the device (cuda{Device,Stream,Event}Synchronize) per measured iteration under
          torch.profiler, commprof's run against the plain loop; and the plain loop's step time with one
          event wait per iteration ÷ without

    python benchmarks/gpu_truth.py            # writes benchmarks/results/gpu-truth-results.json
    python benchmarks/gpu_truth.py --quick    # one round, small sizes

Without a CUDA GPU it says so and exits 77.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common

SCRIPT = common.ROOT / "tests" / "scripts" / "gpu_train.py"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "sendrecv")
SYNCS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")


# ---- the independent side (workers: one process per rank) -------------------------------------------------
def _events(fn, iters: int, warmup: int) -> float:
    """Mean µs of fn() between two CUDA events, one pair per call, calls back to back as bench issues them."""
    import torch

    for _ in range(warmup):
        fn()
    pairs = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        pairs.append((a, b))
    torch.cuda.synchronize()
    return statistics.fmean(a.elapsed_time(b) for a, b in pairs) * 1e3


MODES = {"all_reduce": (True,), "broadcast": (True,), "reduce": (True,), "all_gather": (True, False),
         "reduce_scatter": (True, False), "all_to_all": (False,), "sendrecv": (False,)}
"""The modes torch offers per collective, as bench runs them (backends.py)."""


def _op(dist, torch, name: str, count: int, r: int, n: int, dev, inplace: bool):
    """Collective `name` on `count` float32 elements as a call, buffers as bench lays them out."""
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    chunk = count // n
    buf = torch.ones(count, device=dev)
    if name == "all_reduce":
        return lambda: dist.all_reduce(buf)
    if name == "broadcast":
        return lambda: dist.broadcast(buf, 0)
    if name == "reduce":
        return lambda: dist.reduce(buf, 0)
    mine = buf[r * chunk:(r + 1) * chunk] if inplace else torch.ones(chunk, device=dev)
    if name == "all_gather":
        return lambda: ag(buf, mine)
    if name == "reduce_scatter":
        return lambda: rs(mine, buf)
    out = torch.empty_like(buf)
    if name == "all_to_all":
        return lambda: dist.all_to_all_single(out, buf)
    if n == 1:  # torch refuses p2p to oneself; bench makes it a local copy, as NCCL does
        return lambda: out.copy_(buf)

    def sendrecv():
        for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, out, (r - 1) % n),
                                        dist.P2POp(dist.isend, buf, (r + 1) % n)]):
            w.wait()
    return sendrecv


def loop_worker(backend: str, names: list[str], sizes: list[int], iters: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group(backend, **({"device_id": dev} if backend == "nccl" else {}))
    r, n = dist.get_rank(), dist.get_world_size()
    rows = []
    for name in names:
        for nbytes in sizes:
            for inplace in MODES[name]:
                fn = _op(dist, torch, name, nbytes // 4, r, n, dev, inplace)
                dist.barrier()
                rows.append({"collective": name, "nbytes": nbytes, "inplace": inplace,
                             "time_us": _events(fn, iters, warmup)})
                del fn
                torch.cuda.empty_cache()
    print(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def plain_worker(steps: int, batch: int, lr: float, bucket_mb: float, profile_dir: str, waits: int) -> None:
    """A plain DDP ResNet-18 loop on NCCL (1 rank), as a user writes it: its peak memory, the host waits
    torch.profiler sees per step, and its step time with and without one event wait per step."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    model = common.image_model("resnet18").to(dev)
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    x, y = torch.randn(batch, 3, 32, 32, device=dev), torch.randint(0, 10, (batch,), device=dev)

    def step():
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    torch.cuda.reset_peak_memory_stats(dev)
    out = {}
    for k in range(steps):
        if k == 2:  # after the warm-up commprof runs (DDP rebuilds its buckets after the first step)
            torch.cuda.synchronize()
            out["max_memory_allocated_warmup"] = torch.cuda.max_memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        step()
    torch.cuda.synchronize()
    out["max_memory_allocated_measured"] = torch.cuda.max_memory_allocated(dev)
    out["max_memory_allocated"] = max(out["max_memory_allocated_warmup"], out["max_memory_allocated_measured"])
    sched = torch.profiler.schedule(wait=0, warmup=1, active=steps - 2, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA], schedule=sched,
                                on_trace_ready=lambda p: p.export_chrome_trace(
                                    str(Path(profile_dir) / "plain.pt.trace.json"))) as prof:
        for _ in range(steps):
            step()
            prof.step()

    def timed(wait_each: bool) -> float:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        a.record()
        for _ in range(steps):
            step()
            if wait_each:  # what commprof's split does at the end of an iteration: read its events
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                e.synchronize()
        b.record()
        b.synchronize()
        return (time.perf_counter() - t0) * 1e3 / steps

    arms = common.interleaved({"without": lambda: timed(False), "with": lambda: timed(True)}, waits)
    out["step_ms"] = arms
    print(json.dumps(out))
    dist.destroy_process_group()


# ---- the checks -------------------------------------------------------------------------------------------
def commprof(*argv: str, what: str, timeout_s: float = 300) -> str:
    return common.job([sys.executable, "-m", "commprof", *argv], env=common.with_root(), timeout_s=timeout_s,
                      what=what)


def me(*argv: str, nproc: int = 1, what: str, timeout_s: float = 300) -> list[str]:
    return common.ranks([sys.executable, str(Path(__file__).resolve()), *argv], nproc, env=common.with_root(),
                        timeout_s=timeout_s, what=what)


def timing(backend: str, nproc: int, names: list[str], args, tmp: Path, min_bytes: int, max_bytes: int) -> dict:
    sizes = [min_bytes]
    while sizes[-1] * 4 <= max_bytes:
        sizes.append(sizes[-1] * 4)
    walls: dict[str, list[float]] = {"commprof": [], "loop": []}
    per: dict[tuple, dict[str, list[float]]] = {}

    def bench():
        out = tmp / f"bench-{backend}.json"
        t0 = time.monotonic()
        commprof("bench", *names, "--backend", backend, "--device", "cuda", "--nproc", str(nproc), "-b", str(sizes[0]),
                 "-e", str(sizes[-1]), "-f", "4", "-n", str(args.iters), "-w", str(args.warmup), "-c", "0",
                 "--json", str(out), what=f"bench {backend}")
        walls["commprof"].append(time.monotonic() - t0)
        for row in json.loads(out.read_text())["results"]:
            per.setdefault((row["collective"], row["nbytes"], row["inplace"]), {}).setdefault(
                "commprof", []).append(row["time_us"])

    def loop():
        t0 = time.monotonic()
        outs = me("--loop", backend, ",".join(names), ",".join(map(str, sizes)), str(args.iters),
                  str(args.warmup), nproc=nproc, what=f"loop {backend}")
        walls["loop"].append(time.monotonic() - t0)
        by_rank = [json.loads(o.strip().splitlines()[-1]) for o in outs]
        for rows in zip(*by_rank):
            key = (rows[0]["collective"], rows[0]["nbytes"], rows[0]["inplace"])
            per.setdefault(key, {}).setdefault("loop", []).append(statistics.fmean(x["time_us"] for x in rows))

    common.interleaved({"commprof": bench, "loop": loop}, args.rounds)
    rows = []
    for (name, nbytes, inplace), arms in sorted(per.items()):
        if len(arms.get("loop", ())) == len(arms.get("commprof", ())) > 0:
            rows.append({"collective": name, "nbytes": nbytes, "inplace": inplace,
                         "commprof_us": statistics.median(arms["commprof"]), "loop_us": statistics.median(arms["loop"]),
                         **common.ratio_ci(arms["commprof"], arms["loop"])})
    worst = max((abs(r["ratio"] - 1), r["collective"], r["nbytes"]) for r in rows) if rows else None
    return {"backend": backend, "nproc": nproc, "rows": rows, "worst": worst,
            "wall_s": {k: statistics.median(v) for k, v in walls.items()},
            "wall_ratio": common.ratio_ci(walls["commprof"], walls["loop"])}


def split(comm: str, args, tmp: Path) -> dict:
    knobs = ["--comm", comm, "--mib", str(args.mib), "--forward-ms", "4", "--backward-ms", "6"]
    said = common.ranks([sys.executable, str(SCRIPT), "--truth", "--steps", "3", *knobs], 1, env=common.with_root(),
                        timeout_s=300, what=f"truth {comm}")
    truth = json.loads(said[0].strip().splitlines()[-1])
    out = tmp / f"profile-{comm}.json"
    commprof("profile", "--backend", "nccl", "--nproc", "1", "--json", str(out), "--", str(SCRIPT),
             "--steps", str(args.steps + 4), "--cycles-per-ms", str(truth["cycles_per_ms"]), *knobs,
             what=f"profile {comm}")
    s = json.loads(out.read_text())["summary"]
    c = truth["gather_ms"]
    hidden = comm == "async"
    expect = {"compute_ms": truth["forward_ms"] + truth["backward_ms"] + truth["step_ms"], "comm_ms": c,
              "overlap_ms": c if hidden else 0.0, "exposed_comm_ms": 0.0 if hidden else c,
              "wall_ms": truth["iteration_ms"], "data_ms": truth["gate_ms"] if hidden else 0.0}
    # overlap and exposed are 0 or the op's time: their error is judged against the op's time
    err = {k: (s[k] - v) / (v if k in ("compute_ms", "comm_ms", "wall_ms") else c) for k, v in expect.items()
           if k != "data_ms"}
    return {"comm": comm, "truth": truth, "expected": expect, "measured": {k: s[k] for k in expect},
            "error": err, "worst": max(abs(e) for e in err.values())}


def kineto_syncs(path: Path, step_names: str = "ProfilerStep#") -> dict:
    doc = json.loads(path.read_text())
    ev = doc["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("ph") == "X" and e["name"].startswith(step_names)
             and e.get("cat") != "gpu_user_annotation"]  # the host's step ranges, not their GPU projections
    found = {name: 0 for name in SYNCS}
    for e in ev:
        if e.get("ph") == "X" and e["name"] in found and any(a <= e["ts"] < b for a, b in steps):
            found[e["name"]] += 1
    return {"steps": len(steps), "per_step": {k: v / max(1, len(steps)) for k, v in found.items()}}


def run_and_memory(args, tmp: Path) -> dict:
    out = {}
    common_flags = ["--model", "resnet18", "--steps", str(args.steps), "--warmup", "2", "--eval-samples", "0",
                    "--batch-size", str(args.batch)]
    for label, flags in (("ddp nccl", ["--strategy", "ddp", "--backend", "nccl", "--nproc", "1"]),
                         ("torch-ddp nccl", ["--strategy", "torch-ddp", "--backend", "nccl", "--nproc", "1"]),
                         ("ddp gloo cuda", ["--strategy", "ddp", "--backend", "gloo", "--device", "cuda",
                                            "--nproc", "2"])):
        j, kin = tmp / f"run-{label.replace(' ', '-')}.json", tmp / f"kineto-{label.replace(' ', '-')}"
        traced = tmp / f"trace-{label.replace(' ', '-')}"
        extra = ["--torch-profiler", str(kin)] if "nccl" in label else ["--trace", str(traced)]
        table = commprof("run", *flags, *common_flags, "--json", str(j), *extra, what=f"run {label}")
        print(table, flush=True)
        doc = json.loads(j.read_text())
        row = {"summary": {k: doc["summary"][k] for k in ("wall_ms", "compute_ms", "comm_ms", "exposed_comm_ms",
                                                          "overlap_ms", "peak_mem_bytes")},
               "bucket_mb": doc["config"]["bucket_mb"], "lr": doc["config"]["lr"]}
        traces = sorted(kin.glob("rank0*.json")) if extra else []
        if traces:
            row["syncs"] = kineto_syncs(traces[0])
        for rank_trace in sorted(traced.glob("rank*.trace.json")):  # the device clock against the host's
            meta = [e for e in json.loads(rank_trace.read_text()) if e.get("ph") == "M"]
            row.setdefault("clock", []).append(
                {e["name"]: e["args"] for e in meta if e["name"] in ("gpu_clock_sync", "gpu_clock_rate")})
        out[label] = row
    first = out["torch-ddp nccl"]
    plain = json.loads(me("--plain", str(args.steps), str(args.batch), str(first["lr"]), str(first["bucket_mb"]),
                          str(tmp), str(args.rounds), what="plain DDP")[0].strip().splitlines()[-1])
    plain["syncs"] = kineto_syncs(tmp / "plain.pt.trace.json")
    waits = plain.pop("step_ms")
    plain["wait_per_step"] = common.ratio_ci([r["with"] for r in waits], [r["without"] for r in waits])
    plain["step_ms"] = {k: statistics.median(r[k] for r in waits) for k in ("with", "without")}
    for label in out:
        if "nccl" in label:
            out[label]["peak_over_plain"] = out[label]["summary"]["peak_mem_bytes"] / plain["max_memory_allocated"]
    return {"runs": out, "plain": plain}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--loop":
        backend, names, sizes, iters, warmup = sys.argv[2:7]
        return loop_worker(backend, names.split(","), [int(s) for s in sizes.split(",")], int(iters), int(warmup))
    if len(sys.argv) > 1 and sys.argv[1] == "--plain":
        steps, batch, lr, bucket, folder, rounds = sys.argv[2:8]
        return plain_worker(int(steps), int(batch), float(lr), float(bucket), folder, int(rounds))
    p = common.parser(__doc__, json="gpu-truth-results.json")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--max-bytes", type=int, default=16 << 20, help="gloo's largest size; NCCL's is 64 × that")
    p.add_argument("--nccl-min-bytes", type=int, default=64 << 20)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--mib", type=float, default=512.0)
    p.add_argument("--parts", default="timing,split,run", help="a comma list of timing, split, run")
    args = common.parse(p, {"rounds": 1, "iters": 5, "warmup": 2, "max_bytes": 1 << 20, "nccl_min_bytes": 1 << 20,
                           "steps": 6, "mib": 64.0})
    from commprof.base.backends import cuda_devices

    if not cuda_devices():
        common.skip("gpu_truth", "no CUDA GPU is visible")
    parts = args.parts.split(",")
    import torch

    result = {"env": common.env_record(sys.argv[1:], 1), "gpu": torch.cuda.get_device_name(0)}
    with tempfile.TemporaryDirectory(prefix="gpu-truth-") as tmp:
        if "timing" in parts:
            # NCCL at one rank moves nothing in place and copies out of place: only copies of 64 MiB and more
            # keep the device busier than the host that issues them, the case a per-op time is for
            result["timing"] = [timing("nccl", 1, list(COLLECTIVES), args, Path(tmp), args.nccl_min_bytes,
                                       64 * args.max_bytes),
                                timing("gloo", 2, ["all_reduce", "broadcast"], args, Path(tmp), 64 << 10,
                                       args.max_bytes)]
            print(json.dumps(result["timing"], indent=1), flush=True)
        if "split" in parts:
            result["split"] = [split(c, args, Path(tmp)) for c in ("blocking", "async")]
            print(json.dumps(result["split"], indent=1), flush=True)
        if "run" in parts:
            result["run"] = run_and_memory(args, Path(tmp))
            print(json.dumps(result["run"], indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
