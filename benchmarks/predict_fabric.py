"""`commprof predict` held to runs it did not see: four hosts made by tools/fabric (every link shaped to
RATE), one rank on each. Fit on two hosts — `bench sendrecv` for the link's α and β, `run --trace` of each
strategy for the measured iteration — then predict three and four hosts, and run them.

Each host runs on core i mod cores (taskset; torch then takes one thread a rank): on this 2-core machine
three or four ranks share two cores, so the busy time measured at 3 and 4 hosts is printed beside the
2-host one the prediction keeps. The model (squeezenet1_0, 2.9 MB of gradients, batch 4) keeps compute
a few percent of a step, so the comparison is of the communication the replay re-times.

    sudo python benchmarks/predict_fabric.py [--rates 50mbit,100mbit] [--json PATH] [--plot PNG]

Needs root, ip, tc, unshare (tools/fabric). Results: README, "commprof predict".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FABRIC = str(ROOT / "tools" / "fabric")
STRATEGIES = ("ddp", "fsdp")
RUN = ("--model", "squeezenet1_0", "--batch-size", "4", "--steps", "12", "--warmup", "2", "--eval-samples", "0")


def on_hosts(k: int, argv: list[str], port: int) -> None:
    """`python -m torch.distributed.run … -m commprof ARGV` on hosts 0 … k−1, one rank each."""
    cores = sorted(os.sched_getaffinity(0))
    launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(k), "--nproc-per-node", "1",
              "--rdzv-backend", "c10d", "--rdzv-endpoint", f"cpf-h0:{port}", "--rdzv-id", f"p{port}", "-m", "commprof"]
    procs = [subprocess.Popen([FABRIC, "exec", f"cpf-h{i}", "--", "taskset", "-c", str(cores[i % len(cores)]),
                               *launch, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in range(k)]
    for p in procs:
        _, err = p.communicate(timeout=900)
        if p.returncode != 0:
            sys.exit(f"predict_fabric: a rank failed: {err.strip().splitlines()[-1:]}")


def predicted(runs: list[Path], bench: Path, ranks: str, out: Path, plot: Path | None = None) -> dict:
    argv = [sys.executable, "-m", "commprof", "predict", *map(str, runs), "--fabric", str(bench), "--ranks", ranks,
            "--json", str(out)] + (["--plot", str(plot)] if plot else [])
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def one_rate(rate: str, tmp: Path, plot: Path | None) -> dict:
    from commprof.predict import timeline

    subprocess.run([FABRIC, "up", "4", "--rate", rate], check=True)
    try:
        bench = tmp / f"{rate}-bench.json"
        on_hosts(2, ["bench", "sendrecv", "-b", "256K", "-e", "4M", "-f", "4", "-n", "8", "-w", "2", "--backend", "gloo",
                     "--json", str(bench)], 29801)
        measured = {}
        for s in STRATEGIES:
            for k in (2, 3, 4):
                out = tmp / f"{rate}-{s}-{k}.json"
                on_hosts(k, ["run", "--strategy", s, *RUN, "--json", str(out), "--trace", str(tmp / f"{rate}-{s}-{k}")],
                         29810 + k)
                m = timeline.load(str(out))
                busy = sorted(sum(st[1] for st in p.steps if st[0] == "busy") for it in m.iterations for p in it)
                measured[(s, k)] = {"step_ms": m.measured_wall_ms, "busy_ms": busy[len(busy) // 2]}
    finally:
        subprocess.run([FABRIC, "down"], check=False)
    doc = predicted([tmp / f"{rate}-{s}-2.json" for s in STRATEGIES], bench, "2,3,4", tmp / f"{rate}-p.json")
    wide = predicted([tmp / f"{rate}-{s}-2.json" for s in STRATEGIES], bench,
                     ",".join(str(2 ** i) for i in range(1, 11)), tmp / f"{rate}-wide.json", plot)
    rows = []
    for s, row, far in zip(STRATEGIES, doc["inputs"], wide["inputs"]):
        for p in row["predictions"]:
            got = measured[(s, p["ranks"])]
            rows.append({"strategy": s, "ranks": p["ranks"], "predicted_step_ms": p["step_ms"],
                         "measured_step_ms": got["step_ms"], "ratio": p["step_ms"] / got["step_ms"],
                         "predicted_busy_ms": p["busy_ms"], "measured_busy_ms": got["busy_ms"]})
            print(f"{rate} {s} at {p['ranks']} hosts: predicted {p['step_ms']:.1f} ms, measured "
                  f"{got['step_ms']:.1f} ms ({rows[-1]['ratio']:.3f}); busy {got['busy_ms']:.1f} ms measured, "
                  f"{p['busy_ms']:.1f} kept", flush=True)
        rows.extend({"strategy": s, "ranks": p["ranks"], "predicted_step_ms": p["step_ms"],
                     "efficiency": p["efficiency"], "far": True} for p in far["predictions"])
    return {"rate": rate, "fabric": doc["fabric"], "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="50mbit,100mbit")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "predict-fabric-results.json"))
    ap.add_argument("--plot", default=str(ROOT / "benchmarks" / "results" / "predict-fabric.png"), help="of the first rate")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="predict-fabric-") as tmp:
        results = [one_rate(rate, Path(tmp), Path(args.plot) if i == 0 else None)
                   for i, rate in enumerate(args.rates.split(","))]
    Path(args.json).write_text(json.dumps({"model": RUN, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("predict_fabric: needs root (tools/fabric)")
    sys.exit(main())
