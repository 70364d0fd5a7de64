"""Findings read from recorded jobs (tests/recorded/: slowed, balanced, per-param, fused): the analysis of a
trace gives back the findings the job printed; the slept rank is the straggler at its delay and its absence
the balanced step; the split by cause adds up; report prints and compares them again. The same jobs run live
in tests/test_findings.py; here nothing is started."""

import json
import re

import pytest

from commprof.cli import main as cli
from commprof.findings import whatif
from commprof.findings.arrivals import analyze
from commprof.findings.kinds import of_trace
from commprof.perfmodel import timeline

DELAY_MS = 20.0
"""What rank 1 of the slowed job slept before every backward (tests/support/record.py)."""


def near_delay(found: dict, delay: float, value: float | None = None, rel: float = 0.15) -> bool:
    """A straggler's cost (or `value`) is the delay plus what else its own time exceeded its peers' by in the same
    job: within `rel` of the delay beside that control (tests/test_findings.py holds live jobs to the same)."""
    e = found["evidence"]
    besides = (e["busy_ms"] - delay) - e["others_busy_ms"]
    value = found["ms_per_step"] if value is None else value
    return abs(value - delay) <= rel * delay + abs(besides)


def load(folder, name="profile.json") -> dict:
    return json.loads((folder / name).read_text())


@pytest.mark.parametrize("name", ["slowed", "balanced", "per-param"])
def test_the_analysis_of_a_recorded_trace_gives_back_the_findings_the_job_printed(recorded, name):
    folder = recorded(name)
    doc = load(folder)
    # the recorded trace already holds the slices the job drew; drawing them again replaces them
    again = json.loads(json.dumps(of_trace(str(folder / "trace"))))  # as the JSON holds it: keys as strings
    assert again["items"] == doc["findings"]["items"] and again["by_rank"] == doc["findings"]["by_rank"], again
    assert again["trace_slices"] == doc["findings"]["trace_slices"] > 0


def test_the_slept_rank_is_the_straggler_at_the_delay_and_its_absence_the_balanced_step(recorded):
    folder = recorded("slowed")
    doc, shown = load(folder), " ".join((folder / "stdout.txt").read_text().split())
    top = doc["findings"]["items"][0]
    assert (top["kind"], top.get("rank")) == ("straggler", 1), doc["findings"]
    assert near_delay(top, DELAY_MS), top
    assert top["evidence"]["last_at_share"] > 0.9 and top["evidence"]["peers_wait_ms"][0]["rank"] == 0 \
        and top["evidence"]["peers_wait_ms"][0]["ms"] >= top["ms_per_step"]
    step = timeline.load(str(folder / "trace")).measured_wall_ms
    assert near_delay(top, DELAY_MS, step - top["step_ms_without"]), (top, step)
    # --warmup 1: no aligned iteration prices the late ops, so the step without it is a lower bound, said so
    assert top["evidence"]["late_ops_priced_aligned"] == 0 and top["step_without_lower_bound"], top
    assert (f"step without it ≥ {top['step_ms_without']:.1f} ms (a lower bound: 0 % of the ops it made late met "
            "aligned in two warm-up iterations or more; a higher --warmup prices more)") in shown
    # printed last, after the tables whose step it names
    assert shown.index("commprof profile") < shown.index("findings, costliest first") < shown.index("straggler rank 1:")


def test_a_balanced_job_names_no_straggler_or_imbalance(recorded):
    folder = recorded("balanced")
    doc = load(folder)
    assert doc["findings"]["threshold"] == 0.03
    found = {f["kind"]: f for f in doc["findings"]["items"]}
    assert "imbalance" not in found, doc["findings"]
    # the control from the same job: its ranks' own times; a rank whose own time was longer in every step is
    # waited for, and saying so is no false finding, but it costs no more than that excess
    own = [r.busy_ms for r in analyze(timeline.load(str(folder / "trace"))).ranks]
    if max(own) <= min(own) * 1.10:
        assert "straggler" not in found, (doc["findings"], own)
    elif "straggler" in found:
        assert found["straggler"]["ms_per_step"] <= 1.5 * (max(own) - min(own)), (found, own)


