"""`commprof predict`: the fabric read from numbers or fitted from a bench JSON, the replay held to closed
forms on iterations built by hand, recorded traced runs (ddp, fsdp, a data-parallel pipeline:
tests/recorded/) replayed at N ranks, and bad input refused in one line, all in this process.
tests/test_predict_fabric.py holds the predictions of live runs to runs on 3 and 4 hosts of a shaped link."""

import json
import shutil
from pathlib import Path

import pytest

from commprof.base.errors import UsageError
from commprof.cli import main as cli
from commprof.perfmodel import fabric as fabrics
from commprof.perfmodel import replay, timeline
from commprof.perfmodel.alphabeta import fit
from commprof.perfmodel.timeline import Op, Program

WORLD = (0, 1)


def op(key: int, name: str = "all_reduce", nbytes: int = 1000, members=WORLD, label: str = "world") -> Op:
    return Op(key=(label, members, name, key), name=name, label=label, members=members, nbytes=nbytes,
              measured_ms=0.0)


# ---- the fabric ---------------------------------------------------------------------------------
def test_fabric_numbers_per_level():
    f = fabrics.parse("intra=450GB/s,3us; inter=100Gbit/s,8.5us")
    assert f.intra.alpha_s == pytest.approx(3e-6) and f.intra.beta_s_per_byte == pytest.approx(1 / 450e9)
    assert f.inter.alpha_s == pytest.approx(8.5e-6) and f.inter.beta_s_per_byte == pytest.approx(8 / 100e9)
    only = fabrics.parse("inter=50MB/s,1ms")
    assert only.intra is None and only.inter.alpha_s == pytest.approx(1e-3)
    with pytest.raises(UsageError, match="no intra-host level"):
        only.level("intra", "--fabric")


@pytest.mark.parametrize("spec, words", [
    ("intra=fast,3us", "cannot read rate"), ("intra=450GB/s", "give a rate and a latency"),
    ("wan=1GB/s,1us", "cannot read 'wan=1GB/s,1us'"), ("intra=1GB/s,3 parsecs", "cannot read latency"),
    ("intra=1GB/s,1us;intra=2GB/s,1us", "twice"), (";", "names no level"), ("missing.json", "cannot read it")])
def test_fabric_that_does_not_parse(spec, words):
    with pytest.raises(UsageError, match=words):
        fabrics.parse(spec)


RECORDED = Path(__file__).resolve().parents[1] / "recorded"


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """Recorded runs, each as NAME.json beside its trace folder NAME/ (the JSON naming it), and a bench sweep of
    sendrecv as bench.json: what `commprof run --trace` and `bench --json` wrote (tests/recorded/README.md)."""
    tmp = tmp_path_factory.mktemp("traced")
    for name in ("ddp", "fsdp", "pipeline", "single"):
        doc = json.loads((RECORDED / name / "run.json").read_text())
        if (RECORDED / name / "trace").is_dir():
            shutil.copytree(RECORDED / name / "trace", tmp / name)
            doc["config"]["out"]["trace"] = str(tmp / name)
        (tmp / f"{name}.json").write_text(json.dumps(doc))
    shutil.copy(RECORDED / "sendrecv" / "bench.json", tmp / "bench.json")
    return tmp


def commprof(*argv: str, capsys) -> tuple[int, str, str]:
    """`commprof ARGV` in this process: its exit code, stdout and stderr."""
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_fabric_fitted_from_a_bench_json(traced):
    doc = json.loads((traced / "bench.json").read_text())
    f = fabrics.parse(str(traced / "bench.json"))
    # one host: the sweep is the intra-host level, fitted as bench --algo fits it
    model = fit([(r["nbytes"], r["time_us"] * 1e-6) for r in doc["results"]])
    assert f.inter is None
    assert (f.intra.alpha_s, f.intra.beta_s_per_byte) == (model.alpha_s, model.beta_s_per_byte)


