"""How `commprof profile` fails when the script misbehaves, as `commprof run` does: a desync between the
ranks' calls (exit 4, both calls named, flight records written), the rank that failed first named with its
own traceback or exit status — under commprof's launcher, mpiexec and torchrun — what rank 0 measured kept,
and COMMPROF_FAULT. Real gloo ranks, unchanged scripts (tests/scripts/, or written here)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from spawn import _run, commprof, env_for_tests, kill_session

SCRIPTS = Path(__file__).with_name("scripts")
DDP = str(SCRIPTS / "ddp_train.py")
TIMEOUT = "5"
FLIGHT_RECORDS = ["fr_trace_rank_0", "fr_trace_rank_1", "rank0.flight.json", "rank1.flight.json"]
"""What --debug-dump holds after a 2-rank failure: commprof's record of each rank, and torch's form of it."""


def one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commprof: error: "), proc.stderr[-3000:]
    return lines[0][len("commprof: error: "):]


def no_commprof_frames(proc) -> None:
    assert "Traceback" not in proc.stderr and "commprof/" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_different_collectives_on_two_ranks_are_a_desync(tmp_path, backend):
    script = tmp_path / "desync.py"
    script.write_text("import torch, torch.distributed as dist\n"
                      "dist.init_process_group()\n"
                      "for _ in range(3):\n"
                      "    dist.all_reduce(torch.ones(1024))\n"
                      "if dist.get_rank() == 0:\n"
                      "    dist.all_reduce(torch.ones(1024))\n"
                      "else:\n"
                      "    dist.all_gather_into_tensor(torch.empty(2048), torch.ones(1024))\n")
    out = tmp_path / "out.json"
    proc = commprof("profile", "--nproc", "2", "--backend", backend, "--timeout", TIMEOUT, "--json", str(out),
                    str(script))
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert one_line(proc) == ("desync at all_reduce seq 4 (world): rank 0 called all_reduce 4 KiB float32, "
                              "rank 1 called all_gather 8 KiB float32")
    for rank in (0, 1):  # beside the --json file, as `run` writes them
        flight = json.loads((tmp_path / f"rank{rank}.flight.json").read_text())
        assert flight["rank"] == rank and flight["seqs"] == {"world": 4}
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["reason"].startswith("desync at all_reduce seq 4")


@pytest.mark.parametrize("misbehave,called", [("barrier", "rank 1 called barrier 0 B"),
                                              ("all_reduce", "rank 1 called all_reduce 16 B float32")])
def test_an_extra_call_inside_a_ddp_loop_is_a_desync_not_the_survivors_error(tmp_path, misbehave, called):
    # gloo may abort the rank that made the extra call; its peer then sees a reset connection — neither is
    # the cause: the ranks called different things at one seq
    dump = tmp_path / "dump"
    proc = commprof("profile", "--nproc", "2", "--timeout", TIMEOUT, "--debug-dump", str(dump), "--", DDP,
                    "--steps", "6", "--misbehave", misbehave, "--at", "3")
    assert proc.returncode == 4, proc.stderr[-3000:]
    line = one_line(proc)
    assert line.startswith("desync at ") and line.endswith(called), line
    no_commprof_frames(proc)
    assert sorted(p.name for p in dump.iterdir()) == FLIGHT_RECORDS


@pytest.mark.parametrize("who", [0, 1])
def test_an_extra_all_reduce_that_gloo_aborts_on_is_still_the_desync(tmp_path, who):
    # no buffers: the extra all_reduce meets DDP's bucket all_reduce, and gloo aborts a rank on the size
    # mismatch (SIGABRT) before any watchdog fires; its ring file in the job folder still says what it called
    dump = tmp_path / "dump"
    proc = commprof("profile", "--nproc", "2", "--timeout", TIMEOUT, "--debug-dump", str(dump), "--", DDP,
                    "--steps", "6", "--no-buffers", "--misbehave", "all_reduce", "--at", "3", "--rank", str(who))
    assert proc.returncode == 4, proc.stderr[-3000:]
    # gloo's abort, the path under test, says its own words (std::terminate's, from C++) before the job's line
    said = proc.stderr.strip().splitlines()
    assert "doesn't match expected size" in proc.stderr and said[-1].startswith("commprof: error: "), said
    assert sum(s.startswith("commprof:") for s in said) == 1 and "Traceback" not in proc.stderr, said
    line = said[-1][len("commprof: error: "):]
    calls = {r: re.search(rf"rank {r} called all_reduce ([^,]+)", line) for r in (0, 1)}
    assert line.startswith("desync at all_reduce seq ") and all(calls.values()), line
    assert calls[who].group(1) == "16 B float32" and calls[1 - who].group(1) != "16 B float32", line
    assert sorted(p.name for p in dump.iterdir()) == FLIGHT_RECORDS


def test_a_crash_keeps_what_rank_0_measured(tmp_path):
    out = tmp_path / "out.json"
    proc = commprof("profile", "--nproc", "2", "--timeout", TIMEOUT, "--json", str(out), "--", DDP,
                    "--steps", "8", "--misbehave", "raise", "--at", "6")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.count("Traceback (most recent call last)") == 1
    assert proc.stderr.count("RuntimeError: bad batch at step 6") == 1 and "commprof/" not in proc.stderr
    lines = [line.strip() for line in Path(DDP).read_text().splitlines()]
    raised_at = lines.index('raise RuntimeError(f"bad batch at step {step}")') + 1
    assert f'ddp_train.py", line {raised_at}, in <module>' in proc.stderr  # its frames only
    assert "runpy" not in proc.stderr
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["ranks_reported"] == [0]
    assert doc["reason"] == f"rank 1: {DDP} raised RuntimeError: bad batch at step 6"
    # steps 0-5 ended on rank 0 (steps 0-3 the warm-up); step 6 waits on rank 1, which raised there
    assert doc["steps"]["found"] == 6 and [it["step"] for it in doc["iterations"]] == [4, 5]
    assert all(it["rank"] == 0 and it["wall_ms"] > 0 for it in doc["iterations"])
    assert "time per iteration" in proc.stdout and "incomplete: rank 0's 2 measured iteration(s) only" in proc.stdout


def test_a_rank_that_ends_itself_with_os_exit_gives_the_job_its_code():
    # os._exit skips everything commprof would do on the way out: its peer then sees gloo's "peer exited" and
    # said that, exit 3; the launcher sees the rank end with 7 and no word from commprof, and names it
    proc = commprof("profile", "--nproc", "2", "--timeout", TIMEOUT, "--", DDP, "--steps", "6",
                    "--misbehave", "os_exit", "--at", "3")
    assert proc.returncode == 7, proc.stderr[-3000:]
    assert one_line(proc) == ("rank 1 exited with status 7 (outside commprof: os._exit, or a library that ended "
                              "the process)")


def test_rank_0_killed_leaves_what_it_had_measured(tmp_path):
    # the file holds rank 0's report from its first measured iteration on: a rank 0 killed outright (nothing of
    # it runs to save anything) leaves it, and the launcher marks it with the job's verdict
    out = tmp_path / "out.json"
    proc = commprof("profile", "--nproc", "2", "--warmup", "1", "--timeout", TIMEOUT, "--json", str(out), "--", DDP,
                    "--steps", "12", env=env_for_tests(COMMPROF_FAULT="die:rank=0:op=all_reduce:seq=8"))
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert one_line(proc) == "rank 0 was killed by SIGKILL"
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["reason"] == "rank 0 was killed by SIGKILL"
    steps = [it["step"] for it in doc["iterations"]]
    assert steps and steps == list(range(1, 1 + len(steps))) and steps[-1] <= 6, steps
    assert doc["summary"]["wall_ms"] > 0 and doc["volume"]["all_reduce"]["calls_per_step"] == 1


def test_rank_0_killed_mid_way_leaves_most_of_what_it_measured(tmp_path):
    # the document is rewritten every 0.25 s, or at most 2 % of a core, by a thread of its own
    # (commprof/launcher/kept.py): a rank 0 killed 20 steps of at least 100 ms in (rank 1 sleeps before each backward)
    # kept 1 of 39 when the writes were paced on the training thread, by the first one's cost (imports)
    out = tmp_path / "out.json"
    script = str(SCRIPTS / "straggler_train.py")
    proc = commprof("profile", "--nproc", "2", "--warmup", "1", "--timeout", TIMEOUT, "--json", str(out), "--",
                    script, "--steps", "30", "--delay-ms", "100",
                    env=env_for_tests(COMMPROF_FAULT="die:rank=0:op=all_reduce:from_step=20"))
    assert proc.returncode == 3, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["reason"] == "rank 0 was killed by SIGKILL"
    steps = [it["step"] for it in doc["iterations"]]
    reached = 20 - 1  # measured iterations ended before the kill (step 20's first all-reduce)
    assert steps == list(range(1, 1 + len(steps))) and reached / 2 <= len(steps) <= reached, steps


def test_ctrl_c_prints_and_keeps_what_rank_0_measured(tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.Popen([sys.executable, "-m", "commprof", "profile", "--nproc", "2", "--warmup", "1",
                             "--timeout", TIMEOUT, "--json", str(out), "--", DDP, "--steps", "100000"],
                            env=env_for_tests(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not out.exists() and time.monotonic() < deadline:  # the first measured iteration is kept
            time.sleep(0.05)
        assert out.exists()
        os.killpg(proc.pid, signal.SIGINT)  # launcher and ranks alike, as Ctrl-C does
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        kill_session(proc)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["reason"] == "interrupted" and doc["ranks_reported"] == [0]
    measured = len(doc["iterations"])
    assert measured >= 1 and "time per iteration" in stdout
    assert f"incomplete: rank 0's {measured} measured iteration(s) only: interrupted" in stdout


def test_a_ctrl_c_python_dropped_then_a_failing_peer_is_an_interruption(tmp_path):
    """Ctrl-C reaches the ranks at once, but a rank's KeyboardInterrupt may be raised where Python only prints it
    (a __del__, a callback): its next collective then fails for the peer that Ctrl-C ended. That rank keeps what
    it measured as interrupted, not as a peer's failure."""
    out = tmp_path / "out.json"
    proc = commprof("profile", "--nproc", "2", "--timeout", TIMEOUT, "--json", str(out), "--",
                    str(SCRIPTS / "lost_ctrl_c.py"), timeout=120)
    assert "Exception ignored" in proc.stderr and "KeyboardInterrupt" in proc.stderr  # the drop happened
    assert re.search(r"incomplete: rank 0.s \d+ measured iteration\(s\) only: interrupted\n", proc.stdout), \
        proc.stdout[-2000:]
    assert "peer rank exited" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert proc.returncode != 0


