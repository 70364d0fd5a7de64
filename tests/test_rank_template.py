"""gloo's ranks forked from a template process that imported torch once (COMMPROF_RANK_START=fork,
commprof/launcher/rank_template.py; the suite's own jobs start so, users' by default do not) are what ranks started as
interpreters of their own are to the script they run: the same rank, environment, session,
`__name__`, argv and sys.path, a working process group, generators seeded apart; only their parent differs.
A job interrupted (SIGINT, SIGTERM) while its template still imports ends at once, the template with it.
The launcher's signals and sessions with forked ranks: tests/test_sessions.py; their failures, every gloo test
of tests/test_failures.py and tests/test_stopped.py."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from spawn import commprof, env_for_tests, kill_session, processes, rank_templates

from commprof.base.errors import CommprofError
from commprof.launcher import rank_template

SCRIPT = """\
import json, os, random, sys
import numpy as np, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
    parent = f.read().replace(b"\\0", b" ").decode()
record = {"rank": os.environ["RANK"], "local_rank": os.environ["LOCAL_RANK"],
          "leads_session": os.getsid(0) == os.getpid(), "parent": parent, "name": __name__, "argv": sys.argv,
          "path0": sys.path[0], "sum": t.tolist(),
          "torch_seed": torch.initial_seed(), "numpy": float(np.random.rand()), "random": random.random(),
          "dynamo": "torch._dynamo" in sys.modules}
with open(os.path.join(sys.argv[1], f"{os.environ['COMMPROF_RANK_START']}{dist.get_rank()}.json"), "w") as f:
    json.dump(record, f)
dist.destroy_process_group()
"""
SAME = ("rank", "local_rank", "leads_session", "name", "argv", "path0", "sum")
"""What a script sees the same whichever way its rank started."""


def test_a_forked_rank_is_to_its_script_what_a_started_one_is(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    seen = {}
    for start in ("fork", "exec"):
        proc = commprof("profile", "--nproc", "2", str(script), str(tmp_path),
                        env=env_for_tests(COMMPROF_RANK_START=start))
        assert proc.returncode == 0, proc.stderr[-3000:]
        seen[start] = [json.loads((tmp_path / f"{start}{r}.json").read_text()) for r in (0, 1)]
    for r in (0, 1):
        assert {k: seen["fork"][r][k] for k in SAME} == {k: seen["exec"][r][k] for k in SAME}
        assert seen["fork"][r]["rank"] == seen["fork"][r]["local_rank"] == str(r)
        assert seen["fork"][r]["leads_session"] and seen["fork"][r]["name"] == "__main__"
        assert seen["fork"][r]["argv"] == [str(script), str(tmp_path)] and seen["fork"][r]["path0"] == str(tmp_path)
        assert seen["fork"][r]["sum"] == [3.0] * 4
        assert seen["fork"][r]["dynamo"]  # imported once, in the template, for profile
    for start in ("fork", "exec"):  # generators seeded apart on each rank, as in new interpreters
        for drawn in ("torch_seed", "numpy", "random"):
            assert seen[start][0][drawn] != seen[start][1][drawn], (start, drawn)
    assert all("-m commprof.launcher.rank_template " in rec["parent"] for rec in seen["fork"])
    assert all(" -m commprof profile --nproc 2 " in rec["parent"] for rec in seen["exec"])


def test_what_only_a_template_could_not_start_is_one_error():
    # a module it cannot import: one error, said by the launcher, rather than a traceback a rank
    with pytest.raises(CommprofError) as caught:
        rank_template.start([sys.executable, "-c", "pass"], dict(os.environ), 2, ("commprof_no_such_module",))
    assert str(caught.value) == ("cannot start the ranks: importing commprof_no_such_module failed: "
                                 "ModuleNotFoundError(\"No module named 'commprof_no_such_module'\")")


@pytest.mark.parametrize("command,backend,wrapper,forked", [
    (["-m", "commprof", "bench"], "gloo", "", True),
    (["-m", "commprof", "bench"], "nccl", "", False),
    (["-m", "commprof", "bench"], "gloo", "nsys profile", False),
    (["other.py"], "gloo", "", False),
])
def test_which_ranks_are_forked(command, backend, wrapper, forked, monkeypatch):
    monkeypatch.setenv(rank_template.START_ENV, "fork")
    assert rank_template.forks([sys.executable, *command], backend, wrapper) is forked
    for start in ("exec", None):  # asked for, or by default: every rank an interpreter of its own
        if start is None:
            monkeypatch.delenv(rank_template.START_ENV)
        else:
            monkeypatch.setenv(rank_template.START_ENV, start)
        assert not rank_template.forks([sys.executable, *command], backend, wrapper)


LAUNCHER = """\
import sys
from commprof.launcher import launch, rank_template
rank_template.PRELOADED["bench"] = ("slow_import",)  # what the template imports: 60 s of sleep
print(launch.launch(["bench", "all_reduce", "-b", "8", "-e", "8"], nproc=2, backend="gloo", oversubscribed=False,
                    timeout_s=30), flush=True)