def test_link_rate_is_one_rate_a_rate_per_level_or_a_bench_json(traced):
    # run's and profile's --link-rate: the findings hold each op to the level it crosses
    assert fabrics.link_flag(None) is None
    one = fabrics.link_flag("200Gbit/s")
    assert one.rate_GBps(False) == one.rate_GBps(True) == pytest.approx(25)
    levels = fabrics.link_flag("intra=450GB/s,3us;inter=50GB/s,8us")
    assert (levels.rate_GBps(False), levels.rate_GBps(True)) == (pytest.approx(450), pytest.approx(50))
    assert fabrics.link_flag("inter=50GB/s,8us").rate_GBps(False) is None
    bench, fitted = fabrics.link_flag(str(traced / "bench.json")), fabrics.parse(str(traced / "bench.json")).intra
    # the fit's bandwidth (none where its times did not grow with size: β = 0), and no inter-host level
    assert bench.rate_GBps(False) == fitted.as_record()["bandwidth_GBps"] and bench.rate_GBps(True) is None
    for bad, words in (("fast", "cannot read rate 'fast' of --link-rate"), ("intra=1GB/s", "give a rate and a latency"),
                       ("nope.json", "cannot read it")):
        with pytest.raises(UsageError, match=words):
            fabrics.link_flag(bad)


# ---- the replay, on iterations built by hand --------------------------------------------------------
def test_an_op_starts_when_the_last_member_issues_it():
    a = op(0)
    programs = (Program(0, 0, (("busy", 1.0), ("issue", a), ("busy", 2.0), ("wait", a, 0.5))),
                Program(1, 0, (("busy", 3.0), ("issue", a), ("wait", a, 0.0))))
    step, (busy, comm, exposed) = replay.replay(programs, lambda o: 5.0)
    # done at max(1, 3) + 5 = 8; rank 0 blocks 8 − 3 and resumes 0.5 later
    assert step == pytest.approx(8.5) and busy == pytest.approx(3.5) and exposed == pytest.approx(5.0)
    assert comm == pytest.approx(7.0)  # issued at 1, done at 8


def test_ops_of_one_group_run_one_after_another_and_overlap_compute():
    a, b = op(0), op(1)
    prog = (("issue", a), ("issue", b), ("busy", 4.0), ("wait", a, 0.0), ("wait", b, 0.0))
    step, (busy, comm, exposed) = replay.replay((Program(0, 0, prog), Program(1, 0, prog)), lambda o: 3.0)
    assert step == pytest.approx(6.0) and exposed == pytest.approx(2.0) and comm == pytest.approx(6.0)
    # a different group runs beside it
    c = op(0, members=WORLD, label="other")
    prog = (("issue", a), ("issue", c), ("busy", 1.0), ("wait", a, 0.0), ("wait", c, 0.0))
    assert replay.replay((Program(0, 0, prog), Program(1, 0, prog)), lambda o: 3.0)[0] == pytest.approx(3.0)


def test_a_message_arrives_after_its_send_is_issued():
    link = ("pp0-1", WORLD, 0, 1, 0)
    send = Op(key=link, name="send", label="pp0-1", members=WORLD, nbytes=10, measured_ms=0)
    recv = Op(key=link, name="recv", label="pp0-1", members=WORLD, nbytes=10, measured_ms=0)
    programs = (Program(0, 0, (("busy", 2.0), ("issue", send), ("wait", send, 0.0))),
                Program(1, 0, (("issue", recv), ("wait", recv, 0.0), ("busy", 1.0))))
    step, (_, _, exposed) = replay.replay(programs, lambda o: 0.5)
    assert step == pytest.approx(3.5) and exposed == pytest.approx(2.5)


def test_ops_that_never_match_are_named():
    programs = (Program(0, 0, (("issue", op(0)), ("wait", op(0), 0.0))), Program(1, 0, (("busy", 1.0),)))
    with pytest.raises(UsageError, match="do not match across ranks"):
        replay.replay(programs, lambda o: 1.0)


def test_costs_are_the_algorithms_on_the_slowest_level_the_group_spans():
    f = fabrics.parse("intra=100GB/s,2us;inter=10GB/s,10us")
    algos = replay.algorithms("nccl")
    ring = op(0, nbytes=1 << 20, members=tuple(range(8)))
    one_host = replay._cost_s(ring, tuple(range(8)), f, 8, algos, "--fabric")
    assert one_host == pytest.approx(2 * 7 * (2e-6 + (1 << 20) / 8 / 100e9))
    two_hosts = replay._cost_s(ring, tuple(range(16)), f, 8, algos, "--fabric")
    assert two_hosts == pytest.approx(2 * 15 * (10e-6 + (1 << 20) / 16 / 10e9))
    # gloo's reduce_scatter costs an all_reduce of its size; elsewhere, a ring reduce_scatter
    rs = op(0, "reduce_scatter", 1 << 20, tuple(range(8)))
    assert replay._cost_s(rs, rs.members, f, 8, replay.algorithms("gloo"), "") == pytest.approx(one_host)
    assert replay._cost_s(rs, rs.members, f, 8, algos, "") == pytest.approx(7 * (2e-6 + (1 << 20) / 8 / 100e9))
    # an all_to_all across hosts: each host's link carries all its members' bytes
    a2a = op(0, "all_to_all", 1 << 20, tuple(range(4)))
    assert replay._cost_s(a2a, a2a.members, f, 2, algos, "") == pytest.approx(3 * (10e-6 + 2 * (1 << 20) / 4 / 10e9))