def test_under_torchrun_the_traceback_shows_once_and_the_failing_rank_is_the_root_cause(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "commprof",
               "profile", "--timeout", TIMEOUT, "--", DDP, "--steps", "6", "--misbehave", "raise", "--at", "3"]
    proc = _run([(command, env_for_tests())], timeout=180)
    assert proc.returncode == 1, proc.stderr[-3000:]
    # the script's frames once (torchrun's own traceback, of its ChildFailedError, follows them)
    assert proc.stderr.count('ddp_train.py", line') == 1 and "commprof/" not in proc.stderr, proc.stderr[-3000:]
    root = proc.stderr.split("Root Cause (first observed failure):", 1)[1]
    assert "rank      : 1 (local_rank: 1)" in root, proc.stderr[-3000:]
    assert f"traceback : rank 1: {DDP} raised RuntimeError: bad batch at step 3" in root


# a stall (a desync under profile: the scripts above that call different things)
@pytest.mark.parametrize("fault,code,said", [
    ("stall:rank=1:op=all_reduce:seq=3", 3, "rank 0: all_reduce did not complete within 5 s (--timeout): a peer "
                                            "rank stalled or died"),
])
def test_injected_faults_work_under_profile(tmp_path, fault, code, said):
    proc = commprof("profile", "--nproc", "2", "--timeout", TIMEOUT, "--", DDP, "--steps", "6",
                    env=env_for_tests(COMMPROF_FAULT=fault))
    assert proc.returncode == code, proc.stderr[-3000:]
    assert one_line(proc).startswith(said)


