"""The monitoring kit in tools/monitoring, held by Prometheus' own tools: `promtool check rules` on the recording
and alerting rules, `promtool test rules` on their unit tests (a straggler that holds for 5 minutes, exposed
communication above 30 % of the step, a rank whose steps stop while its peers' go on), and the Grafana
dashboard's queries well formed. tests/test_live_hosts.py runs the rules and every dashboard query against a
real Prometheus scraping a live job. Skips, with the reason, where promtool is missing (Debian's `prometheus`
package ships it; .ci/run installs it)."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

MONITORING = Path(__file__).resolve().parents[1] / "tools" / "monitoring"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus)")


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=MONITORING)


@needs_promtool
def test_the_rules_check_and_their_unit_tests_pass():
    checked = promtool("check", "rules", "commprof-rules.yml")
    assert checked.returncode == 0 and "SUCCESS: 6 rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "commprof-rules.test.yml")
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


@needs_promtool
def test_promtool_refuses_a_rule_test_that_expects_the_wrong_thing(tmp_path):
    # the unit tests can fail: the straggler alert expected one evaluation early is refused
    text = (MONITORING / "commprof-rules.test.yml").read_text()
    early = text.replace("      - eval_time: 6m\n        alertname: CommprofStraggler",
                         "      - eval_time: 4m30s\n        alertname: CommprofStraggler", 1)
    assert early != text
    shutil.copy(MONITORING / "commprof-rules.yml", tmp_path)
    (tmp_path / "t.yml").write_text(early)
    proc = subprocess.run([PROMTOOL, "test", "rules", "t.yml"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert proc.returncode != 0 and "CommprofStraggler" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_the_dashboard_asks_only_for_commprof_series():
    doc = json.loads((MONITORING / "commprof-dashboard.json").read_text())
    targets = [t for p in doc["panels"] for t in p["targets"]]
    assert doc["uid"] == "commprof-live" and len(doc["panels"]) >= 7
    assert all(p["datasource"]["type"] == "prometheus" and p["gridPos"]["w"] > 0 for p in doc["panels"])
    # every query names a series the live endpoint serves (commprof/live/export.py's docstring lists them)
    served = (Path(__file__).resolve().parents[1] / "commprof" / "live" / "export.py").read_text()
    for t in targets:
        names = re.findall(r"\bcommprof_[a-z_]+", t["expr"])
        assert names, t
        for name in names:
            base = name.removesuffix("_bucket")
            assert base in served or base.removesuffix("_total") in served, name