def test_data_parallel_groups_grow_and_model_parallel_ones_keep_their_size():
    dp = op(0, members=(1, 3), label="dp")
    assert replay._members_at(dp, 4, 16) == (1, 3, 5, 7, 9, 11, 13, 15)
    world = op(0, members=(0, 1))
    assert replay._members_at(world, 2, 6) == tuple(range(6))
    link = op(0, "send", members=(2, 3), label="pp0-1")
    assert replay._members_at(link, 4, 16) == (2, 3)


# ---- real traced runs ------------------------------------------------------------------------------
def test_a_traced_iteration_accounts_for_its_whole_wall_time(traced):
    for name in ("ddp", "fsdp", "pipeline"):
        m = timeline.load(str(traced / f"{name}.json"))
        assert (m.strategy in name or name in m.strategy) and m.backend == "gloo"
        for it in m.iterations:
            for prog in it:
                issued = [s[1].key for s in prog.steps if s[0] == "issue"]
                waited = [s[1].key for s in prog.steps if s[0] == "wait"]
                assert issued and sorted(waited) == sorted(issued), (name, prog.rank)  # every op is waited once
                # busy time and the blocked spans partition the iteration: free comm gives back busy time
                busy = sum(s[1] for s in prog.steps if s[0] == "busy") + sum(s[2] for s in prog.steps if s[0] == "wait")
                assert busy <= prog.wall_ms + 1e-6
        free = replay.replay(m.iterations[0], lambda o: 0.0)
        assert free[0] <= max(p.wall_ms for p in m.iterations[0]) + 1e-6


