"""Jobs that fail well: a stalled, stopped, killed or desynchronised rank, under commprof's launcher and
under a bare mpiexec, ends the job within --timeout with one line, the exit code of its kind (3 a peer,
4 a desync, 130 interrupted), every result measured before kept and marked incomplete, the flight records
dumped, the trace merged and no process left behind. Faults are injected with COMMPROF_FAULT
(commprof/comm/failure/faults.py); a real SIGSTOP and a real SIGINT are sent where the test can."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from invariants import check_iteration
from spawn import commprof, env_for_tests, kill_session, processes, python_c, rank_templates, spawn

SMALL = ["-b", "8", "-e", "64", "-f", "8", "-n", "3", "-w", "1", "--timeout", "3"]
UNHURRIED = [*SMALL[:-1], "30"]
"""For jobs whose ending does not wait out --timeout (a killed rank, none failing): a rank waits on its peers at
the rendezvous too, and a loaded machine can hold a forked peer back more than 3 s there."""


def signal_once_measuring(proc: subprocess.Popen, out: Path, sig: int) -> str:
    """Send the launcher `sig` once the job measures (its --json `out` is written from the first result on);
    its stderr once it ended."""
    try:
        deadline = time.monotonic() + 90
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.exists()
        proc.send_signal(sig)
        return proc.communicate(timeout=30)[1]
    finally:
        kill_session(proc)


def one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commprof: error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return lines[0][len("commprof: error: "):]


def fault_env(spec: str, **extra) -> dict:
    return env_for_tests(COMMPROF_FAULT=spec, **extra)


# ---- whole jobs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_stalled_rank_is_named_results_kept_and_flight_records_dumped(tmp_path, backend):
    out = tmp_path / "r.json"
    proc = commprof("bench", "all_reduce", "broadcast", "--backend", backend, "--nproc", "2", *SMALL,
                    "--json", str(out), env=fault_env("stall:rank=1:op=broadcast"), timeout=120)
    assert proc.returncode == 3, proc.stderr[-3000:]
    line = one_line(proc)
    # rank 0 waits in its broadcast, or past it (an eager send returns) in the next barrier
    assert re.fullmatch(r"rank 0: (broadcast|control_barrier) did not complete within 3 s \(--timeout\): "
                        r"a peer rank stalled or died; rank 1 was in no op", line), line
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["reason"] == line
    modes = 2 if backend == "mpi" else 1  # torch.distributed has no out-of-place all_reduce
    assert {r["collective"] for r in doc["results"]} == {"all_reduce"} and len(doc["results"]) == 2 * modes
    records = {r: json.loads((tmp_path / f"rank{r}.flight.json").read_text()) for r in (0, 1)}
    assert records[0]["busy"].endswith("(world)") and records[1]["busy"] is None
    assert records[1]["ring"][-1][2] == "all_reduce"  # it stalled before its first broadcast


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_desync_is_named_at_its_first_divergence(tmp_path, backend):
    dump = tmp_path / "dump"
    proc = commprof("bench", "all_reduce", "--backend", backend, "--nproc", "2", *SMALL, "--debug-dump", str(dump),
                    env=fault_env("desync:rank=1:seq=3"), timeout=120)
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert one_line(proc) == ("desync at all_reduce seq 3 (world): rank 0 called all_reduce 8 B float32, "
                              "rank 1 called broadcast 8 B float32")
    for r in (0, 1):
        record = json.loads((dump / f"rank{r}.flight.json").read_text())
        assert record["rank"] == r and record["seqs"]["world"] == 3


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_killed_rank_is_named_and_what_was_measured_is_kept(tmp_path, backend):
    out = tmp_path / "r.json"
    proc = commprof("bench", "all_reduce", "broadcast", "--backend", backend, "--nproc", "2", *UNHURRIED,
                    "--json", str(out), env=fault_env("die:rank=1:op=broadcast:seq=4"), timeout=120)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert one_line(proc) == "rank 1 was killed by SIGKILL"
    assert "BAD TERMINATION" not in proc.stdout and "=====" not in proc.stdout  # Hydra's banner left out
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["reason"] == "rank 1 was killed by SIGKILL"
    modes = 2 if backend == "mpi" else 1
    assert [r["collective"] for r in doc["results"]].count("all_reduce") == 2 * modes


@pytest.mark.parametrize("backend,start", [("mpi", "exec"), ("gloo", "exec"), ("gloo", "fork")])
def test_rank_stopped_during_start_up_ends_the_job(tmp_path, backend, start):
    # exec: rank 1 stopped while it imports; fork: the template that imports for both ranks
    # (commprof/launcher/rank_template.py), found by its command line: a forked rank's /proc environment is its own
    tag = uuid.uuid4().hex
    env = env_for_tests(COMMPROF_TEST_TAG=tag, COMMPROF_RANK_START=start)
    command = [sys.executable, "-m", "commprof", "bench", "all_reduce", "--backend", backend, "--nproc", "2",
               *SMALL[:-1], "5"]
    began = time.monotonic()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stopped = None
        while stopped is None and time.monotonic() - began < 60:
            found = processes("COMMPROF_TEST_TAG", tag)
            for pid in rank_templates("COMMPROF_TEST_TAG", tag) if start == "fork" else found:
                if start == "fork" or found[pid].get("PMI_RANK", found[pid].get("RANK")) == "1" \
                        and "COMMPROF_JOB_DIR" in found[pid]:
                    os.kill(pid, signal.SIGSTOP)  # still importing: before MPI_Init / the rendezvous / the forks
                    stopped = pid
                    break
            time.sleep(0.01)
        assert stopped is not None
        _, err = proc.communicate(timeout=60)
    finally:
        kill_session(proc)
    assert proc.returncode == 3, err[-3000:]
    line = one_line(subprocess.CompletedProcess(command, 3, "", err))
    if start == "exec":
        assert line.startswith("rank 0: rank 1 did not start within 5 s (--timeout) of this one"), line
    else:
        assert line == "the ranks' template process was stopped (SIGSTOP) and did not resume within 5 s (--timeout)"
    assert not processes("COMMPROF_TEST_TAG", tag)  # the stopped rank too


def test_run_killed_mid_way_keeps_its_iterations_and_a_trace_that_merges(tmp_path):
    out, traces = tmp_path / "run.json", tmp_path / "trace"
    proc = commprof("run", "--strategy", "ddp", "--nproc", "2", "--steps", "12", "--warmup", "1",
                    "--eval-samples", "0", "--timeout", "30", "--json", str(out), "--trace", str(traces),
                    env=fault_env("die:rank=1:op=all_reduce:seq=8"), timeout=120)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert one_line(proc) == "rank 1 was killed by SIGKILL"
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["reason"] == "rank 1 was killed by SIGKILL"
    for it in doc["iterations"]["0"]:
        check_iteration(it)
    steps = [it["step"] for it in doc["iterations"]["0"]]
    assert steps and steps == list(range(1, 1 + len(steps)))
    merged = json.loads((traces / "trace.json").read_text())["traceEvents"]
    # the killed rank's file holds what it had flushed (it loses at most trace.FLUSH_NS of ranges)
    assert {e["pid"] for e in merged} == {1, 2} and any(e["pid"] == 1 and e["ph"] == "X" for e in merged)  # pid r + 1


def test_ctrl_c_of_the_launcher_ends_the_ranks_with_valid_files(tmp_path):
    tag = uuid.uuid4().hex
    out = tmp_path / "r.json"
    command = [sys.executable, "-m", "commprof", "bench", "--backend", "gloo", "--nproc", "2", "-b", "8",
               "-e", "1M", "-n", "200", "--json", str(out)]
    # started with SIGINT ignored, as `commprof … &` in a script (or a CI runner) starts it
    proc = subprocess.Popen(command, env=env_for_tests(COMMPROF_TEST_TAG=tag), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    err = signal_once_measuring(proc, out, signal.SIGINT)
    assert proc.returncode == 130, err[-3000:]
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["reason"] == "interrupted" and doc["results"]
    time.sleep(1)
    assert not processes("COMMPROF_TEST_TAG", tag)


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_a_rank_ends_through_end_process_with_its_output_and_code(backend):
    # torch keeps gloo's threads alive past destroy_process_group once torch._dynamo is loaded (an SGD
    # optimizer loads it); a rank therefore ends without the interpreter's finalization, in which a gloo
    # thread freeing a finished work aborts the process (commprof.comm.end_process)
    script = ("import torch; from commprof.comm import end_process, init_comm; "
              "from commprof.base.world import discover; "
              f"comm = init_comm(discover(), backend={backend!r}, timeout_s=10); "
              "torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1); comm.all_reduce(torch.ones(2)); "
              "comm.close(); print('written', end=''); end_process(7)")
    proc, _ = python_c(script, timeout=120)
    assert (proc.returncode, proc.stdout) == (7, "written"), proc.stderr[-3000:]


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_ranks_end_with_no_thread_of_their_own_left(backend, tmp_path):
    wrapper = f"{sys.executable} {Path(__file__).with_name('exit_threads.py')}"
    proc = commprof("bench", "all_reduce", "--backend", backend, "--nproc", "2", *UNHURRIED,
                    env=env_for_tests(COMMPROF_RANK_WRAPPER=wrapper, EXIT_THREADS_DIR=str(tmp_path)), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == [
        "rank 0 threads at exit: []\n", "rank 1 threads at exit: []\n"]


@pytest.mark.parametrize("spec,code,words", [
    ("stall:rank=1:seq=4", 3, "rank 0: all_reduce did not complete within 3 s (--timeout)"),
    ("desync:rank=0:seq=2", 4, "desync at broadcast seq 2 (world): rank 0 called broadcast 8 B float32, "
                               "rank 1 called all_reduce 8 B float32"),
])
def test_under_a_bare_mpiexec_the_exit_code_is_the_failures(spec, code, words):
    proc = spawn([sys.executable, "-m", "commprof", "bench", "all_reduce", "--backend", "mpi", *SMALL],
                 nproc=2, backend="mpi", env=fault_env(spec), timeout=120)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert words in one_line(proc)


def test_a_failure_on_the_watchdogs_thread_ends_the_rank_even_when_saving_raises():
    # The timer thread fails a rank while its main thread sits in an op: if anything on the way out raised
    # past fail(), that thread would die and the rank live on, holding its peers. Here the salvage hook
    # raises what it does not catch (a Ctrl-C in the middle of the save), and the main thread waits on.
    script = ("import threading, time; from commprof.comm import init_comm; from commprof.base.world import discover; "
              "from commprof.comm.failure.watchdog import Watchdog; from commprof.base.errors import PeerTimeoutError\n"
              "comm = init_comm(discover(), backend='gloo', timeout_s=10)\n"
              "watchdog = Watchdog(comm, timeout_s=10, rank=0)\n"
              "def save(code, message): raise KeyboardInterrupt\n"
              "watchdog.on_failure(save)\n"
              "threading.Thread(target=watchdog.fail, args=(PeerTimeoutError('rank 0: all_reduce stalled'),)).start()\n"
              "time.sleep(60)\n")
    proc, took = python_c(script, timeout=120)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert took < 50, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == ["commprof: rank 0: could not save the results: KeyboardInterrupt",
                                                "commprof: error: rank 0: all_reduce stalled"], proc.stderr


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_a_rank_that_cannot_start_leaves_none_of_the_others_behind(tmp_path, backend):
    # ranks 0 and 1 start through a wrapper of their own, rank 2's is not there: the launch fails at once, and
    # the ranks already started go with it (they would otherwise wait for rank 2 until their rendezvous gave up);
    # under mpi, mpiexec said it in two lines of its own and exited 255
    for r in (0, 1):
        wrapper = tmp_path / f"w{r}"
        wrapper.write_text('#!/bin/sh\nexec "$@"\n')
        wrapper.chmod(0o755)
    mark = uuid.uuid4().hex
    proc = commprof("bench", "all_reduce", "-b", "8", "-e", "64", "--nproc", "3", "--backend", backend,
                    env=env_for_tests(COMMPROF_RANK_WRAPPER=str(tmp_path / "w{rank}"), COMMPROF_TEST_MARK=mark))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"commprof: error: cannot start rank 2 ({tmp_path / 'w2'}): "
                                                "No such file or directory"]
    assert processes("COMMPROF_TEST_MARK", mark) == {}


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_sigterm_to_the_launcher_is_exit_143_under_every_backend(tmp_path, backend):
    # under mpi, Hydra's banner for the ranks the launcher's SIGTERM ended was taken for a rank killed on its
    # own: "rank 0 was killed by SIGTERM", exit 3
    out = tmp_path / "r.json"
    proc = subprocess.Popen([sys.executable, "-m", "commprof", "bench", "all_reduce", "--backend", backend, "--nproc",
                             "2", "-b", "8", "-e", "64M", "-n", "200", "-w", "1", "--json", str(out)],
                            env=env_for_tests(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    err = signal_once_measuring(proc, out, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "killed by" not in err and "Traceback" not in err, err[-3000:]


@pytest.mark.skipif(os.geteuid() != 0, reason="a /dev/shm of the job's own takes a mount namespace (root)")
@pytest.mark.parametrize("spec", ["die:rank=1:seq=4", "stall:rank=1:seq=4"])
def test_a_bare_mpiexec_job_that_fails_leaves_no_shared_memory(spec):
    # Hydra kills every rank once one dies, so nothing of the job is left to remove MPICH's segment: each rank
    # unlinks its name once all map it. The job runs with a /dev/shm of its own, listed as it ends.
    from commprof.launcher.launch import find_mpiexec

    job = (f"mount -t tmpfs tmpfs /dev/shm && {find_mpiexec()} -n 2 {sys.executable} -m commprof bench all_reduce "
           f"--backend mpi {' '.join(SMALL)} >/dev/null 2>&1; echo left: $(ls /dev/shm)")
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", job], env=fault_env(spec),
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "left:", proc.stdout + proc.stderr