def test_ranks_with_different_models_fail_ddps_own_check(tmp_path):
    # DDP's constructor checks every rank's parameter shapes against rank 0's; profile makes that check
    # through Comm (comm/ddp_reducer.py), and a mismatch still fails the rank with torch's error
    proc = commprof("profile", "--nproc", "2", "--timeout", TIMEOUT, "--", DDP, "--mismatch")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.count("Traceback (most recent call last)") == 1
    said = ("RuntimeError: [1]: params[0] in this process with sizes [48, 32] appears not to match sizes of the "
            "same param in process 0.")
    assert said in proc.stderr, proc.stderr[-3000:]


def test_what_a_failed_jobs_script_forked_goes_with_it(tmp_path):
    # a script's own child (a data loader's worker, a server) outlived the failed job by 17 s and more, until
    # it noticed its parent gone; it holds the job's folder in its environment, as every process of the job
    script = tmp_path / "forks.py"
    script.write_text("import os, subprocess, sys, time, torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],\n"
                      "                         start_new_session=True)\n"
                      f"open({str(tmp_path)!r} + f'/child{{dist.get_rank()}}', 'w').write(str(child.pid))\n"
                      "dist.barrier()\n"
                      "if dist.get_rank() == 1:\n"
                      "    raise RuntimeError('bad batch')\n"
                      "dist.barrier()\n")
    proc = commprof("profile", "--nproc", "2", "--timeout", TIMEOUT, "--", str(script))
    assert proc.returncode == 1, proc.stderr[-3000:]
    children = [int((tmp_path / f"child{r}").read_text()) for r in (0, 1)]
    time.sleep(0.5)
    alive = [pid for pid in children if os.path.exists(f"/proc/{pid}") and
             open(f"/proc/{pid}/stat").read().split(") ", 1)[1][0] != "Z"]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive


