"""A stopped rank — rank 0 too, whose process serves the control plane's store — ends the job within
--timeout + 5 s of the stop, with exit 3 and one line naming it: under commprof's launcher (which sees the
stopped process) and under a bare mpiexec (where the peers' watchdog and the start-up deadline hold without
rank 0's store and without the interpreter), mid-sweep and during start-up (MPI_Init, the rendezvous); under
torchrun, whose 30 s grace a stopped rank never takes, its peer ends it.
The stop is a real SIGSTOP (COMMPROF_FAULT=stop sends it to the rank itself); the time is taken from the
moment the test first sees the process stopped."""

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from spawn import env_for_tests, kill_session, processes, python_c

from commprof.base import job
from commprof.launcher.launch import find_mpiexec

TIMEOUT = 3
SWEEP = ["bench", "all_reduce", "-b", "8", "-e", "64", "-f", "8", "-n", "20", "-w", "1", "--timeout", str(TIMEOUT)]
TORCHRUN_GRACE_S = 30
"""torchrun's wait between the SIGTERM it sends the other ranks when one fails and its SIGKILL: what a stopped
rank, which never acts on SIGTERM, would add to the job's end if its peer did not end it."""
LIMIT_S = TIMEOUT + TORCHRUN_GRACE_S / 2
"""What the job may take from the stop to its end. Ended by the stop's detection, it takes --timeout, the start-up
deadline's 2 s of slack and the ranks' teardown: 5-8 s on this 2-core VM idle, more beside load (8.04 s seen
against a limit of --timeout + 5); left to a launcher's grace it takes 30 s more, and never when nothing ends it.
The limit lies between those, not at the machine's speed."""


def _stopped(tag: str) -> bool:
    return any(job.process_state(pid) == "T" for pid in processes("COMMPROF_TEST_TAG", tag))