def test_each_ranks_blocked_time_is_its_waits_and_transfers(recorded):
    a = analyze(timeline.load(str(recorded("slowed") / "trace")))
    for split in (r for it in a.per_iteration for r in it):
        assert split.blocked_ms == pytest.approx(sum(split.waiting_ms.values()) + split.transfer_ms, abs=1e-6)
        assert split.wall_ms == pytest.approx(split.busy_ms + split.blocked_ms, rel=0.05)
    assert {x.last for x in a.arrivals} <= {0, 1} and all(x.spread_ms >= 0 for x in a.arrivals)


def test_the_trace_shows_each_blocked_stretch_by_cause(recorded):
    # a row per rank under its training thread: the slices add up to the blocked time the findings count,
    # and rank 0's "waiting for rank 1" to the delay its peer slept each step
    from commprof.findings.slices import ROW, TID

    folder = recorded("slowed")
    doc = load(folder)
    events = json.loads((folder / "trace" / "trace.json").read_text())["traceEvents"]
    drawn = [e for e in events if e.get("tid") == TID and e.get("ph") == "X"]
    assert doc["findings"]["trace_slices"] == len(drawn) > 0
    assert {e["pid"] for e in events if e.get("tid") == TID and e.get("name") == "thread_name"
            and e["args"]["name"] == ROW} == {1, 2}
    a = analyze(timeline.load(str(folder / "trace")))
    for r in (0, 1):
        total = sum(e["dur"] for e in drawn if e["pid"] == r + 1) / 1e3
        assert total == pytest.approx(sum(it[r].blocked_ms for it in a.per_iteration), abs=0.01), r
    waited = sum(e["dur"] for e in drawn if e["pid"] == 1 and e["name"] == "waiting for rank 1") / 1e3
    assert near_delay(doc["findings"]["items"][0], DELAY_MS, waited / a.iterations, rel=0.2), waited
    assert all(e["name"].startswith(("waiting for rank ", "transfer ")) for e in drawn)


def test_the_causes_plot_stacks_each_ranks_step_by_cause(recorded, tmp_path):
    from commprof.report.cause_plot import cause_plot

    doc = load(recorded("slowed"))
    block = doc["findings"]
    drawn = cause_plot(block, doc["summary"]["wall_ms"], tmp_path / "causes.png")
    assert (tmp_path / "causes.png").stat().st_size > 0 and drawn["ranks"] == ["rank 0", "rank 1"]
    parts = drawn["segments"]
    assert near_delay(block["items"][0], DELAY_MS, parts["waiting for rank 1"][0], rel=0.2), parts
    assert "waiting for rank 0" not in parts or parts["waiting for rank 0"][1] < DELAY_MS / 4, parts
    for i, r in enumerate(block["by_rank"]):  # each bar reaches the rank's wall, or its causes where they pass it
        causes = sum(v[i] for k, v in parts.items() if k != "other")
        assert sum(v[i] for v in parts.values()) == pytest.approx(max(r["wall_ms"], causes)), (r, parts)
    assert f"step {doc['summary']['wall_ms']:.2f} ms" in drawn["legend"] and "own time" in drawn["legend"]


