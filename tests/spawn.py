"""Start real ranks for tests: N local processes with torchrun's variables (gloo), or mpiexec -n N (MPI).

    proc = spawn([sys.executable, "script.py"], nproc=3, backend="gloo")

Every job runs in a session of its own: when one rank fails the others get GRACE_S to finish theirs, and
on a failure or a timeout the whole session is killed, so no test waits on a rank that can never finish
and none leaves a process behind. Every process started here carries SESSION_ENV, so conftest.py can
check at the end of the run that none is still alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from commprof.base.backends import free_port, release_port
from commprof.launcher.launch import find_mpiexec

TIMEOUT_S = 180
GRACE_S = 10.0
"""How long the other ranks of a job may run on after one failed, to report their own error."""
SESSION_ENV = "COMMPROF_TEST_SESSION"
"""Names the pytest run that started a process: the leak check finds them by it."""
RUN_ENV = "COMMPROF_TEST_RUN"
"""The pid of the run's first pytest process, set by conftest.py and inherited by pytest-xdist's workers, so
that the processes of every worker carry the same SESSION_ENV (the workers themselves do not carry it)."""


def session_id() -> str:
    return os.environ.get(RUN_ENV) or str(os.getpid())


def env_for_tests(**extra: str) -> dict:
    """The environment of a process a test starts. Its gloo jobs fork their ranks from a template
    (COMMPROF_RANK_START=fork, commprof/launcher/rank_template.py): half the CPU of a short job, which most of
    the suite's are; what a forked rank is to a user's script is checked against a started one in
    tests/test_rank_template.py, and the launcher's sessions, signals and start-up failures in both ways
    (test_sessions.py, test_failures.py)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", COMMPROF_RANK_START="fork")
    for key in ("COMMPROF_DEBUG", "COMMPROF_FAULT", "COMMPROF_JOB_DIR", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return {**env, SESSION_ENV: session_id(), **extra}


def _run(commands: list[tuple[list[str], dict]], timeout: float, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run processes side by side (in `cwd`, else here), each in its own session, output to files (no pipe can
    fill up)."""
    with tempfile.TemporaryDirectory(prefix="commprof-test-") as tmp:
        procs, files = [], []
        for i, (command, env) in enumerate(commands):
            out, err = open(Path(tmp) / f"{i}.out", "w+"), open(Path(tmp) / f"{i}.err", "w+")
            files.append((out, err))
            procs.append(subprocess.Popen(command, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                          start_new_session=True, cwd=cwd))
        deadline = time.monotonic() + timeout
        first_failure = None
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed and first_failure is None:
                first_failure = failed[0]
                deadline = min(deadline, time.monotonic() + GRACE_S)
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        timed_out = first_failure is None and any(p.returncode is None for p in procs)
        for p in procs:
            kill_session(p)
        texts = []
        for out, err in files:
            out.seek(0)
            err.seek(0)
            texts.append((out.read(), err.read()))
            out.close()
            err.close()
    if timed_out:
        raise subprocess.TimeoutExpired(commands[0][0], timeout, "".join(o for o, _ in texts),
                                        "".join(e for _, e in texts))
    # the worst rank's code, but a rank killed here after another failed does not hide that failure
    code = first_failure if first_failure is not None else max((p.returncode for p in procs), key=abs)
    return subprocess.CompletedProcess(commands[0][0], code, "".join(o for o, _ in texts),
                                       "".join(e for _, e in texts))


def read_terminal(master: int) -> bytes:
    """All a pseudo-terminal's programs wrote to it, read from its `master` end until the last writer closed it."""
    shown = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the last writer closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    return shown


def kill_session(proc: subprocess.Popen) -> None:
    """Kill `proc` and everything it started (its session), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def spawn(command: list[str], *, nproc: int, backend: str, env: dict | None = None,
          timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run `command` as `nproc` ranks and wait; stdout/stderr of all ranks, exit code = worst rank's."""
    env = env_for_tests() if env is None else env
    if backend == "mpi":
        return _run([([find_mpiexec(), "-n", str(nproc), *command], env)], timeout)
    port = free_port()
    try:
        return _run([(command, {**env, "RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(r),
                                "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
                     for r in range(nproc)], timeout)
    finally:
        release_port(port)


def python_c(script: str, *, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    """`python -c SCRIPT` in the tests' environment: its process, and the seconds it took."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], env=env_for_tests(), capture_output=True, text=True,
                          timeout=timeout)
    return proc, time.monotonic() - start


def commprof(*args: str, env: dict | None = None, timeout: float = TIMEOUT_S,
             cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run the commprof CLI as a user would (its own launcher does the rest), in `cwd` (else here)."""
    return _run([([sys.executable, "-m", "commprof", *args], env_for_tests() if env is None else env)], timeout,
                cwd)


def processes(marker: str, value: str) -> dict[int, dict[str, str]]:
    """pid -> environment of every live process (zombies aside) whose environment has marker=value."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            raw = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        if env.get(marker) == value:
            found[int(entry.name)] = env
    return found


def cmdline(pid: int) -> str:
    """Process `pid`'s command line, its arguments joined by spaces; "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def rank_templates(marker: str, value: str) -> list[int]:
    """The live rank templates (commprof/launcher/rank_template.py) whose environment has marker=value."""
    return forked(marker, value)[0]


def forked(marker: str, value: str) -> tuple[list[int], list[int]]:
    """The rank templates whose environment has marker=value, and the ranks they forked: those share a
    template's command line and /proc environment (RANK is not in it), and are told apart as its children."""
    found = [pid for pid in processes(marker, value) if "-m commprof.launcher.rank_template " in cmdline(pid)]
    templates = [pid for pid in found if _parent(pid) not in found]
    return templates, [pid for pid in found if pid not in templates]


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