def _describe(tag: str) -> str:
    """What each process of the job is doing: its state, and where in the kernel each of its threads waits."""
    lines = []
    for pid, env in sorted(processes("COMMPROF_TEST_TAG", tag).items()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
            waits = sorted(Path(f"/proc/{pid}/task/{t.name}/wchan").read_text() or "-"
                           for t in Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        lines.append(f"pid {pid} rank {env.get('PMI_RANK', env.get('RANK', '?'))} {job.process_state(pid)} {cmd}: "
                     f"{', '.join(waits)}")
    return "\n".join(lines)


def run_until_stopped(command: list[str], fault: str, said: list | None = None) -> tuple[int, str, float]:
    """Run `command` with `fault`; (exit code, stderr, seconds from the first sight of a stopped rank to the
    end); `said` gets the seconds from the job's line on stderr to the end. Output goes to files: a pipe
    nobody reads must not be what holds a rank."""
    tag = uuid.uuid4().hex
    env = env_for_tests(COMMPROF_FAULT=fault, COMMPROF_TEST_TAG=tag)
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            deadline, stopped_at, line_at = time.monotonic() + 120, None, None
            while proc.poll() is None and time.monotonic() < deadline:
                if stopped_at is None and _stopped(tag):
                    stopped_at = time.monotonic()
                if line_at is None and said is not None:
                    err.seek(0)
                    if "commprof: error" in err.read():
                        line_at = time.monotonic()
                time.sleep(0.02)
            ended = time.monotonic()
            if proc.poll() is None:
                err.seek(0)
                pytest.fail(f"the job did not end\n{_describe(tag)}\n{err.read()[-3000:]}")
        finally:
            kill_session(proc)
        err.seek(0)
        text = err.read()
    assert stopped_at is not None, text[-3000:]
    if said is not None:
        said.append(ended - (line_at if line_at is not None else ended))
    time.sleep(0.5)
    assert not processes("COMMPROF_TEST_TAG", tag)  # the stopped rank too
    return proc.returncode, text, ended - stopped_at


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commprof: error: "), text[-3000:]
    return lines[0][len("commprof: error: "):]


def launcher(backend: str) -> list[str]:
    return [sys.executable, "-m", "commprof", *SWEEP, "--backend", backend, "--nproc", "2"]


def bare_mpiexec(backend: str) -> list[str]:
    return [find_mpiexec(), "-n", "2", sys.executable, "-m", "commprof", *SWEEP, "--backend", backend]


# rank 0 (the store's host) on gloo, rank 1 on MPI; rank 0 stopped under MPI: the bare-mpiexec test below
@pytest.mark.parametrize("backend,rank", [("gloo", 0), ("mpi", 1)])
def test_a_rank_stopped_mid_sweep_is_named_by_the_launcher(backend, rank):
    code, err, took = run_until_stopped(launcher(backend), f"stop:rank={rank}:seq=6")
    assert code == 3, err[-3000:]
    assert one_line(err) == f"rank {rank} was stopped (SIGSTOP) and did not resume within {TIMEOUT} s (--timeout)"
    assert took < LIMIT_S, took


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_rank_0_stopped_mid_sweep_under_a_bare_mpiexec(backend):
    code, err, took = run_until_stopped(bare_mpiexec(backend), "stop:rank=0:seq=6")
    # rank 1 exits 3; Hydra then kills the stopped rank 0 and returns the code of the end it reaps first:
    # usually 3, 9 (SIGKILL) when rank 0's comes first
    assert code in (3, 9), err[-3000:]
    line = one_line(err)
    assert line.startswith("rank 1: ") and f"did not complete within {TIMEOUT} s (--timeout)" in line, line
    assert line.endswith("; rank 0 did not answer on the control plane"), line
    assert took < LIMIT_S, took


def test_a_rank_stopped_under_torchrun_is_ended_by_its_peer():
    # torchrun sends the other ranks SIGTERM when one fails and SIGKILL 30 s later: a stopped rank never acts
    # on SIGTERM, and the job ended 38 s after the stop. Its peer on the same host ends it once the line is said
    # The time judged is from the line to the end, against torchrun's grace: from the stop to the line is the
    # watchdog's --timeout and the claimant's wait for the stopped rank's record (comm/failure/watchdog.py), which a
    # busy machine stretches (8.4 s seen against TIMEOUT + 5)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "commprof", *SWEEP]
    said: list = []
    code, err, took = run_until_stopped(command, "stop:rank=1:seq=6", said)
    assert code != 0, err[-3000:]
    assert f"rank 0: all_reduce did not complete within {TIMEOUT} s (--timeout)" in err, err[-3000:]
    assert "rank 1 did not answer on the control plane" in err, err[-3000:]
    assert said[0] < TORCHRUN_GRACE_S / 2, (said, took, err[-3000:])


@pytest.mark.parametrize("backend,rank", [("gloo", 0), ("mpi", 1)])
def test_a_rank_stopped_in_start_up_under_a_bare_mpiexec(backend, rank):
    # stopped after its imports, right before MPI_Init / the rendezvous: its peer waits there holding the
    # interpreter, where only the start-up deadline (commprof/base/deadline.py) can end it
    code, err, took = run_until_stopped(bare_mpiexec(backend), f"stop:rank={rank}:at=init")
    assert code != 0, err[-3000:]
    assert one_line(err) == (f"rank {rank} was stopped (SIGSTOP) during start-up and did not resume within "
                             f"{TIMEOUT + 2} s (--timeout + 2 s)")
    assert took < LIMIT_S, took


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_a_rank_stopped_in_start_up_is_named_by_the_launcher(backend):
    code, err, took = run_until_stopped(launcher(backend), "stop:rank=0:at=init")
    assert code == 3, err[-3000:]
    assert one_line(err) == f"rank 0 was stopped (SIGSTOP) and did not resume within {TIMEOUT} s (--timeout)"
    assert took < LIMIT_S, took


def test_the_start_up_deadline_ends_a_waiting_rank_with_exit_3(tmp_path):
    # the deadline alone, on a call that holds the GIL (a busy C loop in a regex): a thread could not end it
    script = ("import re; from commprof.base import deadline\n"
              "with deadline.guard('MPI_Init', timeout_s=0.5, rank=1):\n"
              "    re.match(r'(a+)+$', 'a' * 40 + 'b')\n")
    proc, took = python_c(script, timeout=60)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert one_line(proc.stderr) == ("rank 1: MPI_Init did not complete within 2.5 s (--timeout + 2 s): a peer "
                                     "rank stalled or died during start-up")
    assert took < 30


def test_the_start_up_deadline_leaves_quietly_when_the_call_returns():
    # past the deadline and its slack, the rank lives on and SIGQUIT is what it was before (libc's view:
    # SIG_DFL, or SIG_IGN for a process a shell started in the background)
    script = ("import ctypes, signal, time; from commprof.base import deadline\n"
              "libc = ctypes.CDLL(None); libc.signal.restype = ctypes.c_void_p\n"
              "libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)\n"
              "before = libc.signal(signal.SIGQUIT, None); libc.signal(signal.SIGQUIT, before)\n"
              "with deadline.guard('MPI_Init', timeout_s=0.2, rank=0):\n"
              "    pass\n"
              "time.sleep(3.5)\n"
              "print(libc.signal(signal.SIGQUIT, None) == before)\n")
    proc, _ = python_c(script, timeout=60)
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "True", "")


@pytest.mark.parametrize("read_after_s,within_s", [(0.5, 30.0), (None, 0.5)])
def test_a_rank_about_to_abort_waits_for_its_launcher_to_read_its_line(read_after_s, within_s):
    # Hydra forwards a rank's stderr over the socket that carries MPI_Abort: what is still in the pipe when
    # the abort arrives is lost (the one line of the bare-mpiexec tests above, about once in 35 runs). The
    # child times from before its write, so the reader's delay bounds the wait from below on a busy machine.
    script = ("import sys, time; from commprof.base import pipes\n"
              "start = time.monotonic(); sys.stderr.write('commprof: error: a line\\n'); sys.stderr.flush()\n"
              f"pipes.drain(within_s={within_s})\n"
              "print(time.monotonic() - start, flush=True)\n")
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([sys.executable, "-c", script], env=env_for_tests(), stdout=out,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            if read_after_s is None:  # nobody reads until the rank has ended
                assert proc.wait(timeout=120) == 0
            else:  # the line is in the pipe: leave it there a while, then read it
                assert select.select([proc.stderr], [], [], 120)[0]
                time.sleep(read_after_s)
            line = proc.stderr.read().decode()
            assert proc.wait(timeout=120) == 0
        finally:
            proc.kill()
        out.seek(0)
        waited = float(out.read())
    assert line == "commprof: error: a line\n"
    # with a reader: it waited for the read and no longer; without one: for `within_s`, then went on
    assert (read_after_s or within_s) <= waited < (within_s if read_after_s else within_s + 60), waited


def test_rank_0_stopped_in_its_imports_under_torchrun_is_named_by_its_peer():
    # stopped before its own start-up guard began: its peer's guard, at the rendezvous' deadline, finds it
    # stopped beside it (torchrun's agent's other child), names it and ends it; the job ended 41.7 s after the
    # stop, torchrun's grace, with no line naming rank 0
    tag = uuid.uuid4().hex
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "commprof", *SWEEP]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, env=env_for_tests(COMMPROF_TEST_TAG=tag), stdout=subprocess.DEVNULL,
                                stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            stopped_at, deadline = None, time.monotonic() + 60
            while stopped_at is None and time.monotonic() < deadline:
                for pid, env in processes("COMMPROF_TEST_TAG", tag).items():
                    if env.get("RANK") == "0":
                        os.kill(pid, signal.SIGSTOP)  # still importing
                        stopped_at = time.monotonic()
                        break
                time.sleep(0.01)
            assert stopped_at is not None
            proc.wait(timeout=120)
            took = time.monotonic() - stopped_at
        finally:
            kill_session(proc)
        err.seek(0)
        text = err.read()
    assert proc.returncode != 0, text[-3000:]
    # said by the peer's rendezvous, which times out first, or else by its start-up guard
    assert "commprof: error: rank 0 was stopped (SIGSTOP) during start-up and did not resume within" in text, text
    assert took < TIMEOUT + 2 + TORCHRUN_GRACE_S / 2, (took, text[-3000:])