def test_many_small_all_reduces_are_latency_bound_and_one_fused_is_not(recorded):
    per, fused = recorded("per-param"), load(recorded("fused"))
    found = [f for f in load(per)["findings"]["items"] if f["kind"] == "latency_bound"]
    assert len(found) == 1, load(per)["findings"]
    e = found[0]["evidence"]
    assert 25 <= e["ops_per_step"] <= 32  # 32 parameters, every step's ops matched
    # fusing saves their transfer less one op per run of them by the fit (α + β·n, n at most all the
    # gradients' 4·16·(32·32 + 32) bytes; β = 0 where the times did not grow with the sizes)
    alpha_ms, most, runs = e["alpha_us"] / 1e3, 4 * 16 * (32 * 32 + 32), e["fused_runs_per_step"]
    most_ms = runs * alpha_ms + (most / (e["bandwidth_GBps"] * 1e6) if e["bandwidth_GBps"] else 0)
    assert runs >= 1 and alpha_ms <= e["fused_ms"] <= most_ms * (1 + 1e-9), e
    assert e["fusing_saves_ms"] == pytest.approx(e["ms_per_step_in_them"] - e["fused_ms"], rel=1e-6)
    # the step it predicts against the same script fusing them, measured (the 25 % the finding promises)
    # (each job's step as its tables give it: the slowest rank's median)
    step = timeline.load(str(per / "trace")).measured_wall_ms
    assert step == pytest.approx(load(per)["summary"]["iteration_ms"], rel=1e-3)  # the trace rounds to ns
    assert abs((step - found[0]["step_ms_without"]) / (step - fused["summary"]["iteration_ms"]) - 1) <= 0.25
    assert not [f for f in fused["findings"]["items"] if f["kind"] == "latency_bound"]


