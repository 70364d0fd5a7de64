"""commprof held to a link of known speed: two hosts made by tools/hosts (network namespaces, each link
shaped to RATE both ways, each host pinned to a core of its own), one rank on each, for each rate in turn:

- `bench sendrecv all_reduce --algo library,ring` on gloo (torchrun, c10d rendezvous) and on MPI (hydra
  starting its proxies through the fabric): the α–β fit of the sendrecv sweep from 64 KiB up
  (bandwidth 1/β), the 8-byte exchange's time next to the same with both ranks on one host (the latency:
  with no added delay, the software's own), and the library all_reduce's bus bandwidth at the largest
  size, each over the rate;
- `run --strategy ddp --model mobilenet_v2` on gloo: comm time per step against the wire bytes per step
  over the rate (what the link alone would take).

    sudo python benchmarks/fabric_link.py [--quick] [--rates 1gbit,200mbit] [--sweep-max 16M]
                                          [--model mobilenet_v2] [--steps 8] [--json PATH]

--quick: 1gbit only, the sweeps to 1 MiB, the one-host exchange on MPI alone, ddp on mnist-cnn for 3 steps;
to see that it runs.

The hosts are a fabric of this run's own (COMMPROF_FABRIC=fl<pid>: hosts fl<pid>-h0 and -h1), so another
fabric on the machine is left alone. Needs root, ip, tc, unshare (tools/hosts): without them it says so in
one line and exits 77. Results: benchmarks/README.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, job, parse, parser, run_all, skip

FABRIC = str(ROOT / "tools" / "hosts")
NAME = f"fl{os.getpid()}"
"""This run's fabric (COMMPROF_FABRIC): hosts NAME-h0, NAME-h1, apart from any other fabric on the machine."""
HOSTS = (f"{NAME}-h0", f"{NAME}-h1")
# TCP/IPv4 with timestamps carries 1448 B of payload in a 1514-byte frame: the most a shaped link gives
# (printed beside the figures, which are all over the rate itself)
GOODPUT = 1448 / 1514
QUICK = {"rates": "1gbit", "sweep_max": "1M", "model": "mnist-cnn", "steps": 3}
"""--quick: one rate, the sweeps to 1 MiB (two sizes from 64 KiB for the fit), ddp on mnist-cnn for 3 steps;
the one-host exchange on MPI alone (gloo's takes the same path)."""
TIMEOUT_S = 600


def rate_GBps(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg])bit", text)
    return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8 / 1e9


def on_hosts(argvs: list[tuple[str, list[str]]], what: str) -> None:
    """Each (host, argv) started at once inside its host; exits in one line when one fails."""
    run_all([([FABRIC, "exec", host, "--", *argv], None) for host, argv in argvs], timeout_s=TIMEOUT_S,
            what=f"fabric_link: {what}", labels=[host for host, _ in argvs])