"""


@pytest.mark.parametrize("sent,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_job_interrupted_while_its_template_imports_ends_at_once_and_whole(tmp_path, sent, code):
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(60)\n")
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    tag = uuid.uuid4().hex
    env = env_for_tests(COMMPROF_TEST_TAG=tag, PYTHONPATH=str(tmp_path))
    proc = subprocess.Popen([sys.executable, str(tmp_path / "launcher.py")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not rank_templates("COMMPROF_TEST_TAG", tag) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rank_templates("COMMPROF_TEST_TAG", tag), "no template started"
        started = time.monotonic()
        proc.send_signal(sent)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        kill_session(proc)
    assert proc.returncode == 0 and out.strip() == str(code), err[-3000:]
    assert took < 10, took  # not the template's 60 s
    time.sleep(0.5)
    assert not processes("COMMPROF_TEST_TAG", tag)  # the template, and no rank of it


def test_a_killed_template_ends_the_job_named_and_a_stopped_one_does_not_hold_it(tmp_path):
    # killed, its ranks go with it (PR_SET_PDEATHSIG); stopped, it reaps none of them, and the launcher reads
    # their ends in /proc: the job is its ranks'
    for sent in (signal.SIGKILL, signal.SIGSTOP):
        tag = uuid.uuid4().hex
        out = tmp_path / f"{sent.name}.json"
        proc = subprocess.Popen([sys.executable, "-m", "commprof", "bench", "all_reduce", "-b", "8", "-e", "1M",
                                 "-n", "50", "--nproc", "2", "--timeout", "3", "--json", str(out)],
                                env=env_for_tests(COMMPROF_TEST_TAG=tag), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while not out.exists() and time.monotonic() < deadline:  # the ranks measure
                time.sleep(0.05)
            (template,) = rank_templates("COMMPROF_TEST_TAG", tag)
            os.kill(template, sent)
            _, err = proc.communicate(timeout=60)
        finally:
            kill_session(proc)
        doc = json.loads(out.read_text())
        if sent == signal.SIGKILL:
            assert proc.returncode == 3, err[-3000:]
            line = "the ranks' template process was killed by SIGKILL"
            assert err.strip().splitlines() == [f"commprof: error: {line}"], err[-3000:]
            assert doc["complete"] is False and doc["reason"] == line and doc["results"]
        else:
            assert proc.returncode == 0, err[-3000:]
            assert doc["complete"] is True and [r["nbytes"] for r in doc["results"]] == [2 ** i for i in range(3, 21)]
        time.sleep(0.5)
        assert not processes("COMMPROF_TEST_TAG", tag)


def test_what_the_template_imports_is_what_the_ranks_would():
    assert rank_template.preload(["run", "--strategy", "ddp"]) == ("torch", "torch._dynamo")
    assert rank_template.preload(["profile", "--nproc", "2", "train.py"]) == ("torch", "torch._dynamo")
    assert rank_template.preload(["bench", "all_reduce"]) == rank_template.preload([]) == ("torch",)
