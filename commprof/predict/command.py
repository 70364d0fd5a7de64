"""`commprof predict RUN.json [RUN.json …] --fabric …`: the step time of each measured strategy at N ranks,
from the iteration it measured (its trace) and a fabric's α and β per level.

    commprof run --strategy ddp --nproc 2 --trace t/ --json ddp.json
    commprof predict ddp.json --fabric "intra=450GB/s,3us;inter=50GB/s,8us" --ranks-per-host 8 --plot p.png
    commprof predict ddp.json fsdp.json --fabric bench.json --ranks 2,3,4 --json predicted.json

Each input is a run (or profile) JSON made with --trace, or the trace itself. Every measured iteration is
replayed at each N (perfmodel/replay.py) and the median taken. Efficiency is the replay with free
communication over the predicted step: 1.0 is perfect weak scaling.

Exercised by: `pytest tests/unit/test_predict.py tests/test_bad_input.py`.
"""

from __future__ import annotations

import argparse
from collections import Counter

from commprof.base.errors import UsageError
from commprof.base.inputs import wrong_shape

"""What predict says of an input it cannot use, before why."""

DEFAULT_RANKS = tuple(2 ** k for k in range(1, 11))
"""2 … 1024."""


def add_parser(subparsers, summary: str) -> None:
    p = subparsers.add_parser("predict", help=summary, description="""\
The step time of each measured strategy at N ranks, from the iterations it measured (its trace) and a
fabric's α (latency) and β (time per byte) per level. Each input is a run or profile JSON made with
--trace, or the trace itself; every measured iteration is replayed at each N and the median taken.
Efficiency is the replay with free communication over the predicted step: 1.0 is perfect weak scaling.

examples:
  commprof run --strategy ddp --nproc 2 --trace t/ --json ddp.json
  commprof predict ddp.json --fabric "intra=450GB/s,3us;inter=50GB/s,8us" \\
      --ranks-per-host 8 --plot p.png
  commprof predict ddp.json fsdp.json --fabric bench.json --ranks 2,3,4
""")
    p.add_argument("inputs", nargs="+", metavar="RUN", help="run or profile JSON made with --trace, or its trace")
    p.add_argument("--fabric", required=True, metavar="SPEC",
                   help='α and β per level: "intra=450GB/s,3us;inter=50GB/s,8us", or a bench JSON to fit them from')
    p.add_argument("--ranks-per-host", type=int, metavar="R",
                   help="ranks on each host at N ranks (default: as measured)")
    p.add_argument("--ranks", metavar="N,N,…", help="rank counts to predict (default 2,4,…,1024)")
    p.add_argument("--json", metavar="FILE", help="the predictions as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="step time and efficiency against N, one line per input")
    p.set_defaults(func=main)


def parse_ranks(text: str | None) -> list[int]:
    if text is None:
        return list(DEFAULT_RANKS)
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise UsageError(f"cannot read --ranks {text!r}: use rank counts joined by commas, e.g. 2,4,8") from None
    if not counts or counts[0] < 1 or counts[-1] > 1 << 20:
        raise UsageError(f"--ranks {text}: rank counts run from 1 to {1 << 20}")
    return counts


def main(args: argparse.Namespace) -> int:
    from commprof.perfmodel import fabric as fabrics
    from commprof.perfmodel import replay, timeline

    wanted = parse_ranks(args.ranks)
    if args.ranks_per_host is not None and args.ranks_per_host < 1:
        raise UsageError(f"--ranks-per-host {args.ranks_per_host}: give 1 or more")
    fabric = fabrics.parse(args.fabric)
    rows = []
    for path in args.inputs:
        m = timeline.load(path)
        with wrong_shape(path, timeline.NOT_OURS):  # a trace field of another type, found as it is replayed
            measured_per_host = max(Counter(m.hosts).values())
            per_host = args.ranks_per_host or measured_per_host
            counts = replay.rank_counts(m, wanted)
            if not counts:
                raise UsageError(f"{path}: none of --ranks holds whole replicas of its {m.world_size} ranks")
            at_measured = replay.predict(m, m.world_size, fabric, measured_per_host)
            rows.append({"source": path, "strategy": m.strategy, "backend": m.backend, "world_size": m.world_size,
                         "algorithms": replay.algorithms(m.backend),
                         "hosts": len(set(m.hosts)), "ranks_per_host": per_host,
                         "measured_step_ms": m.measured_wall_ms, "replayed_step_ms": at_measured.step_ms,
                         "predictions": [replay.predict(m, n, fabric, per_host).as_record() for n in counts]})
    doc = {"command": "predict", "fabric": fabric.as_record(), "inputs": rows}
    render(doc)
    if args.json:
        from commprof.base.files import write_result

        write_result(args.json, doc)
    if args.plot:
        plot(doc, args.plot)
    return 0


PREDICT_NARROW_DROP = ("busy ms", "comm ms", "hosts", "throughput")
"""The columns a narrow terminal leaves out of the prediction table, first to last (the JSON has them)."""


def render(doc: dict) -> None:
    from rich.table import Table

    from commprof.report.fit import Narrowing, results_console

    out = results_console()
    levels = ", ".join(f"{name} {lv['bandwidth_GBps']:.4g} GB/s + {lv['alpha_us']:.3g} µs ({lv['source']})"
                       for name, lv in doc["fabric"].items() if lv)
    out.print(f"commprof predict · fabric: {levels}")
    for row in doc["inputs"]:
        out.print(f"{row['strategy']} ({row['source']}): measured at {row['world_size']} rank(s) on {row['hosts']} "
                  f"host(s): {row['measured_step_ms']:.2f} ms/iteration; replayed there: "
                  f"{row['replayed_step_ms']:.2f} ms ({row['replayed_step_ms'] / row['measured_step_ms']:.3f}×)")
    table = Table(title="predicted step per rank count")
    for name in ("strategy", "ranks", "hosts", "step\nms", "comm\nms", "exposed\nms", "busy\nms", "throughput",
                 "efficiency"):
        table.add_column(name, justify="left" if name == "strategy" else "right")
    for row in doc["inputs"]:
        for p in row["predictions"]:
            rate = "–" if p["throughput"] is None else f"{p['throughput']:,.1f}/s"
            table.add_row(row["strategy"], str(p["ranks"]), str(p["hosts"]), f"{p['step_ms']:.2f}",
                          f"{p['comm_ms']:.2f}", f"{p['exposed_comm_ms']:.2f}", f"{p['busy_ms']:.2f}", rate,
                          f"{p['efficiency']:.3f}")
    out.print(Narrowing(table, PREDICT_NARROW_DROP))


def plot(doc: dict, path: str) -> None:
    from commprof.report.canvas import color as _color
    from commprof.report.canvas import figure as _figure

    with _figure(path, (10.0, 4.5), 1, 2) as (fig, axes):
        step, eff = axes[0][0], axes[0][1]
        for i, row in enumerate(doc["inputs"]):
            n = [p["ranks"] for p in row["predictions"]]
            step.plot(n, [p["step_ms"] for p in row["predictions"]], marker="o", color=_color(i),
                      label=row["strategy"])
            step.plot(n, [p["step_ms"] - p["exposed_comm_ms"] for p in row["predictions"]], linestyle=":",
                      color=_color(i))
            eff.plot(n, [p["efficiency"] for p in row["predictions"]], marker="o", color=_color(i),
                     label=row["strategy"])
        for ax, title, unit in ((step, "step time (dotted: without exposed comm)", "ms"),
                                (eff, "scaling efficiency", "free comm / predicted")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("ranks")
            ax.set_ylabel(unit)
            ax.set_title(title)
            ax.grid(True, alpha=0.3)
            ax.legend()
        eff.set_ylim(0, 1.05)