def test_predict_over_real_runs(traced, tmp_path, capsys):
    out, png = tmp_path / "p.json", tmp_path / "p.png"
    runs = [str(traced / f"{n}.json") for n in ("ddp", "fsdp", "pipeline")]
    code, _, err = commprof("predict", *runs, "--fabric", "intra=20GB/s,5us;inter=1GB/s,30us", "--ranks-per-host", "4",
                            "--json", str(out), "--plot", str(png), capsys=capsys)
    assert code == 0, err
    assert png.stat().st_size > 10_000
    doc = json.loads(out.read_text())
    assert [r["strategy"] for r in doc["inputs"]] == ["ddp", "fsdp", "pipeline-1f1b"]
    assert doc["inputs"][0]["algorithms"]["reduce_scatter"] == ["all_reduce", "ring"]  # gloo
    for row in doc["inputs"]:
        preds = row["predictions"]
        assert [p["ranks"] for p in preds] == [2 ** k for k in range(1, 11)]  # pipeline: replicas of 2 ranks
        batch = json.loads(open(row["source"]).read())["steps"]["global_batch"]
        for p in preds:
            assert p["busy_ms"] <= p["step_ms"] and p["exposed_comm_ms"] <= p["comm_ms"] + 1e-9
            assert p["throughput"] == pytest.approx(batch * p["ranks"] / row["world_size"] / p["step_ms"] * 1e3)
            assert p["hosts"] == -(-p["ranks"] // 4)
        # beyond one host the ring's slowest step is the inter-host link's, and it grows with N
        beyond = [p["comm_ms"] for p in preds if p["ranks"] > 4]
        assert beyond[-1] > beyond[0] and preds[-1]["efficiency"] < preds[0]["efficiency"]
    # the trace folder alone: the same replay, without the run's batch to turn steps into samples
    code, _, err = commprof("predict", str(traced / "ddp"), "--fabric", "intra=20GB/s,5us;inter=1GB/s,30us",
                            "--ranks-per-host", "4", "--json", str(out), capsys=capsys)
    assert code == 0, err
    alone = json.loads(out.read_text())["inputs"][0]
    assert alone["strategy"] == "ddp" and alone["backend"] is None
    assert all(p["throughput"] is None for p in alone["predictions"])
    # a free fabric: every op costs ~nothing, so the step is the busy time (efficiency 1)
    code, _, err = commprof("predict", runs[0], "--fabric", "intra=1000000000TB/s,0us", "--ranks", "2,4",
                            "--ranks-per-host", "8", "--json", str(out), capsys=capsys)
    assert code == 0, err
    free = json.loads(out.read_text())["inputs"][0]["predictions"]
    assert all(p["efficiency"] == pytest.approx(1.0, abs=1e-6) for p in free)


@pytest.mark.parametrize("args, words", [
    (("bench.json",), "neither a run JSON nor a commprof trace"),
    (("single.json",), "no op of a data-parallel group"),
    (("ddp.json", "--ranks", "2,x"), "cannot read --ranks"),
    (("ddp.json", "--fabric-extra"), "unrecognized arguments"),
    (("untraced.json",), "not traced"),
    (("nowhere.json",), "cannot read it"),
    (("ddp.json", "--ranks-per-host", "0"), "give 1 or more"),
])
def test_bad_input_is_one_line_exit_2(traced, args, words, capsys):
    untraced = json.loads((traced / "ddp.json").read_text())
    untraced["config"]["out"]["trace"] = None
    (traced / "untraced.json").write_text(json.dumps(untraced))
    argv = [str(traced / a) if a.endswith(".json") else a for a in args]
    code, _, err = commprof("predict", *argv, "--fabric", "intra=1GB/s,1us", capsys=capsys)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    code, _, err = commprof("predict", str(traced / "ddp.json"), "--fabric", "intra=1GB/s", capsys=capsys)
    assert code == 2 and "give a rate and a latency" in err


@pytest.mark.parametrize("columns", [80, 120])
def test_the_prediction_table_fits_the_terminal_whole(traced, columns, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, err = commprof("predict", str(traced / "ddp.json"), "--fabric", "intra=20GB/s,5us;inter=1GB/s,30us",
                              "--ranks-per-host", "4", "--ranks", "2,64,1024", capsys=capsys)
    assert code == 0, err
    table = out[out.index("predicted step per rank count"):]
    assert "…" not in table and max(map(len, table.splitlines())) <= columns, table
    assert "1024" in table and "efficiency" in table


@pytest.mark.parametrize("name", ["slowed/trace", "balanced/trace", "fsdp/trace"])
def test_every_figure_grows_with_the_rank_count(name):
    # comm at 256 ranks above 512, exposed 5.1 ms at 128, 0.0 at 256 and 8.2 at 512: the figures were one
    # iteration's, the iteration of the median step, which changed with N — and the "slowest" rank's, which two
    # ranks ending together swapped from one N to the next
    m = timeline.load(str(RECORDED / name))
    fabric = fabrics.parse("intra=450GB/s,3us;inter=50GB/s,8us")
    rows = [replay.predict(m, n, fabric, 8) for n in (16, 32, 64, 128, 192, 256, 384, 512, 768, 1024)]
    for key in ("step_ms", "comm_ms", "exposed_comm_ms"):
        values = [getattr(r, key) for r in rows]
        assert values == sorted(values), (key, values)
    assert all(r.exposed_comm_ms <= r.comm_ms + 1e-9 for r in rows)


def test_a_reducers_one_wait_blocks_on_every_bucket_it_covers():
    # DDP's C++ reducer waits once, at the end of backward, on all its buckets: the trace holds one "wait"
    # span. Matched to the first bucket alone, the second — the one the thread really waited for — had no
    # wait, and the replay let the step end without it (a "step without" 1.2x the balanced step)
    a, b = op(0, nbytes=1 << 20), op(1, nbytes=1 << 21)
    wait = {"name": "wait all_reduce (world)", "cat": "wait", "ph": "X", "ts": 600.0, "dur": 450.0}
    prog = timeline._program(0, 0.0, 1200.0, [(0.0, 500.0, a), (200.0, 1000.0, b)], [wait])
    assert prog.steps == (("issue", a), ("busy", 0.2), ("issue", b), ("busy", 0.4), ("wait", a, 0.0),
                          ("wait", b, pytest.approx(0.05)), ("busy", pytest.approx(0.15)))
    assert prog.blocks == ((a, 600.0, 600.0), (b, 600.0, 1050.0))
    # the replay holds the thread until the last bucket is done: b starts when a is (0.5) and ends at 1.3,
    # against backward's end at 0.6; then the thread's 0.05 after it and the 0.15 to the iteration's end
    step, (_, _, exposed) = replay.replay((prog, prog), lambda o: {a.key: 0.5, b.key: 0.8}[o.key])
    assert exposed == pytest.approx(1.3 - 0.6) and step == pytest.approx(1.3 + 0.05 + 0.15)
