"""The hand-written algorithms (commprof.kernels) against the library and against their α–β model.

Part 1 — ring vs library: `commprof bench all_reduce --algo library,ring -b 64M -e 64M` (--ring-size) on
gloo and on MPI, 2 and 4 ranks (--configs); each run measures the library's all_reduce and ours back to
back, --rounds runs per configuration, and the ratio is ours / library busbw (in-place: the mode both
have), per run then the median, with its 95 % CI (benchmarks/common.py's median_ci).

Part 2 — the model: `commprof bench --algo all -b 8 -e <--sweep-max> -f 4` on the same four
configurations; every algorithm row carries the time measured and the α–β prediction from the
run's own sendrecv sweep. The table gives measured / modelled at three sizes, the PNG every
algorithm's measured and modelled time over the whole sweep.

    pip install -e ".[bench]"            # matplotlib, for the plot
    python benchmarks/algorithms.py [--quick] [--rounds 3] [--sweep-max 16M] [--ring-size 64M]
                                    [--configs gloo:2,mpi:2,gloo:4,mpi:4] [--json PATH] [--png PATH]

--quick: gloo on 2 ranks, one ring run at 1 MiB, the sweep to 64 KiB; a few seconds, to see that it runs.

Runs are sequential and the machine should be otherwise idle; 4 ranks on a 2-core machine are
oversubscribed (the header of every bench run says so) and their figures include scheduling.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

from common import job, median_ci, parse, parser

CONFIGS = (("gloo", 2), ("mpi", 2), ("gloo", 4), ("mpi", 4))
SHOWN_SIZES = (8 << 10, 512 << 10, 8 << 20)
QUICK = {"rounds": 1, "iters": 2, "sweep_max": "64K", "ring_size": "1M", "configs": "gloo:2"}
"""--quick: gloo on 2 ranks only, one ring run at 1 MiB, the sweep to 64 KiB, 2 iterations a size."""


def bench(args: list[str]) -> list[dict]:
    """One `commprof bench` run; its JSON records."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        job([sys.executable, "-m", "commprof", "bench", *args, "--json", str(out)], timeout_s=3600,
            what=f"commprof bench {' '.join(args)}")
        return json.loads(out.read_text())["results"]


def ring_vs_library(configs: list[tuple[str, int]], size: str, rounds: int, iters: int) -> list[dict]:
    rows = []
    for backend, nproc in configs:
        ratios, runs = [], []
        for _ in range(rounds):
            recs = bench(["all_reduce", "--algo", "library,ring", "--backend", backend, "--nproc", str(nproc),
                          "-b", size, "-e", size, "-n", str(iters), "-w", "2"])
            by = {r["algo"]: r for r in recs if r["collective"] == "all_reduce" and r["inplace"]}
            ratios.append(by["ring"]["busbw_GBps"] / by["library"]["busbw_GBps"])
            runs.append({"library_busbw_GBps": by["library"]["busbw_GBps"],
                         "ring_busbw_GBps": by["ring"]["busbw_GBps"]})
        rows.append({"backend": backend, "nproc": nproc, "ratio_median": statistics.median(ratios),
                     "ratio_ci95": median_ci(ratios), "ratios": ratios, "runs": runs})
        print(f"ring/library busbw at {size}, {backend} × {nproc}: {statistics.median(ratios):.3f} "
              f"(rounds {min(ratios):.3f}–{max(ratios):.3f})", flush=True)
    return rows


def model_sweep(configs: list[tuple[str, int]], sweep_max: str, iters: int) -> list[dict]:
    out = []
    for backend, nproc in configs:
        recs = bench(["--algo", "all", "--backend", backend, "--nproc", str(nproc), "-b", "8", "-e", sweep_max,
                      "-f", "4", "-n", str(iters), "-w", "2"])
        for r in recs:
            if r["algo"] != "library" and r["inplace"] == (r["collective"] == "broadcast"):
                out.append({k: r[k] for k in ("collective", "algo", "backend", "world_size", "nbytes", "time_us",
                                              "model_us", "time_over_model", "busbw_GBps", "steps", "alpha_beta")})
        fit = next(r["alpha_beta"] for r in out if r["backend"] == backend and r["world_size"] == nproc)
        print(f"α–β fit {backend} × {nproc}: α = {fit['alpha_us']:.1f} µs, β = {fit['beta_ns_per_B']:.3f} ns/B",
              flush=True)
    return out


