"""Every script in benchmarks/ runs with --quick: it exits 0, and the JSON it writes (to a temporary path)
parses and holds the keys the benchmark promises; the plots asked for are drawn; and no quick run writes
into benchmarks/results/. A script missing from PROMISES fails, so a new benchmark cannot be left out. A
benchmark that cannot run on this machine (no C compiler, not root) says why in one line and exits 77:
it is skipped with that line.

The scripts run PARALLEL at a time, the longest first, when the first test needs them: besides the CPU their
processes take to start, they wait on rendezvous, shaped links and sleeps, time another script can use."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from spawn import _run, env_for_tests

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
SKIP = 77
"""benchmarks/common.py's SKIP."""
TIMEOUT_S = 300
"""Per script, with the others running beside it; each has deadlines of its own well before."""
PARALLEL = 3
PROMISES: dict[str, list[tuple]] = {
    "algorithms": [("ring_vs_library", 0, "ratio_median"), ("ring_vs_library", 0, "ratio_ci95"),
                   ("model_sweep", 0, "time_over_model")],
    "bubble": [("rows", 0, "measured"), ("rows", 0, "predicted"), ("env", "world_size")],
    "ddp_reducer_cost": [("routed_ratio",), ("routed_ratio_ci95",), ("profiled_ratio",), ("max_abs_diff",)],
    "fabric_link": [("rows", 0, "gloo", "fit_bandwidth_GBps"), ("rows", 0, "mpi", "loopback_8B_us"),
                    ("rows", 0, "ddp", "link_ms")],
    "findings": [("rows", 0, "cost_over_delay"), ("rows", 0, "without_over_balanced"),
                 ("rows", 1, "predicted_saving_ms"), ("rows", 1, "measured_saving_ms"), ("rows", 2, "error_ms"),
                 ("rows", 2, "bound_ms")],
    "flight_overhead": [(0, "extra_us"), (0, "extra_ci95_us")],
    "fr_cost": [("on_over_off", "ratio"), ("on_over_off", "ci95"), ("fast", "on_over_off", "ratio"),
                ("per_op", "extra_us"), ("per_op", "extra_ci95_us"), ("record", "agree_every_job")],
    "gpu_checks": [("steps", "straggler")],
    "gpu_truth": [("timing", 0, "rows", 0, "ratio"), ("timing", 0, "wall_ratio", "ratio"), ("split", 0, "error"),
                  ("run", "plain", "wait_per_step", "ratio")],
    "gloo_layers": [("torch_us",), ("arms", "comm", "minus_torch_us"), ("arms", "comm", "minus_torch_ci95_us")],
    "gloo_paired": [("results", 0, "commprof_paired"), ("results", 0, "per_rank", 0, "commprof_paired_ci95")],
    "interception_cost": [("rows", 0, "ratio"), ("rows", 0, "ci95"), ("rows", 0, "pairs"), ("ops",), ("clock",)],
    "interpose_overhead": [(0, "extra_us"), (0, "turn_interposed_extra_ci_us"), (1, "extra_us")],
    "live_cost": [("rows", 0, "live_ms_per_step"), ("rows", 0, "live", "ratio"), ("rows", 0, "live", "ci95")],
    "nvtx_in_flight_overhead": [("rows", 0, "extra_us"), ("rows", 0, "extra_ci95_us"), ("rows", 1, "ratio"),
                                ("bare_pair_us", "start/end")],
    "oplog_gc": [("measures", "gc", "ratio"), ("measures", "gc", "paired_ratio_ci95")],
    "pipeline_vs_torch": [("summary", "ratio"), ("summary", "ratio_ci95"), ("summary", "parity", "max_abs_diff")],
    "predict_fabric": [("results", 0, "rows", 0, "ratio"), ("results", 0, "rows", 0, "predicted_step_ms")],
    "profile_cost": [("rows", 4, "workload"), ("rows", 4, "ms", "profiled")],
    "rank_start": [("rows", 0, "fork_over_exec", "ratio"), ("rows", 0, "fork_over_exec", "ci95"),
                   ("rows", 0, "exec_ms")],
    "run_overhead": [("summary", "ratio"), ("summary", "ratio_ci95"), ("summary", "recording_cost_us")],
    "run_vs_torch": [("pairs", "ddp", "ratio"), ("pairs", "ddp", "ratio_ci95"), ("pairs", "fsdp", "ratio")],
    "scale": [("paths", "live_combine", "exponent"), ("paths", "findings", "rows", 1, "straggler"),
              ("paths", "states", "rows", 1, "seconds"), ("paths", "scrape", "rows", 1, "series"),
              ("paths", "listen", "rows", 1, "calls_per_s")],
    "seen_backend": [("seen_minus_without_us",), ("seen_minus_without_ci95_us",), ("through_minus_without_us",)],
    "startup": [("summary", "help", "ratio"), ("summary", "help", "paired_ratio_ci95"),
                ("summary", "help", "cpu_paired_ratio")],
    "findings_workloads": [("rows", 0, "without_over_neighbours"), ("rows", 0, "balanced_over_neighbours"),
                           ("rows", 0, "pairs"), ("rows", 0, "above_step")],
    "stress": [("runs",), ("failures",)],
    "trace_overhead": [("summary", "nvtx_over_off", "median"), ("summary", "trace_over_off", "ci95"),
                       ("summary", "ranges_per_iteration")],
    "vs_c": [("results", 0, "compare", "time_us", "commprof_over_floor")],
}
"""Each benchmark's key paths its JSON must hold (an int indexes a list)."""
PLOTS = {"algorithms": "--png", "bubble": "--png"}
"""The benchmarks whose plot is asked for too."""
FIRST = ("scale", "fabric_link", "predict_fabric", "findings", "algorithms", "trace_overhead", "profile_cost")
"""The longest, started first so that the others fill in beside them (scale mostly waits on its store and its
watchdogs: 36 s, 5 of them on a core)."""
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.name != "common.py")