def torchrun(port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{HOSTS[0]}:{port}", "--rdzv-id", "link", "-m", "commprof"]


def bench(backend: str, out: Path, max_bytes: str, *, loopback: bool = False) -> dict:
    args = ["bench", "sendrecv", "all_reduce", "--algo", "library,ring", "-b", "8", "-e", max_bytes, "-f", "4",
            "-n", "5", "-w", "2", "--backend", backend, "--json", str(out)]
    if loopback:  # both ranks on one host, on all the cores: the software's own latency, no link in the way
        every = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        on_hosts([(HOSTS[0], ["taskset", "-c", every, sys.executable, "-m", "commprof", *args, "--nproc", "2"])],
                 f"bench on {backend}, one host")
    elif backend == "mpi":
        from commprof.launcher.launch import find_mpiexec

        on_hosts([(HOSTS[0], [find_mpiexec(), "-launcher", "rsh", "-launcher-exec", FABRIC, "-hosts", ",".join(HOSTS),
                              "-n", "2", "-ppn", "1", sys.executable, "-m", "commprof", *args])], "bench on mpi")
    else:
        on_hosts([(h, [*torchrun(29501), *args]) for h in HOSTS], "bench on gloo")
    from commprof.perfmodel.alphabeta import fit

    doc = json.loads(out.read_text())
    p2p = {r["nbytes"]: r["time_us"] for r in doc["results"] if r["collective"] == "sendrecv"}
    # bandwidth from 64 KiB up (below, the token bucket's 64 KiB burst passes at memory speed);
    # the latency as the 8-byte exchange itself
    line = fit([(n, us * 1e-6) for n, us in p2p.items() if n >= 64 << 10]).as_record()
    top = max(r["nbytes"] for r in doc["results"])
    busbw = max(r["busbw_GBps"] for r in doc["results"]
                if r["collective"] == "all_reduce" and r["algo"] == "library" and r["nbytes"] == top)
    return {"fit_bandwidth_GBps": line["bandwidth_GBps"], "fit_alpha_us": line["alpha_us"],
            "latency_8B_us": p2p[min(p2p)], "all_reduce_busbw_GBps": busbw, "all_reduce_bytes": top}


def ddp(out: Path, model: str, steps: int) -> dict:
    on_hosts([(h, [*torchrun(29502), "run", "--strategy", "ddp", "--model", model, "--batch-size", "16",
                   "--steps", str(steps), "--warmup", "2", "--eval-samples", "0", "--json", str(out)]) for h in HOSTS],
             "run ddp")
    doc = json.loads(out.read_text())
    wire = sum(v["wire_bytes_per_step"] for v in doc["volume"].values())
    return {"comm_ms": doc["summary"]["comm_ms"], "exposed_ms": doc["summary"]["exposed_comm_ms"],
            "wall_ms": doc["summary"]["wall_ms"], "wire_bytes_per_step": wire}


def main() -> int:
    ap = parser(__doc__, json="fabric-link-results.json")
    ap.add_argument("--rates", default="1gbit,200mbit")
    ap.add_argument("--sweep-max", default="16M", help="largest size of the bench sweeps (-e; default 16M)")
    ap.add_argument("--model", default="mobilenet_v2", help="the ddp run's model (default mobilenet_v2)")
    ap.add_argument("--steps", type=int, default=8,
                    help="the ddp run's steps, its 2 warm-up steps included (default 8)")
    args = parse(ap, QUICK)
    if os.geteuid() != 0:
        skip("fabric_link", "needs root (tools/hosts)")
    if missing := [t for t in ("ip", "tc", "unshare") if shutil.which(t) is None]:
        skip("fabric_link", f"tools/hosts needs {', '.join(missing)} on PATH")
    os.environ["COMMPROF_FABRIC"] = NAME  # every tools/hosts call below, hydra's through it included
    rows = []
    with tempfile.TemporaryDirectory(prefix="fabric-link-") as tmp:
        try:
            for rate in args.rates.split(","):
                job([FABRIC, "up", "2", "--rate", rate, "--pin"], timeout_s=120, what="fabric_link: tools/hosts up")
                link = rate_GBps(rate)
                row = {"rate": rate, "rate_GBps": link}
                for backend in ("gloo", "mpi"):
                    row[backend] = bench(backend, Path(tmp) / f"{rate}-{backend}.json", args.sweep_max)
                row["ddp"] = ddp(Path(tmp) / f"{rate}-ddp.json", args.model, args.steps)
                row["ddp"]["link_ms"] = row["ddp"]["wire_bytes_per_step"] / (link * 1e9) * 1e3
                for backend in ("gloo", "mpi") if not args.quick else ("mpi",):
                    row[backend]["loopback_8B_us"] = bench(backend, Path(tmp) / f"{rate}-{backend}-lo.json",
                                                           args.sweep_max, loopback=True)["latency_8B_us"]
                rows.append(row)
                for backend in ("gloo", "mpi"):
                    b = row[backend]
                    # no bandwidth when the times of the sizes fitted do not grow (two sizes under --quick,
                    # on a busy machine): said so rather than divided
                    fit_bw = b["fit_bandwidth_GBps"]
                    fitted = ("no fit (times not growing with size)" if fit_bw is None
                              else f"fit {fit_bw / link:.3f} × rate")
                    lo = f" (one host: {b['loopback_8B_us']:.0f} us)" if "loopback_8B_us" in b else ""
                    print(f"{rate} {backend}: {fitted}, 8 B exchange {b['latency_8B_us']:.0f} us{lo},"
                          f" all_reduce busbw {b['all_reduce_busbw_GBps'] / link:.3f} × rate", flush=True)
                d = row["ddp"]
                print(f"{rate} ddp: comm {d['comm_ms']:.1f} ms, link alone {d['link_ms']:.1f} ms "
                      f"({d['comm_ms'] / d['link_ms']:.3f})", flush=True)
        finally:
            subprocess.run([FABRIC, "down"], check=False, timeout=120)
    if args.json:
        Path(args.json).write_text(json.dumps({"goodput": GOODPUT, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