def model_table(rows: list[dict]) -> str:
    """Markdown: measured / modelled per algorithm and configuration at SHOWN_SIZES."""
    configs = [c for c in CONFIGS if any((r["backend"], r["world_size"]) == c for r in rows)]
    head = "| algorithm | " + " | ".join(f"{b} × {n}" for b, n in configs) + " |"
    lines = [head, "|---|" + "---|" * len(configs)]
    algos = list(dict.fromkeys((r["collective"], r["algo"]) for r in rows))
    for coll, algo in algos:
        cells = []
        for backend, nproc in configs:
            mine = {r["nbytes"]: r for r in rows if (r["collective"], r["algo"], r["backend"], r["world_size"])
                    == (coll, algo, backend, nproc)}
            picks = [_nearest(mine, s) for s in SHOWN_SIZES]
            cells.append(" / ".join("–" if p is None or p["time_over_model"] is None
                                    else f"{p['time_over_model']:.2f}" for p in picks))
        lines.append(f"| {coll} {algo} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _nearest(by_size: dict, size: int) -> dict | None:
    if not by_size:
        return None
    return by_size[min(by_size, key=lambda s: abs(s - size))]


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algos = list(dict.fromkeys((r["collective"], r["algo"]) for r in rows))
    cols = 4
    nrows = (len(algos) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(16, 3.2 * nrows), squeeze=False)
    colors = dict(zip(CONFIGS, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    for ax, (coll, algo) in zip(axes.flat, algos):
        for cfg in CONFIGS:
            mine = sorted((r for r in rows if (r["collective"], r["algo"], r["backend"], r["world_size"])
                           == (coll, algo, *cfg)), key=lambda r: r["nbytes"])
            if not mine:
                continue
            x = [r["nbytes"] for r in mine]
            ax.plot(x, [r["time_us"] for r in mine], "-o", ms=2.5, color=colors[cfg], label=f"{cfg[0]} × {cfg[1]}")
            ax.plot(x, [r["model_us"] for r in mine], "--", color=colors[cfg], alpha=0.7)
        ax.set(xscale="log", yscale="log", title=f"{coll} · {algo}", xlabel="size (B)", ylabel="time (µs)")
        ax.grid(True, which="major", alpha=0.3)
    for ax in list(axes.flat)[len(algos):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, title="solid measured, dashed α–β", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    p = parser(__doc__, json="algorithms-results.json", png="algorithms.png")
    p.add_argument("--rounds", type=int, default=3, help="runs per configuration for the 64 MiB ratio")
    p.add_argument("--iters", type=int, default=5, help="timed iterations per size (-n)")
    p.add_argument("--sweep-max", default="16M", help="largest size of the model sweep (-e)")
    p.add_argument("--ring-size", default="64M", help="the size ring and library are set side by side at")
    p.add_argument("--configs", default=",".join(f"{b}:{n}" for b, n in CONFIGS),
                   help="backend:ranks, comma-separated (default: all four)")
    p.add_argument("--replot", action="store_true", help="only redraw the table and PNG from --json")
    args = parse(p, QUICK)
    if args.replot:
        if not args.json or not args.png:
            p.error("--replot reads --json and draws --png: give both")
        doc = json.loads(Path(args.json).read_text())
        print(model_table(doc["model_sweep"]))
        plot(doc["model_sweep"], Path(args.png))
        return
    configs = [(b, int(n)) for b, n in (c.split(":") for c in args.configs.split(","))]
    if not set(configs) <= set(CONFIGS):
        p.error(f"--configs: each of {', '.join(f'{b}:{n}' for b, n in CONFIGS)}")
    ring = ring_vs_library(configs, args.ring_size, args.rounds, args.iters)
    sweep = model_sweep(configs, args.sweep_max, args.iters)
    print(model_table(sweep))
    if args.json:
        Path(args.json).write_text(json.dumps({"ring_vs_library": ring, "model_sweep": sweep,
                                               "argv": ["python", *sys.argv]}, indent=1) + "\n")
    if args.png:
        plot(sweep, Path(args.png))
    written = [path for path in (args.json, args.png) if path]
    if written:
        print(f"wrote {' and '.join(written)}")


if __name__ == "__main__":
    main()
