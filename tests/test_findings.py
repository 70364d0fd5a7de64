"""Findings held to a cause injected into a real job: a DDP script whose rank 1 sleeps DELAY_MS before every
backward (2 gloo ranks, `commprof profile --trace`) is named a straggler costing that delay a step, and the
step without it saves that delay; the same job without the delay names no straggler or imbalance;
`commprof report FILE` prints the block again; the split by cause adds up."""

import json
from pathlib import Path

import pytest
from spawn import commprof

from commprof.findings.arrivals import analyze
from commprof.predict import timeline

SCRIPT = str(Path(__file__).with_name("scripts") / "straggler_train.py")
DELAY_MS = 20.0


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """name -> (its JSON, its process, its trace folder) for the slowed job and the balanced one."""
    tmp = tmp_path_factory.mktemp("findings")
    out = {}
    for name, delay in (("slowed", DELAY_MS), ("balanced", 0.0)):
        proc = commprof("profile", "--nproc", "2", "--trace", str(tmp / name), "--json", str(tmp / f"{name}.json"),
                        "--", SCRIPT, "--delay-ms", str(delay), "--steps", "12")
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = (json.loads((tmp / f"{name}.json").read_text()), proc, tmp / name)
    return out


def test_the_slept_rank_is_the_straggler_at_the_delay_and_its_absence_the_balanced_step(jobs):
    doc, proc, _ = jobs["slowed"]
    top = doc["findings"]["items"][0]
    assert (top["kind"], top["rank"]) == ("straggler", 1), doc["findings"]
    assert top["ms_per_step"] == pytest.approx(DELAY_MS, rel=0.15), top
    assert top["evidence"]["last_at_share"] > 0.9 and top["evidence"]["peers_wait_ms"]["0"] >= top["ms_per_step"]
    # the replay without it saves the delay; against the balanced job's own step (another job, so as noisy as
    # the machine), benchmarks/findings.py holds it to 15 % at D = 5, 20, 50 ms
    step = timeline.load(str(jobs["slowed"][2])).measured_wall_ms
    assert step - top["step_ms_without"] == pytest.approx(DELAY_MS, rel=0.15), (top, step)
    # printed first, before the tables
    assert proc.stdout.index("straggler") < proc.stdout.index("commprof profile"), proc.stdout[:2000]


def test_a_balanced_job_names_no_straggler_or_imbalance(jobs):
    doc, proc, _ = jobs["balanced"]
    kinds = [f["kind"] for f in doc["findings"]["items"]]
    assert "straggler" not in kinds and "imbalance" not in kinds, doc["findings"]
    assert doc["findings"]["threshold"] == 0.03


def test_report_prints_the_saved_findings_again(jobs, tmp_path):
    doc, proc, _ = jobs["slowed"]
    json_path = Path(jobs["slowed"][2]).with_suffix(".json")
    again = commprof("report", str(json_path), timeout=60)
    assert again.returncode == 0, again.stderr
    line = next(x for x in again.stdout.splitlines() if "straggler" in x)
    assert "rank 1 arrives last" in line and line.strip() in proc.stdout


def test_each_ranks_blocked_time_is_its_waits_and_transfers(jobs):
    a = analyze(timeline.load(str(jobs["slowed"][2])))
    for split in (r for it in a.per_iteration for r in it):
        assert split.blocked_ms == pytest.approx(sum(split.waiting_ms.values()) + split.transfer_ms, abs=1e-6)
        assert split.wall_ms == pytest.approx(split.busy_ms + split.blocked_ms, rel=0.05)
    assert {x.last for x in a.arrivals} <= {0, 1} and all(x.spread_ms >= 0 for x in a.arrivals)
