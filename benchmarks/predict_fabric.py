"""`commprof predict` held to runs it did not see: four hosts made by tools/hosts (every link shaped to
RATE), one rank on each. Fit on two hosts — `bench sendrecv` for the link's α and β, `run --trace` of each
strategy for the measured iteration — then predict three and four hosts, and run them.

Each host runs on core i mod cores (taskset; torch then takes one thread a rank): on this 2-core machine
three or four ranks share two cores, so the busy time measured at 3 and 4 hosts is printed beside the
2-host one the prediction keeps. The model (squeezenet1_0, 2.9 MB of gradients, batch 4) keeps compute
a few percent of a step, so the comparison is of the communication the replay re-times.

    sudo python benchmarks/predict_fabric.py [--quick] [--rates 50mbit,100mbit] [--hosts 2,3,4]
                                             [--strategies ddp,fsdp] [--steps 12] [--json PATH] [--plot PNG]

--quick: 2 hosts at 1gbit, ddp alone, fit on the 2 hosts and predicted for them, 3 steps a run (one
measured); to see that it runs.

The hosts are a fabric of this run's own (COMMPROF_FABRIC=pf<pid>: hosts pf<pid>-h0 …), so another fabric
on the machine is left alone. Needs root, ip, tc, unshare (tools/hosts): without them it says so in one
line and exits 77. Results: benchmarks/README.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, job, parse, parser, run_all, skip

FABRIC = str(ROOT / "tools" / "hosts")
NAME = f"pf{os.getpid()}"
"""This run's fabric (COMMPROF_FABRIC): hosts NAME-h0 …, apart from any other fabric on the machine."""
STRATEGIES = ("ddp", "fsdp")
RUN = ("--model", "squeezenet1_0", "--batch-size", "4", "--steps", "12", "--warmup", "2", "--eval-samples", "0")
QUICK = {"rates": "1gbit", "hosts": "2", "strategies": "ddp", "steps": 3}
"""--quick: the smallest fabric (2 hosts, predicted from themselves), one rate, ddp alone, one measured step."""
TIMEOUT_S = 900


def on_hosts(k: int, argv: list[str], port: int) -> None:
    """`python -m torch.distributed.run … -m commprof ARGV` on hosts 0 … k−1, one rank each."""
    cores = sorted(os.sched_getaffinity(0))
    launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(k), "--nproc-per-node", "1",
              "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{NAME}-h0:{port}", "--rdzv-id", f"p{port}", "-m",
              "commprof"]
    hosts = [f"{NAME}-h{i}" for i in range(k)]
    run_all([([FABRIC, "exec", host, "--", "taskset", "-c", str(cores[i % len(cores)]), *launch, *argv], None)
             for i, host in enumerate(hosts)], timeout_s=TIMEOUT_S, what=f"predict_fabric: commprof {argv[0]}",
            labels=hosts)


def predicted(runs: list[Path], bench: Path, ranks: str, out: Path, plot: Path | None = None) -> dict:
    argv = [sys.executable, "-m", "commprof", "predict", *map(str, runs), "--fabric", str(bench), "--ranks", ranks,
            "--json", str(out)] + (["--plot", str(plot)] if plot else [])
    job(argv, timeout_s=TIMEOUT_S, what="predict_fabric: commprof predict")
    return json.loads(out.read_text())


def one_rate(rate: str, tmp: Path, plot: Path | None, *, hosts: list[int], strategies: list[str],
             run: list[str]) -> dict:
    from commprof.perfmodel import timeline

    job([FABRIC, "up", str(max(hosts)), "--rate", rate], timeout_s=120, what="predict_fabric: tools/hosts up")
    try:
        bench = tmp / f"{rate}-bench.json"
        on_hosts(hosts[0], ["bench", "sendrecv", "-b", "256K", "-e", "4M", "-f", "4", "-n", "8", "-w", "2",
                            "--backend", "gloo", "--json", str(bench)], 29801)
        measured = {}
        for s in strategies:
            for k in hosts:
                out = tmp / f"{rate}-{s}-{k}.json"
                on_hosts(k, ["run", "--strategy", s, *run, "--json", str(out), "--trace", str(tmp / f"{rate}-{s}-{k}")],
                         29810 + k)
                m = timeline.load(str(out))
                busy = sorted(sum(st[1] for st in p.steps if st[0] == "busy") for it in m.iterations for p in it)
                measured[(s, k)] = {"step_ms": m.measured_wall_ms, "busy_ms": busy[len(busy) // 2]}
    finally:
        subprocess.run([FABRIC, "down"], check=False, timeout=120)
    fitted = [tmp / f"{rate}-{s}-{hosts[0]}.json" for s in strategies]
    doc = predicted(fitted, bench, ",".join(map(str, hosts)), tmp / f"{rate}-p.json")
    wide = predicted(fitted, bench, ",".join(str(2 ** i) for i in range(1, 11)), tmp / f"{rate}-wide.json", plot)
    rows = []
    for s, row, far in zip(strategies, doc["inputs"], wide["inputs"]):
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
    ap = parser(__doc__, json="predict-fabric-results.json")
    ap.add_argument("--rates", default="50mbit,100mbit")
    ap.add_argument("--plot", default=str(ROOT / "benchmarks" / "results" / "predict-fabric.png"),
                    help="of the first rate; '' for none")
    ap.add_argument("--hosts", default="2,3,4", help="hosts to run on: the first fits, each is predicted")
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help=f"of {', '.join(STRATEGIES)}")
    ap.add_argument("--steps", type=int, default=12,
                    help="steps of each run, its 2 warm-up steps included (default 12)")
    args = parse(ap, {**QUICK, "plot": None})
    hosts, strategies = [int(k) for k in args.hosts.split(",")], args.strategies.split(",")
    if hosts[0] < 2 or hosts != sorted(set(hosts)) or not set(strategies) <= set(STRATEGIES):
        ap.error(f"--hosts: rising, from 2; --strategies: of {', '.join(STRATEGIES)}")
    if os.geteuid() != 0:
        skip("predict_fabric", "needs root (tools/hosts)")
    if missing := [t for t in ("ip", "tc", "unshare") if shutil.which(t) is None]:
        skip("predict_fabric", f"tools/hosts needs {', '.join(missing)} on PATH")
    os.environ["COMMPROF_FABRIC"] = NAME  # every tools/hosts call below
    run = [*RUN[:RUN.index("--steps") + 1], str(args.steps), *RUN[RUN.index("--steps") + 2:]]
    with tempfile.TemporaryDirectory(prefix="predict-fabric-") as tmp:
        results = [one_rate(rate, Path(tmp), Path(args.plot) if i == 0 and args.plot else None, hosts=hosts,
                            strategies=strategies, run=run)
                   for i, rate in enumerate(args.rates.split(","))]
    if args.json:
        Path(args.json).write_text(json.dumps({"model": run, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
