"""A live job across hosts of our own (tools/hosts: 4 network-namespace hosts × 2 ranks, torchrun on each):
each host's first local rank combines its own ranks' windows and serves them on its own endpoint, rank 0
combines the hosts' parts and writes their endpoints for Prometheus' file_sd. A real Prometheus, inside the
first host, scrapes every host through that file; a rank of the last host slowed from a step on is named
within two windows at its delay, under `profile --live` (4 hosts) and `run --live` (2 of them); the profile
job's end-of-job findings, from its trace, name that rank at its delay too. Skips, with the reason, where this
is not root or `ip`, `tc`, `unshare` or `prometheus` is missing."""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from spawn import _run, env_for_tests

ROOT = Path(__file__).resolve().parents[1]
FABRIC = str(ROOT / "tools" / "hosts")
MONITORING = ROOT / "tools" / "monitoring"
SCRIPT = str(ROOT / "tests" / "scripts" / "straggler_train.py")
NAME = f"lh{os.getpid()}"
HOSTS = tuple(f"{NAME}-h{i}" for i in range(4))
PER_HOST = 2
SLOW = 7
"""The slowed rank: the last host's second."""
DELAY_MS, FROM_STEP, STEPS, WINDOW = 30.0, 30, 110, 10
"""The profile jobs' slowed rank from step FROM_STEP of STEPS: the end-of-job straggler is a median over the
iterations whose confidence interval must clear the threshold, and with 80 steps (50 slowed) the 8 ranks on
2 cores beside other load left its lower end on an unslowed iteration once; 110 (80 slowed) leave room."""
PROMETHEUS_PORT = 9090

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "tc", "unshare")),
    reason="tools/hosts needs root, ip, tc and unshare")


def fabric(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([FABRIC, *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, COMMPROF_FABRIC=NAME))
    assert proc.returncode == 0, proc.stderr
    return proc


def inside(host: str, *argv: str, timeout: float = 60) -> str:
    proc = subprocess.run([FABRIC, "exec", host, "--", *argv], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, COMMPROF_FABRIC=NAME))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def query(expr: str, since: float | None = None) -> list:
    """Prometheus' answer to `expr`, asked inside the first host (its API listens there only): at this moment,
    or over every second from `since` (a time.time()) to now, as a dashboard asks."""
    ask = "query?query=" if since is None else f"query_range?start={since:.3f}&end={time.time():.3f}&step=1&query="
    code = ("import json, sys, urllib.parse, urllib.request; print(urllib.request.urlopen("
            f"'http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/{ask}' + urllib.parse.quote(sys.argv[1]), "
            "timeout=10).read().decode())")
    return json.loads(inside(HOSTS[0], sys.executable, "-c", code, expr))["data"]["result"]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    fabric("up", str(len(HOSTS)), "--rate", "10gbit")
    try:
        yield tmp_path_factory.mktemp("hosts")
    finally:
        fabric("down")


