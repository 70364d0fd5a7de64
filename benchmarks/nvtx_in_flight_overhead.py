"""What an op's in-flight NVTX range costs under Nsight Systems: `Comm` with its start/end range from issue to
completion (domain `commprof comm (<group>)`, record/annotate.py) against the same Comm without it, side by
side in one process run under `nsys profile --trace=nvtx`.

Two Comms over the same 1-rank gloo world: "with" labels its ops while in-flight ranges are on, "without"
while they are off (Annotator.in_flight, read when a Comm first labels an op), so both carry the issuing
call's push/pop range and differ by the start_range and end_range calls alone. Turn by turn, each turn
calls both, in alternating order, each call timed alone (neighbouring calls share the machine's moment,
which blocks of calls do not): an in-place 8-byte all_reduce, synchronous (the range ends right after
the end stamp), then in turns of its own async + wait() (it ends in the wait). A 1-rank op is local, so
the NVTX calls are a large share of it: the worst case. Without a tool attached neither arm makes those
calls. For scale, bare push/pop pairs against bare start/end pairs, turn by turn too: what nsys itself
takes per range.

    python benchmarks/nvtx_in_flight_overhead.py [--quick] [--turns 100000] [--json PATH]

Per mode: with and without in µs per op (medians over turns), extra = the median over turns of
(with − without) with its 95 % CI (benchmarks/common.py's median_ci), and with ÷ without (of the medians).
Needs `nsys` on PATH (tools/install_nsys.sh); exits 77 saying so otherwise. --quick: 2,000 turns.

Target: extra ≤ one bare push/pop pair under the same nsys + 0.5 µs — the range itself, the code around
it no more than half a µs. Results: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import job, median_ci, order, parse, parser, skip, with_root

SLACK_US = 0.5
"""What the op path may add to the NVTX calls themselves."""
MODES = ("sync", "async")
QUICK = {"turns": 2000}
"""--quick: 2,000 turns per mode."""
TIMEOUT_S = 900


def worker(turns: int, out: str) -> None:
    import torch
    from torch.distributed import distributed_c10d as c10d

    from commprof.base.backends import free_port
    from commprof.comm.gloo_comm import comm_class
    from commprof.record.annotate import ANNOTATOR
    from commprof.record.clock import CpuClock
    from commprof.record.recorder import OpRecorder

    assert ANNOTATOR.in_flight, "no NVTX tool attached: run under nsys (this script's main does)"
    torch.set_num_threads(1)
    c10d.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    t = torch.zeros(2)
    key = ("all_reduce", t.nbytes, t.dtype)
    comms = {}
    for arm in ("with", "without"):
        ANNOTATOR.in_flight = arm == "with"
        comms[arm] = comm_class("gloo")(backend="gloo", group=None, ranks=[0], control_group=None,
                                        device=torch.device("cpu"), clock=CpuClock(), recorder=OpRecorder(CpuClock()))
        comms[arm].all_reduce(t)  # labels its op now, in its arm's mode
        comms[arm].all_reduce(t, async_op=True).wait()
    assert comms["with"]._labels[key][2] is not None and comms["without"]._labels[key][2] is None
    label, flight = comms["with"]._labels[key][0], comms["with"]._labels[key][2]
    domain = ANNOTATOR.domain
    calls = {
        "sync": {arm: (lambda c=comm: c.all_reduce(t)) for arm, comm in comms.items()},
        "async": {arm: (lambda c=comm: c.all_reduce(t, async_op=True).wait()) for arm, comm in comms.items()},
        "bare": {"push/pop": lambda: (domain.push_range(label.attrs), domain.pop_range()),
                 "start/end": lambda: flight.end(flight.start(flight.attrs))},
    }
    clock = time.perf_counter_ns
    times = {mode: {arm: [] for arm in arms} for mode, arms in calls.items()}
    for mode, arms in calls.items():
        kept = times[mode]
        for i in range(turns + turns // 10):  # the first tenth warms up and is not kept
            for arm in order(arms, i):
                call = arms[arm]
                start = clock()
                call()
                elapsed = clock() - start
                if i >= turns // 10:
                    kept[arm].append(elapsed / 1e3)
            if i % 1000 == 0:
                for comm in comms.values():
                    comm.recorder.clear()
    Path(out).write_text(json.dumps(times))
    c10d.destroy_process_group()


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--turns", type=int, default=100_000)
    p.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    args = parse(p, QUICK)
    if args.worker:
        worker(args.turns, args.worker)
        return 0
    nsys = shutil.which("nsys")
    if nsys is None:
        skip("nvtx_in_flight_overhead", "nsys is not on PATH (tools/install_nsys.sh installs it)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        env = {**with_root(), "NSYS_NVTX_PROFILER_REGISTER_ONLY": "0", "OMP_NUM_THREADS": "1"}
        job([nsys, "profile", "--trace=nvtx", "--sample=none", "--cpuctxsw=none", "--force-overwrite=true",
             f"--output={tmp}/report", sys.executable, __file__, "--worker", str(out), "--turns", str(args.turns)],
            env=env, timeout_s=TIMEOUT_S, what="nvtx_in_flight_overhead: the worker")
        times = json.loads(out.read_text())
    bare = {kind: statistics.median(v) for kind, v in times["bare"].items()}
    rows = []
    for mode in MODES:
        arms = times[mode]
        diffs = [a - b for a, b in zip(arms["with"], arms["without"])]
        with_us, without_us = statistics.median(arms["with"]), statistics.median(arms["without"])
        rows.append({"mode": mode, "with_us": with_us, "without_us": without_us, "extra_us": statistics.median(diffs),
                     "extra_ci95_us": median_ci(diffs), "ratio": with_us / without_us, "turns": args.turns})
    target = bare["push/pop"] + SLACK_US
    print(f"bare pairs under nsys: push/pop {bare['push/pop']:.3f} µs, start/end {bare['start/end']:.3f} µs")
    print(f"{'mode':>5} {'without (µs/op)':>16} {'with (µs/op)':>13} {'extra (µs/op)':>14} {'95 % CI':>17} "
          f"{'ratio':>7}  target ≤ {target:.3f} µs")
    for row in rows:
        lo, hi = row["extra_ci95_us"]
        verdict = "ok" if row["extra_us"] <= target else "OVER"
        print(f"{row['mode']:>5} {row['without_us']:>16.3f} {row['with_us']:>13.3f} {row['extra_us']:>14.3f} "
              f"{f'{lo:.3f} … {hi:.3f}':>17} {row['ratio']:>7.3f}  {verdict}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "bare_pair_us": bare, "target_us": target,
                                               "argv": ["python", *sys.argv]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