def results_state() -> dict[str, tuple[int, int]]:
    """Each file in benchmarks/results/: (modification time, size)."""
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in RESULTS.iterdir()}


def quick(name: str, tmp: Path) -> tuple[subprocess.CompletedProcess | Exception, float]:
    """`benchmarks/NAME.py --quick`, its JSON (and plot) into tmp: its process, or its timeout; seconds."""
    argv = [sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick", "--json", str(tmp / f"{name}.json")]
    if name in PLOTS:
        argv += [PLOTS[name], str(tmp / f"{name}.png")]
    start = time.monotonic()
    try:
        proc = _run([(argv, env_for_tests())], TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return exc, time.monotonic() - start
    return proc, time.monotonic() - start


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict:
    """Every selected benchmark's quick run: name -> (its process or its timeout, seconds), and the state
    of benchmarks/results/ before and after them."""
    selected = {item.callspec.params["name"] for item in request.session.items
                if item.module.__name__ == __name__ and hasattr(item, "callspec")}
    wanted = (selected or set(SCRIPTS)) & set(PROMISES)  # the results check alone still runs them all
    names = [n for n in FIRST if n in wanted] + sorted(wanted - set(FIRST))
    tmp = tmp_path_factory.mktemp("quick")
    before = results_state()
    with ThreadPoolExecutor(PARALLEL) as pool:
        done = dict(zip(names, pool.map(lambda name: quick(name, tmp), names)))
    return {"tmp": tmp, "done": done, "results": (before, results_state())}


def at(doc, path: tuple):
    """The value at `path` in a parsed JSON document."""
    for key in path:
        doc = doc[key]
    return doc


@pytest.mark.parametrize("name", sorted(set(SCRIPTS) | set(PROMISES)))
def test_quick(name, runs):
    assert name in SCRIPTS, f"PROMISES names benchmarks/{name}.py, which is not there"
    assert name in PROMISES, f"benchmarks/{name}.py is not in PROMISES: say which keys its JSON holds"
    proc, seconds = runs["done"][name]
    assert not isinstance(proc, Exception), f"{name} --quick: no end within {TIMEOUT_S} s"
    if proc.returncode == SKIP:
        pytest.skip((proc.stderr.strip().splitlines() or [f"{name}: exit {SKIP}"])[-1])
    assert proc.returncode == 0, f"{name} --quick: exit {proc.returncode} after {seconds:.0f} s:\n{proc.stderr[-3000:]}"
    doc = json.loads((runs["tmp"] / f"{name}.json").read_text())
    for path in PROMISES[name]:
        try:
            at(doc, path)
        except (KeyError, IndexError, TypeError):
            pytest.fail(f"{name}: its JSON has no {'/'.join(map(str, path))}")
    if name in PLOTS:
        assert (runs["tmp"] / f"{name}.png").stat().st_size > 0


def test_quick_runs_write_nothing_into_results(runs):
    before, after = runs["results"]
    assert before == after, "a --quick run wrote into benchmarks/results/"