def job(tmp: Path, name: str, command: list[str], port: int, *, live: bool, env: dict | None = None,
        on: tuple[str, ...] = HOSTS):
    """`commprof COMMAND` on the hosts `on` under torchrun (c10d rendezvous on the first host); the worst exit."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(on)), "--nproc-per-node",
                str(PER_HOST), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{HOSTS[0]}:{port}", "--rdzv-id", name]
    flags = ["--live", "--live-window", str(WINDOW), "--metrics-port", "0.0.0.0:9464", "--live-linger", "3",
             "--metrics-targets", str(tmp / f"{name}.targets.json"), "--live-log", str(tmp / f"{name}.jsonl")]
    return _run([([FABRIC, "exec", h, "--", *torchrun, "-m", "commprof", command[0], *(flags if live else []),
                   "--json", str(tmp / f"{name}{i}.json"), *command[1:]],
                  env_for_tests(COMMPROF_FABRIC=NAME, **(env or {}))) for i, h in enumerate(on)], 300)


def windows(path: Path) -> list[dict]:
    return [w for w in map(json.loads, path.read_text().splitlines()) if "end" not in w]


def priced(findings: list[dict], delay: float) -> None:
    """Straggler findings of the slowed rank at `delay` a step: their median cost within 15 % of it, beside what
    else the rank's own time exceeded the others' by (its compute on a busy machine)."""
    cost = statistics.median(f["ms_per_step"] for f in findings)
    besides = statistics.median(abs(f["evidence"]["busy_ms"] - delay - f["evidence"]["others_busy_ms"])
                                for f in findings)
    assert abs(cost - delay) <= 0.15 * delay + besides, (cost, delay, besides)


def named(found: list[dict], delay: float, from_step: int, slow: int = SLOW) -> list[dict]:
    """The windows naming the slowed rank: the first within two windows of `from_step`, at its cost (priced)."""
    naming = [w for w in found if any(f["kind"] == "straggler" and f["rank"] == slow for f in w["findings"])]
    assert naming and naming[0]["last_step"] <= from_step + 2 * WINDOW, [w["findings"] for w in found]
    priced([next(f for f in w["findings"] if f["kind"] == "straggler" and f["rank"] == slow) for w in naming
            if w["first_step"] >= from_step], delay)
    return naming


def test_profile_live_across_hosts_scraped_by_prometheus_through_the_targets_file(hosts):
    if not shutil.which("prometheus"):
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    targets = hosts / "profile.targets.json"
    (hosts / "prometheus.yml").write_text(
        "global: {scrape_interval: 500ms, evaluation_interval: 500ms}\n"
        f"rule_files: ['{MONITORING / 'commprof-rules.yml'}']\n"
        "scrape_configs:\n  - job_name: commprof\n    scrape_timeout: 400ms\n"
        f"    file_sd_configs: [{{files: ['{targets}'], refresh_interval: 1s}}]\n")
    server = subprocess.Popen([FABRIC, "exec", HOSTS[0], "--", shutil.which("prometheus"),
                               f"--config.file={hosts / 'prometheus.yml'}", f"--storage.tsdb.path={hosts / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}"],
                              env=dict(os.environ, COMMPROF_FABRIC=NAME), stdout=subprocess.DEVNULL,
                              stderr=open(hosts / "prometheus.log", "w"), start_new_session=True)
    began = time.time()
    try:
        proc = job(hosts, "profile", ["profile", "--trace", str(hosts / "profile-trace"), "--", SCRIPT, "--steps",
                                      str(STEPS), "--delay-ms", str(DELAY_MS), "--slow-rank", str(SLOW),
                                      "--delay-from", str(FROM_STEP)], 29431, live=True)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert "live metrics on 4 hosts' endpoints, one a host" in proc.stderr
        listed = json.loads(targets.read_text())
        assert sorted(t["labels"]["host"] for t in listed) == list(HOSTS)
        found = windows(hosts / "profile.jsonl")
        assert all(w["world_size"] == 8 and len(w["hosts"]) == 4 for w in found)
        assert not [f for w in found if w["last_step"] < FROM_STEP for f in w["findings"]
                    if f["kind"] == "straggler" and not f.get("contended")]
        named(found, DELAY_MS, FROM_STEP)
        # every host's endpoint scraped through the file: each rank's steps, served by its own host
        time.sleep(1.0)
        steps = query("last_over_time(commprof_steps_total[5m])")
        assert sorted(int(s["metric"]["rank"]) for s in steps) == list(range(8)), steps
        assert {s["metric"]["instance"] for s in steps} == {t["targets"][0] for t in listed}
        by_host = {(s["metric"]["host"], s["metric"]["instance"]) for s in steps}
        assert len(by_host) == 4  # each instance serves one host's ranks
        straggler = query('last_over_time(commprof_finding_seconds_per_step{kind="straggler"}[5m])')
        assert any(s["metric"]["subject"] == f"rank {SLOW}" for s in straggler), straggler
        # the finding joins the per-rank series on its numeric rank: the slowed rank's host, from its endpoint
        joined = query('last_over_time(commprof_finding_seconds_per_step{kind="straggler"}[5m]) * on(rank) '
                       'group_left(host) last_over_time(commprof_step_seconds[5m])')
        assert {(s["metric"]["rank"], s["metric"]["host"]) for s in joined} >= {(str(SLOW), HOSTS[-1])}, joined
        info = [s["metric"] for s in query("last_over_time(commprof_build_info[5m])")]
        assert {(i["command"], i["workload"], i["backend"], i["world_size"]) for i in info} == {
            ("profile", Path(SCRIPT).name, "gloo", "8")}, info
        # the shipped dashboard's every query, and the shipped rules' records, hold data for the job's span
        dashboard = json.loads((MONITORING / "commprof-dashboard.json").read_text())
        asked = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
        asked += ["commprof:step_seconds:max", "commprof:exposed_comm_share:ratio", "commprof:op_bytes:rate1m"]
        empty = [expr for expr in asked if not query(expr, since=began)]
        assert len(asked) >= 12 and not empty, empty
    finally:
        os.killpg(server.pid, 9)
        server.wait()
    # the end of the job, from its trace, is not the live windows' combination: it names the slowed rank first, at
    # its cost (the median iteration is a slowed one: 80 of 110)
    items = json.loads((hosts / "profile0.json").read_text())["findings"]["items"]
    end = [f for f in items if f["kind"] == "straggler"]
    assert [f["rank"] for f in end][:1] == [SLOW], end
    priced(end[:1], DELAY_MS)


def test_run_live_across_hosts_names_the_slowed_rank(hosts):
    """run's live mode across two of the hosts (profile's test above takes all four)."""
    on, slow = HOSTS[:2], 2 * PER_HOST - 1
    proc = job(hosts, "run", ["run", "--strategy", "ddp", "--bucket-mb", "100", "--steps", "60", "--warmup", "2",
                              "--batch-size", "8", "--samples", "4096", "--eval-samples", "0"], 29433, live=True,
               env={"COMMPROF_FAULT": f"slow:rank={slow}:op=all_reduce:ms={DELAY_MS:g}"}, on=on)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = windows(hosts / "run.jsonl")
    assert found and all(w["world_size"] == len(on) * PER_HOST and len(w["hosts"]) == len(on) for w in found)
    named(found, DELAY_MS, 0, slow)
    assert sorted(t["labels"]["host"] for t in json.loads((hosts / "run.targets.json").read_text())) == list(on)
