"""The launcher's ranks in sessions of their own (commprof/launch.py): not in the launcher's process group, yet
interrupted with it, ended with it on SIGHUP, and killed with it when it is killed outright. Ranks here are
small Python processes (no torch), started and supervised by launch.py's own functions."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

RANK = """\
import os, signal, sys, time
out = sys.argv[1] + os.environ["RANK"]
def said(what):
    with open(out, "w") as f:
        f.write(what)
    sys.exit(0)
signal.signal(signal.SIGINT, lambda *_: said("SIGINT"))
signal.signal(signal.SIGTERM, lambda *_: said("SIGTERM"))
with open(out + ".started", "w") as f:
    f.write(str(os.getsid(0)))
time.sleep(60)
"""

LAUNCHER = """\
import json, os, signal, sys
from pathlib import Path
from commprof import job, launch
launch.take_signals()
tmp = Path(sys.argv[1])
folder = job.make()
children = launch._start("", [sys.executable, str(tmp / "rank.py"), str(tmp / "rank")], dict(os.environ), 2)
print(json.dumps({"pids": [p.pid for p in children], "sid": os.getsid(0)}), flush=True)
code = launch._supervise(children, folder, ranks=[0, 1], timeout_s=30)
print(json.dumps({"code": code}), flush=True)
"""


def _launcher(tmp_path: Path, nohup: bool = False) -> tuple[subprocess.Popen, dict]:
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    # SIGHUP ignored is what nohup does; otherwise its default, whatever this suite inherited (a suite run
    # under nohup passes SIGHUP ignored to every process it starts, and the launcher rightly keeps it so)
    hup = signal.SIG_IGN if nohup else signal.SIG_DFL
    proc = subprocess.Popen([sys.executable, str(tmp_path / "launcher.py"), str(tmp_path)], stdout=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGHUP, hup))
    started = json.loads(proc.stdout.readline())
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"rank{r}.started").exists() for r in range(2)):
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.02)
    return proc, started


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_each_rank_has_a_session_of_its_own_and_dies_with_a_killed_launcher(tmp_path):
    proc, started = _launcher(tmp_path)
    try:
        sids = [int((tmp_path / f"rank{r}.started").read_text()) for r in range(2)]
        assert sids == started["pids"], "each rank leads a session of its own"
        assert started["sid"] not in sids
        proc.kill()  # SIGKILL: the launcher cannot stop them itself
        proc.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in started["pids"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any(_alive(pid) for pid in started["pids"]), "a rank outlived its launcher"
    finally:
        for pid in started["pids"]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("sent, heard, code", [(signal.SIGINT, "SIGINT", 130), (signal.SIGHUP, "SIGTERM", 129),
                                               (signal.SIGTERM, "SIGTERM", 143)])
def test_a_signal_to_the_launchers_group_alone_reaches_every_rank(tmp_path, sent, heard, code):
    # as Ctrl-C or a closed terminal does: the launcher's process group, where the ranks no longer are
    proc, started = _launcher(tmp_path)
    try:
        os.killpg(proc.pid, sent)
        out, _ = proc.communicate(timeout=30)
        assert json.loads(out.splitlines()[-1]) == {"code": code}
        assert [(tmp_path / f"rank{r}").read_text() for r in range(2)] == [heard, heard]
    finally:
        for pid in started["pids"]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_under_nohup_a_closed_terminal_leaves_the_job_running(tmp_path):
    proc, started = _launcher(tmp_path, nohup=True)
    try:
        os.killpg(proc.pid, signal.SIGHUP)
        time.sleep(0.5)
        assert proc.poll() is None and all(_alive(pid) for pid in started["pids"])
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert json.loads(out.splitlines()[-1]) == {"code": 143}
    finally:
        for pid in started["pids"]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
