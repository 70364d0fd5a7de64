"""commprof held to a link of known speed: two hosts made by tools/fabric (network namespaces, each link
shaped to RATE both ways, each host pinned to a core of its own), one rank on each, for each rate in turn:

- `bench sendrecv all_reduce --algo library,ring` on gloo (torchrun, c10d rendezvous) and on MPI (hydra
  starting its proxies through the fabric): the α–β fit of the sendrecv sweep from 64 KiB up
  (bandwidth 1/β), the 8-byte exchange's time next to the same with both ranks on one host (the latency:
  with no added delay, the software's own), and the library all_reduce's bus bandwidth at the largest
  size, each over the rate;
- `run --strategy ddp --model mobilenet_v2` on gloo: comm time per step against the wire bytes per step
  over the rate (what the link alone would take).

    sudo python benchmarks/fabric_link.py [--rates 1gbit,200mbit] [--json PATH]

Needs root, ip, tc, unshare (tools/fabric). Results: README, "Across hosts: tools/fabric".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FABRIC = str(ROOT / "tools" / "fabric")
HOSTS = ("cpf-h0", "cpf-h1")
# TCP/IPv4 with timestamps carries 1448 B of payload in a 1514-byte frame: the most a shaped link gives
# (printed beside the figures, which are all over the rate itself)
GOODPUT = 1448 / 1514


def rate_GBps(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg])bit", text)
    return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8 / 1e9


def on_hosts(argvs: list[tuple[str, list[str]]], timeout: float = 600) -> None:
    procs = [subprocess.Popen([FABRIC, "exec", host, "--", *argv], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for host, argv in argvs]
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            sys.exit(f"fabric_link: a rank failed: {err.strip().splitlines()[-1:]}")


def torchrun(port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"cpf-h0:{port}", "--rdzv-id", "link", "-m", "commprof"]


def bench(backend: str, out: Path, max_bytes: str, *, loopback: bool = False) -> dict:
    args = ["bench", "sendrecv", "all_reduce", "--algo", "library,ring", "-b", "8", "-e", max_bytes, "-f", "4",
            "-n", "5", "-w", "2", "--backend", backend, "--json", str(out)]
    if loopback:  # both ranks on one host, on all the cores: the software's own latency, no link in the way
        every = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        on_hosts([("cpf-h0", ["taskset", "-c", every, sys.executable, "-m", "commprof", *args, "--nproc", "2"])])
    elif backend == "mpi":
        from commprof.launch import find_mpiexec

        on_hosts([("cpf-h0", [find_mpiexec(), "-launcher", "rsh", "-launcher-exec", FABRIC, "-hosts", ",".join(HOSTS),
                              "-n", "2", "-ppn", "1", sys.executable, "-m", "commprof", *args])])
    else:
        on_hosts([(h, [*torchrun(29501), *args]) for h in HOSTS])
    from commprof.bench.alphabeta import fit

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


def ddp(out: Path) -> dict:
    on_hosts([(h, [*torchrun(29502), "run", "--strategy", "ddp", "--model", "mobilenet_v2", "--batch-size", "16",
                   "--steps", "8", "--warmup", "2", "--eval-samples", "0", "--json", str(out)]) for h in HOSTS])
    doc = json.loads(out.read_text())
    wire = sum(v["wire_bytes_per_step"] for v in doc["volume"].values())
    return {"comm_ms": doc["summary"]["comm_ms"], "exposed_ms": doc["summary"]["exposed_comm_ms"],
            "wall_ms": doc["summary"]["wall_ms"], "wire_bytes_per_step": wire}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="1gbit,200mbit")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "fabric-link-results.json"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fabric-link-") as tmp:
        try:
            for rate in args.rates.split(","):
                subprocess.run([FABRIC, "up", "2", "--rate", rate, "--pin"], check=True)
                link = rate_GBps(rate)
                row = {"rate": rate, "rate_GBps": link}
                for backend in ("gloo", "mpi"):
                    row[backend] = bench(backend, Path(tmp) / f"{rate}-{backend}.json", "16M")
                row["ddp"] = ddp(Path(tmp) / f"{rate}-ddp.json")
                row["ddp"]["link_ms"] = row["ddp"]["wire_bytes_per_step"] / (link * 1e9) * 1e3
                for backend in ("gloo", "mpi"):
                    row[backend]["loopback_8B_us"] = bench(backend, Path(tmp) / f"{rate}-{backend}-lo.json", "16M",
                                                           loopback=True)["latency_8B_us"]
                rows.append(row)
                for backend in ("gloo", "mpi"):
                    b = row[backend]
                    print(f"{rate} {backend}: fit {b['fit_bandwidth_GBps'] / link:.3f} × rate, 8 B exchange "
                          f"{b['latency_8B_us']:.0f} us (one host: {b['loopback_8B_us']:.0f} us),"
                          f" all_reduce busbw {b['all_reduce_busbw_GBps'] / link:.3f} × rate", flush=True)
                d = row["ddp"]
                print(f"{rate} ddp: comm {d['comm_ms']:.1f} ms, link alone {d['link_ms']:.1f} ms "
                      f"({d['comm_ms'] / d['link_ms']:.3f})", flush=True)
        finally:
            subprocess.run([FABRIC, "down"], check=False)
    Path(args.json).write_text(json.dumps({"goodput": GOODPUT, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("fabric_link: needs root (tools/fabric)")
    sys.exit(main())
