"""Signals, pipes and sockets of a local job: Ctrl-C (SIGINT to the whole foreground group, as a terminal
sends it) exits 130 on every backend; a reader that leaves (`| head`) is not a failure of the job; and a
local job's rendezvous store listens on loopback only (read from /proc/net/tcp while the job runs)."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from spawn import env_for_tests, kill_session, processes

from commprof.comm.store import listen
from commprof.errors import UsageError

LONG = ["bench", "all_reduce", "-b", "8", "-e", "1M", "-n", "200", "--timeout", "30"]


@pytest.mark.parametrize("backend", ["mpi"])  # gloo: tests/test_failures.py's Ctrl-C of the launcher
def test_ctrl_c_of_the_whole_group_exits_130(tmp_path, backend):
    tag = uuid.uuid4().hex
    out = tmp_path / "r.json"
    proc = subprocess.Popen([sys.executable, "-m", "commprof", *LONG, "--backend", backend, "--nproc", "2",
                             "--json", str(out)], env=env_for_tests(COMMPROF_TEST_TAG=tag),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not out.exists() and time.monotonic() < deadline:  # the first point is measured
            time.sleep(0.05)
        assert out.exists()
        os.killpg(proc.pid, signal.SIGINT)  # launcher, mpiexec and ranks alike, as Ctrl-C does
        _, err = proc.communicate(timeout=30)
    finally:
        kill_session(proc)
    assert proc.returncode == 130, err[-3000:]
    assert "killed by" not in err and "Traceback" not in err, err[-3000:]
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["reason"] == "interrupted" and doc["results"]
    time.sleep(1)
    assert not processes("COMMPROF_TEST_TAG", tag)


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_a_reader_that_leaves_is_not_a_failure(backend):
    command = (f"{sys.executable} -m commprof bench all_reduce -b 8 -e 64K -n 5 -w 1 --timeout 30 "
               f"--backend {backend} --nproc 2 | head -3; exit ${{PIPESTATUS[0]}}")
    proc = subprocess.run(["bash", "-c", command], env=env_for_tests(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == "" and len(proc.stdout.splitlines()) == 3


def _listening(pids) -> list[str]:
    """host:port of every listening TCP socket the processes `pids` hold, read from /proc."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                host, port = cols[1].split(":")
                addr = (".".join(str(b) for b in reversed(bytes.fromhex(host))) if len(host) == 8 else host)
                found.append(f"{addr}:{int(port, 16)}")
    return found


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_a_local_job_listens_on_loopback_only(backend):
    # the store, and under MPI the library's transports (UCX, libfabric); Hydra's control port, which mpiexec
    # opens on every interface and its ranks inherit, is mpiexec's own and has no setting (docs/failures.md)
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "commprof", *LONG, "--backend", backend, "--nproc", "2"],
                            env=env_for_tests(COMMPROF_TEST_TAG=tag), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        seen: set[str] = set()
        samples, deadline = 0, time.monotonic() + 90
        while samples < 10 and time.monotonic() < deadline and proc.poll() is None:
            job = processes("COMMPROF_TEST_TAG", tag)
            ranks = [pid for pid, env in job.items() if "RANK" in env or "PMI_RANK" in env]
            others = [pid for pid, env in job.items() if pid not in ranks]
            try:
                mine = set(_listening(ranks)) - set(_listening(others))
            except OSError:  # a process ended between the two reads
                mine = set()
            seen |= mine
            samples += bool(seen)  # ten looks, 0.1 s apart, from the first socket seen on
            time.sleep(0.1)
    finally:
        kill_session(proc)
    assert seen, "no listening socket seen during the job"
    assert all(s.startswith("127.0.0.1:") for s in seen), seen


def test_the_store_listens_on_the_named_address_and_says_when_it_cannot(monkeypatch):
    sock = listen("127.0.0.1", 0)
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()
    with pytest.raises(UsageError, match=r"rank 0 cannot listen on 192\.0\.2\.254:0 .*COMMPROF_STORE_BIND=0\.0\.0\.0"):
        listen("192.0.2.254", 0)  # TEST-NET-1: an address this host does not hold
    monkeypatch.setenv("COMMPROF_STORE_BIND", "0.0.0.0")
    sock = listen("192.0.2.254", 0)
    try:
        assert sock.getsockname()[0] == "0.0.0.0"
    finally:
        sock.close()


def test_contention_from_another_process_is_said_under_the_table_and_in_the_json(tmp_path):
    # two busy loops on this 2-core host while one rank measures: the ranks' own CPU is not counted, theirs is
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"], env=env_for_tests(),
                              start_new_session=True) for _ in range(2)]
    try:
        out = tmp_path / "r.json"
        proc = subprocess.run([sys.executable, "-m", "commprof", "bench", "all_reduce", "-b", "8", "-e", "64K",
                               "-n", "20", "--nproc", "1", "--json", str(out)], env=env_for_tests(),
                              capture_output=True, text=True, timeout=120)
    finally:
        for loop in loops:
            kill_session(loop)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(out.read_text())["env"]["contention"]
    assert seen["contended"] is True and seen["others_cores"] >= 0.5, seen
    assert "note: contended: other processes used" in proc.stdout


def test_a_quiet_measurement_counts_its_own_ranks_as_its_own(tmp_path):
    # no figure can be asserted for others on a shared machine; the job's own two busy ranks must not count
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "commprof", "bench", "all_reduce", "-b", "8", "-e", "64K",
                           "-n", "50", "--nproc", "2", "--json", str(out)], env=env_for_tests(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(out.read_text())["env"]["contention"]
    assert seen["seconds"] > 0 and 0 <= seen["others_cores"] < 2.0, seen
    assert ("note: contended" in proc.stdout) == seen["contended"]
