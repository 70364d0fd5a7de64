"""The launcher's ranks in sessions of their own (commprof/launcher/launch.py): not in the launcher's process group, yet
interrupted with it, ended with it on SIGHUP, and killed with it when it is killed outright. Ranks here are
small Python processes (no torch), started and supervised by launch.py's own functions: each as an interpreter of
its own, and forked from a template process (commprof/launcher/rank_template.py), as gloo's ranks are."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

STARTS = ("exec", "fork")
"""How the launcher starts its ranks: interpreters of their own, or forked from a template."""
RANK = """\
import os, signal, sys, time
out = sys.argv[1] + os.environ["RANK"]
def said(what):
    with open(out, "w") as f:
        f.write(what)
    sys.exit(0)
signal.signal(signal.SIGINT, lambda *_: said("SIGINT"))
signal.signal(signal.SIGTERM, lambda *_: said("SIGTERM"))
with open(out + ".starting", "w") as f:
    f.write(f"{os.getsid(0)} {os.getppid()}")
os.replace(out + ".starting", out + ".started")  # whole when it appears: the test reads it once it exists
time.sleep(60)
"""

LAUNCHER = """\
import json, os, signal, sys
from pathlib import Path
from commprof.base import job
from commprof.launcher import launch, rank_template
launch.take_signals()
tmp = Path(sys.argv[1])
folder = job.make()
command = [sys.executable, str(tmp / "rank.py"), str(tmp / "rank")]
if sys.argv[2] == "fork":  # from a template process (commprof/launcher/rank_template.py), importing nothing here
    children, template = rank_template.start(command, dict(os.environ), 2, ())
else:
    children, template = launch._start("", command, dict(os.environ), 2), None
print(json.dumps({"pids": [p.pid for p in children], "sid": os.getsid(0),
                  "template": template and template.pid}), flush=True)
code = launch._supervise(children, folder, ranks=[0, 1], timeout_s=30)
if template is not None:
    launch._end_template(template)
print(json.dumps({"code": code}), flush=True)
"""


def _launcher(tmp_path: Path, start: str, nohup: bool = False) -> tuple[subprocess.Popen, dict]:
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    # SIGHUP ignored is what nohup does; otherwise its default, whatever this suite inherited (a suite run
    # under nohup passes SIGHUP ignored to every process it starts, and the launcher rightly keeps it so)
    hup = signal.SIG_IGN if nohup else signal.SIG_DFL
    proc = subprocess.Popen([sys.executable, str(tmp_path / "launcher.py"), str(tmp_path), start],
                            stdout=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, hup))
    started = json.loads(proc.stdout.readline())
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"rank{r}.started").exists() for r in range(2)):
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.02)
    return proc, started


def _ours(started: dict) -> list[int]:
    """The ranks' pids, and their template's."""
    return [*started["pids"], *([started["template"]] if started["template"] else [])]


def _kill(started: dict) -> None:
    for pid in _ours(started):
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("start", STARTS)
def test_each_rank_has_a_session_of_its_own_and_dies_with_a_killed_launcher(tmp_path, start):
    proc, started = _launcher(tmp_path, start)
    try:
        sids, parents = zip(*((tmp_path / f"rank{r}.started").read_text().split() for r in range(2)))
        assert list(map(int, sids)) == started["pids"], "each rank leads a session of its own"
        assert started["sid"] not in sids
        assert set(map(int, parents)) == {started["template"] or proc.pid}
        proc.kill()  # SIGKILL: the launcher cannot stop them itself
        proc.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in _ours(started)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any(_alive(pid) for pid in _ours(started)), "a rank (or their template) outlived its launcher"
    finally:
        _kill(started)


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("sent, heard, code", [(signal.SIGINT, "SIGINT", 130), (signal.SIGHUP, "SIGTERM", 129),
                                               (signal.SIGTERM, "SIGTERM", 143)])
def test_a_signal_to_the_launchers_group_alone_reaches_every_rank(tmp_path, sent, heard, code, start):
    # as Ctrl-C or a closed terminal does: the launcher's process group, where the ranks no longer are
    proc, started = _launcher(tmp_path, start)
    try:
        os.killpg(proc.pid, sent)
        out, _ = proc.communicate(timeout=30)
        assert json.loads(out.splitlines()[-1]) == {"code": code}
        assert [(tmp_path / f"rank{r}").read_text() for r in range(2)] == [heard, heard]
        assert not any(_alive(pid) for pid in _ours(started))
    finally:
        _kill(started)


@pytest.mark.parametrize("start", STARTS)
def test_under_nohup_a_closed_terminal_leaves_the_job_running(tmp_path, start):
    proc, started = _launcher(tmp_path, start, nohup=True)
    try:
        os.killpg(proc.pid, signal.SIGHUP)
        time.sleep(0.5)
        assert proc.poll() is None and all(_alive(pid) for pid in started["pids"])
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert json.loads(out.splitlines()[-1]) == {"code": 143}
    finally:
        _kill(started)