def test_torchs_fr_trace_names_the_desync_in_the_dump_folder(tmp_path):
    # the records of --debug-dump in torch's flight-recorder format too: torch's own analyser reads both ranks'
    # (the one gloo aborted written by its peer, from its ring file) and finds rank 1's extra all_reduce
    dump = tmp_path / "dump"
    proc = commprof("profile", "--nproc", "2", "--timeout", TIMEOUT, "--debug-dump", str(dump), "--", DDP,
                    "--steps", "6", "--no-buffers", "--misbehave", "all_reduce", "--at", "3", "--rank", "1")
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert sorted(p.name for p in dump.iterdir()) == FLIGHT_RECORDS
    seq = int(re.search(r"desync at all_reduce seq (\d+) \(world\)", proc.stderr).group(1))
    ring = json.loads((dump / "rank0.flight.json").read_text())["ring"]
    bucket = next(nbytes for label, s, name, nbytes, _ in ring if (label, s, name) == ("world", seq, "all_reduce"))
    fr = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dump),
                         "-p", "fr_trace_rank_"], capture_output=True, text=True, timeout=120)
    said = fr.stdout + fr.stderr
    assert fr.returncode == 0, said
    assert f"Collective sequence number: {seq} has errors" in said and "collective: gloo:all_reduce" in said, said
    # fr_trace names the rank it did not start from as the culprit, and the sizes each rank called with
    found = re.search(r"Culprit rank (\d); Error type: SIZE_OR_SYNTAX_MISMATCH, Expected input sizes: "
                      r"'\[\[(\d+)\]\]' does not match found input sizes: '\[\[(\d+)\]\]'", said)
    assert found, said
    culprit, sizes = int(found.group(1)), {0: bucket // 4, 1: 4}
    assert (int(found.group(2)), int(found.group(3))) == (sizes[1 - culprit], sizes[culprit]), said
