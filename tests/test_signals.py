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
from spawn import env_for_tests, forked, kill_session, processes

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


def test_a_reader_of_stdout_and_stderr_that_leaves_loses_no_result(tmp_path):
    # `2>&1 | head`: rank 0's "trace:" and "json:" lines met the closed pipe on stderr, it left, and the job
    # exited 3 with its results replaced by rank 1's error
    out = tmp_path / "r.json"
    command = (f"{sys.executable} -m commprof run --strategy ddp --nproc 2 --steps 4 --warmup 1 --eval-samples 0 "
               f"--trace {tmp_path / 't'} --json {out} 2>&1 | head -2; exit ${{PIPESTATUS[0]}}")
    proc = subprocess.run(["bash", "-c", command], env=env_for_tests(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert json.loads(out.read_text())["complete"] is True


def _listening(pid: int) -> list[str]:
    """host:port of every listening TCP socket process `pid` holds, read from its own network namespace."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                host, port = cols[1].split(":")
                addr = (".".join(str(b) for b in reversed(bytes.fromhex(host))) if len(host) == 8 else host)
                found.append(f"{addr}:{int(port, 16)}")
    return found


def _reach(pid: int) -> str:
    """Where a socket on every interface of `pid`'s network namespace can be reached from: "host" for this
    test's own namespace, "loopback" for one whose only interface is lo, else the interfaces."""
    if os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net"):
        return "host"
    names = [row.split(":")[0].strip() for row in Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]]
    return "loopback" if names == ["lo"] else ",".join(names)


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_a_local_job_listens_on_loopback_only(backend):
    # every socket of every process of the job: the store, under MPI the library's transports (UCX,
    # libfabric) and Hydra's control port, which mpiexec opens on every interface (it has no setting for it)
    # and its ranks inherit: that one may only be in a network namespace that holds loopback alone
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "commprof", *LONG, "--backend", backend, "--nproc", "2"],
                            env=env_for_tests(COMMPROF_TEST_TAG=tag), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        seen: set[tuple[str, str, str]] = set()
        samples, deadline = 0, time.monotonic() + 90
        while samples < 10 and time.monotonic() < deadline and proc.poll() is None:
            _, ranks = forked("COMMPROF_TEST_TAG", tag)  # gloo's: their /proc environment is their template's
            for pid, env in processes("COMMPROF_TEST_TAG", tag).items():
                who = "rank" if "RANK" in env or "PMI_RANK" in env or pid in ranks else "launcher or mpiexec"
                try:
                    seen |= {(who, addr, _reach(pid)) for addr in _listening(pid)}
                except OSError:  # the process ended between the reads
                    pass
            samples += bool(seen)  # ten looks, 0.1 s apart, from the first socket seen on
            time.sleep(0.1)
    finally:
        kill_session(proc)
    assert any(who == "rank" for who, _, _ in seen), f"no rank's listening socket seen during the job: {seen}"
    open_to_more = [s for s in seen if not s[1].startswith("127.0.0.1:") and s[2] != "loopback"]
    assert not open_to_more, open_to_more
    if backend == "mpi":  # Hydra's port: on every interface, of the job's own namespace
        assert any(not addr.startswith("127.") and reach == "loopback" for _, addr, reach in seen), seen


@pytest.mark.parametrize("user_namespace", [False, True])
def test_the_jobs_network_namespace_holds_loopback_alone(user_namespace):
    # the path a user without root takes too (a user namespace first): the same uid, a new namespace, lo up
    show = ("import os, socket; from commprof.launcher import netns; assert netns.enter(user_namespace={u}); "
            "server = socket.create_server(('127.0.0.1', 0)); socket.create_connection(server.getsockname()); "
            "print(os.geteuid(), os.readlink('/proc/self/ns/net'), open('/proc/self/net/dev').read())")
    proc = subprocess.run([sys.executable, "-c", show.format(u=user_namespace)], env=env_for_tests(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    uid, ns, table = proc.stdout.split(" ", 2)
    assert uid == str(os.geteuid()) and ns != os.readlink("/proc/self/ns/net")
    assert [row.split(":")[0].strip() for row in table.strip().splitlines()[2:]] == ["lo"], table


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