def test_report_prints_the_saved_findings_again(recorded, capsys):
    folder = recorded("slowed")
    assert cli.main(["report", str(folder / "profile.json")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "straggler" in x)
    printed = " ".join((folder / "stdout.txt").read_text().split())
    # the same words as the profile printed, however either output wrapped its lines
    assert "rank 1: its peers wait" in line and " ".join(line.split()) in printed


def test_report_of_two_runs_compares_their_findings_against_the_noise(recorded, capsys):
    from commprof.report.findings_compare import compare, step_noise_ms

    slowed, balanced = recorded("slowed") / "profile.json", recorded("balanced") / "profile.json"
    a, b = json.loads(slowed.read_text()), json.loads(balanced.read_text())
    fixed = {r["finding"]: r for r in compare(a, b)["rows"]}["straggler rank 1"]
    assert fixed["a_ms"] == a["findings"]["items"][0]["ms_per_step"], fixed
    assert fixed["verdict"] == "gone" or (fixed["verdict"] == "better" and fixed["change_ms"] < -DELAY_MS / 2), fixed
    back = {r["finding"]: r for r in compare(b, a)["rows"]}["straggler rank 1"]
    assert back["verdict"] in ("new", "worse"), back
    noise = compare(a, b)["noise_ms"]
    assert noise == max(step_noise_ms(d) for d in (a, b)) and 0 < noise < DELAY_MS / 2
    assert cli.main(["report", str(slowed), str(balanced)]) == 0
    shown = capsys.readouterr().out
    assert "findings, A → B in ms per step: A = " in shown
    line = next(x for x in shown.splitlines() if "straggler rank 1" in x)
    assert fixed["verdict"] in line and f"{fixed['a_ms']:.2f}" in line, line
    assert f"±{noise:.2f} ms" in shown


def test_a_straggler_without_aligned_iterations_prices_none_of_its_late_ops(recorded):
    a = analyze(timeline.load(str(recorded("slowed") / "trace")))
    assert a.aligned == () and whatif.priced_aligned(a, 1) == 0


def test_host_work_every_rank_does_is_a_finding_and_one_ranks_alone_is_not():
    from commprof.findings.untraced import host, with_figures

    def summary(*others):
        return {"wall_ms": 100.0, "per_rank": [{"rank": r, "other_ms": o} for r, o in enumerate(others)]}

    (found,) = host(summary(21.0, 20.0), 100.0)
    assert (found["kind"], found["rank"], found["ms_per_step"], found["step_ms_without"]) == ("host", 0, 20.0, 80.0)
    assert found["evidence"]["other_ms_by_rank"] == {0: 21.0, 1: 20.0}
    assert host(summary(30.0, 1.0), 100.0) == []  # one rank's own: its peers wait, a straggler's finding
    assert host(summary(2.0, 2.5), 100.0) == []  # under the threshold
    assert host({"wall_ms": 100.0, "per_rank": [{"rank": 0}]}, 100.0) == []  # a document of an older commprof
    block = with_figures(None, {"summary": summary(21.0, 20.0)})
    assert [f["kind"] for f in block["items"]] == ["host"] and "own figures" in block["scope"]
    traced = {"threshold": 0.03, "items": [{"kind": "straggler", "ms_per_step": 30.0}]}
    assert [f["kind"] for f in with_figures(traced, {"summary": summary(21.0, 20.0)})["items"]] == ["straggler", "host"]


def test_a_bubble_beyond_the_schedules_tells_unequal_stages_from_latency():
    # GPipe, 2 stages, 4 micro-batches (the schedule's bubble 1/5); per-micro-batch work t of each stage
    from commprof.findings.untraced import bubble, excess
    from commprof.report.findings_block import findings_text

    def block(schedule_ms, work_ms):
        return {"schedule": "pipeline-gpipe", "stages": 2, "micro_batches": 4, "predicted_bubble_fraction": 0.2,
                "per_stage": [{"stage": s, "rank": s, "schedule_ms": schedule_ms, "bubble_ms": schedule_ms - w,
                               "bubble_fraction": 1 - w / schedule_ms} for s, w in enumerate(work_ms)]}

    # t = 60 and 120 ms: the step (m − 1)·120 + 180 = 540 against 5 slots of the mean 90 = 450
    (f,) = bubble(block(540.0, [240.0, 480.0]), 540.0)
    assert (f["stage"], f["ms_per_step"], f["step_ms_without"]) == (0, 90.0, 450.0)
    assert (f["evidence"]["unequal_stages_ms"], f["evidence"]["other_ms"]) == (90.0, 0.0)
    assert "100 % of it from unequal stages" in findings_text({"threshold": 0.03, "items": [f]}).plain
    # equal stages whose hand-overs wait 20 ms a step beyond the schedule: latency, none of it unequal stages
    (f,) = bubble(block(320.0, [240.0, 240.0]), 320.0)
    assert (f["ms_per_step"], f["evidence"]["unequal_stages_ms"], f["evidence"]["other_ms"]) == (20.0, 0.0, 20.0)
    assert excess(block(300.0, [240.0, 240.0])) == (0.0, 0.0) and bubble(block(300.0, [240.0, 240.0]), 300.0) == []


def test_findings_of_a_contended_host_say_so(recorded):
    # on a busy machine stragglers were named with no cause: the reader is told the machine was shared
    from commprof.findings.untraced import with_figures
    from commprof.report.findings_block import findings_text

    doc = load(recorded("slowed"))
    busy = {**doc, "env": {**doc["env"], "contention": {"contended": True, "others_cores": 1.4}}}
    block = with_figures(doc["findings"], busy)
    assert block["contended"] == {"others_cores": 1.4}
    text = " ".join(findings_text(block).plain.split())
    assert "measured while other processes used 1.4 core(s) of this host" in text
    lo, hi = block["items"][0]["evidence"]["ms_per_step_ci95"]  # how sure: in the JSON's evidence, not the text
    assert lo <= block["items"][0]["ms_per_step"] <= hi and "95 % interval" not in text
    quiet = {**doc, "env": {**doc["env"], "contention": {"contended": False, "others_cores": 0.1}}}
    assert "contended" not in with_figures(doc["findings"], quiet)


@pytest.mark.parametrize("name", ["slowed", "balanced", "per-param"])  # "fused" was recorded without a trace
def test_no_step_without_a_cause_is_above_the_step(recorded, name):
    # a replay that priced an op higher without its cause printed a "step without it" above the step
    trace = str(recorded(name) / "trace")
    block = of_trace(trace)
    assert block["step_ms"] == timeline.load(trace).measured_wall_ms, block
    for found in block["items"]:
        assert 0 <= found["step_ms_without"] <= block["step_ms"], found


def test_drawing_the_causes_again_replaces_them(recorded):
    # `commprof report` of a traced job, twice: the second drawing doubled the "blocked, by cause" row
    from commprof.findings.slices import TID

    trace = recorded("balanced") / "trace"
    counts = [of_trace(str(trace))["trace_slices"] for _ in range(2)]
    events = json.loads((trace / "trace.json").read_text())["traceEvents"]
    assert counts[0] == counts[1] == sum(e.get("tid") == TID and e.get("ph") == "X" for e in events) > 0


def test_a_long_jobs_what_if_replays_evenly_spaced_iterations_first_and_last_among_them():
    assert whatif.spaced(tuple(range(10)), 25) == tuple(range(10))
    picked = whatif.spaced(tuple(range(1000)), whatif.REPLAYED)
    assert len(picked) == whatif.REPLAYED and picked[0] == 0 and picked[-1] == 999
    gaps = {b - a for a, b in zip(picked, picked[1:])}
    assert max(gaps) - min(gaps) <= 1


MS_FIGURE = re.compile(r"\d+(?:\.\d+)? ms(?:/step)?\b")
"""A figure in milliseconds as the findings write one: "20.7 ms/step", "9.5 ms"."""


@pytest.mark.parametrize("name", ["slowed", "balanced", "per-param"])
def test_each_finding_is_one_paragraph_with_a_hanging_indent_and_one_headline_figure(recorded, name):
    # at 80 columns the findings wrapped to column 0, and a finding carried three to five ms figures
    import io

    from rich.console import Console

    from commprof.report.findings_block import findings_text

    indent, hang = 2, 16  # a finding's kind in 14 columns after 2; its text, and every line after its first, at 16
    block = load(recorded(name))["findings"]
    found = findings_text(block)
    buf = io.StringIO()
    Console(file=buf, width=80, color_system=None, force_terminal=False).print(found, highlight=False)
    lines = buf.getvalue().rstrip("\n").splitlines()
    assert lines[0].startswith("findings, costliest first") and all(len(x) <= 80 for x in lines), lines
    assert all(x.startswith(" " * indent) for x in lines[1:]), lines  # nothing but the title at column 0
    paragraphs: list[list[str]] = []
    for x in lines[1:]:
        if x[indent] != " ":  # a finding's kind, or a note's "(", opens a paragraph
            paragraphs.append([x])
        else:  # the rest continue it, under its text (a note's under the "(")
            under = hang if paragraphs[-1][0][indent] != "(" else indent + 1
            assert x.startswith(" " * under) and x[under] != " ", (x, paragraphs[-1])
            paragraphs[-1].append(x)
    kinds = [f["kind"] for f in block["items"]]
    assert [p[0].split()[0] for p in paragraphs[:len(kinds)]] == kinds, paragraphs
    assert len(paragraphs) == len(kinds) + 1 and paragraphs[-1][0].lstrip().startswith("(the step:")
    plain = found.plain.splitlines()[1:]
    for f, paragraph, line in zip(block["items"], paragraphs, plain):
        text = " ".join(" ".join(paragraph).split())
        assert text == " ".join(line.split())  # wrapping left out no word
        headline, _, evidence = text.partition("; evidence: ")
        assert MS_FIGURE.findall(headline) == [f"{f['ms_per_step']:.1f} ms/step"], headline
        assert f"({f['share_of_step'] * 100:.0f} % of the step)" in headline, headline
        assert len(MS_FIGURE.findall(evidence)) <= 1 and f"{f['step_ms_without']:.1f} ms" in evidence, evidence
