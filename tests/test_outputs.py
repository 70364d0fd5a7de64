"""Result files never clobber what they should not and bad paths are refused before any rank starts: a
device or a FIFO is written through (never replaced by a regular file), a symlink is followed, a new file
gets the umask's mode; a path whose parent is a file, a --trace that is a file, an unwritable folder, two
flags naming one file: exit 2, one line, nothing launched and no job folder left behind. Every file written is
said once on stderr."""

import csv
import json
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest
from spawn import env_for_tests

TINY = ["bench", "all_reduce", "-b", "8", "-e", "64", "-n", "2", "-w", "1", "--timeout", "30"]


def run(*args, tmp_path, umask=None):
    env = env_for_tests(TMPDIR=str(tmp_path))  # the launcher's job folder is made here
    return subprocess.run([sys.executable, "-m", "commprof", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path,
                          preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


def one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commprof: error: "), proc.stderr[-3000:]
    return lines[0][len("commprof: error: "):]


def job_folders(tmp_path):
    return sorted(p.name for p in tmp_path.glob("commprof-job-*"))


@pytest.mark.parametrize("flags,words", [
    (["--json", "afile/out.json"], "--json afile/out.json: {tmp}/afile is a file, not a folder"),
    (["--trace", "afile"], "--trace afile: is a file, not a folder"),
    (["--json", "/proc/nope/x.json"], "--json /proc/nope/x.json: cannot write in /proc"),
    (["--json", "."], "--json .: is a folder, not a file"),
    (["--csv", "same.out", "--json", "same.out"], "--json and --csv same.out name one file"),
    (["--json", "link.json", "--csv", "same.out"], "--json link.json and --csv same.out name one file"),
])
def test_bad_output_paths_are_refused_before_launching(tmp_path, flags, words):
    (tmp_path / "afile").write_text("mine\n")
    (tmp_path / "link.json").symlink_to(tmp_path / "same.out")
    proc = run(*TINY, "--nproc", "2", *flags, tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert one_line(proc).startswith(words.format(tmp=tmp_path)), proc.stderr
    assert (tmp_path / "afile").read_text() == "mine\n" and not (tmp_path / "same.out").exists()
    assert proc.stdout == "" and not job_folders(tmp_path)


def test_a_device_that_refuses_is_one_line_and_stays_a_device(tmp_path):
    proc = run(*TINY, "--nproc", "2", "--json", "/dev/full", tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert one_line(proc) == "cannot write /dev/full: No space left on device"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode) and stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not job_folders(tmp_path)  # the launcher's clean-up ran, whatever its salvage met


def test_a_disk_that_fills_during_a_run_is_one_line_naming_the_file(tmp_path):
    # a write refused past RLIMIT_FSIZE (EFBIG), as a full disk refuses one (ENOSPC), on every file of the job:
    # the line was said twice, with a bare OSError naming no file, and one on a rank that was not speaking
    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, resource.RLIM_INFINITY))

    out, traces = tmp_path / "r.json", tmp_path / "t"
    proc = subprocess.run([sys.executable, "-m", "commprof", "run", "--strategy", "ddp", "--nproc", "2", "--steps",
                           "10", "--warmup", "1", "--eval-samples", "0", "--json", str(out), "--trace", str(traces)],
                          env=env_for_tests(TMPDIR=str(tmp_path)), capture_output=True, text=True, timeout=120,
                          preexec_fn=small_files)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = one_line(proc)
    # (the claimant adds what its peer was doing: "; rank 1 was in no op")
    assert re.match(rf"cannot write {re.escape(str(traces))}/rank[01]\.trace\.json: File too large", line), line
    doc = json.loads(out.read_text())  # what was kept, whole, with the job's verdict
    assert doc["complete"] is False and doc["reason"] == line
    assert not job_folders(tmp_path)
    for rank in (0, 1):  # each rank's own trace whole JSON still: the write the disk cut short taken back
        assert isinstance(json.loads((traces / f"rank{rank}.trace.json").read_text()), list)


def test_a_closed_stdout_is_one_line_and_a_closed_stderr_or_stdin_is_dev_null(tmp_path):
    def closed(fds: str):  # the shell closes them, as `commprof … >&-` does
        argv = [sys.executable, "-m", "commprof", *TINY, "--nproc", "2", "--json", str(tmp_path / "r.json")]
        return subprocess.run(["sh", "-c", f'exec "$@" {fds}', "sh", *argv], env=env_for_tests(TMPDIR=str(tmp_path)),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, cwd=tmp_path)

    proc = closed(">&-")
    assert proc.returncode == 2 and proc.stderr == ("commprof: error: standard output is closed: give it a file, or "
                                                    "/dev/null to discard the tables (commprof … >/dev/null)\n")
    assert not (tmp_path / "r.json").exists() and not list(tmp_path.glob("commprof-job-*"))  # nothing ran
    proc = closed("2>&- <&-")
    assert proc.returncode == 0 and "busbw" in proc.stdout and json.loads((tmp_path / "r.json").read_text())["complete"]


def test_dev_null_takes_the_results_and_stays_a_device(tmp_path):
    proc = run(*TINY, "--nproc", "1", "--json", "/dev/null", "--csv", "/dev/null", tmp_path=tmp_path)
    assert proc.returncode == 2 and "--csv /dev/null name one file" in one_line(proc)
    proc = run(*TINY, "--nproc", "1", "--json", "/dev/null", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_fifo_gets_one_whole_document(tmp_path):
    fifo = tmp_path / "results.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    proc = run(*TINY, "--nproc", "2", "--json", str(fifo), tmp_path=tmp_path)
    reader.join(30)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(got[0])  # one document: the snapshots of a running sweep are not sent to a pipe
    assert doc["complete"] is True and [r["nbytes"] for r in doc["results"]] == [8, 16, 32, 64]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_symlink_is_followed_and_a_new_file_gets_the_umask_mode(tmp_path):
    target = tmp_path / "store" / "r.json"
    target.parent.mkdir()
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    proc = run(*TINY, "--nproc", "1", "--json", str(link), "--csv", "r.csv", tmp_path=tmp_path, umask=0o027)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert link.is_symlink() and json.loads(target.read_text())["complete"] is True
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(tmp_path / "r.csv").st_mode) == 0o640


def test_a_killed_launchers_job_folder_goes_with_the_next_launch(tmp_path):
    """A launcher killed by SIGKILL cannot remove its job folder: the next launch removes every folder whose
    launcher is gone, and leaves a live launcher's and one it cannot tell about."""
    long = ["bench", "all_reduce", "-b", "8", "-e", "8", "-n", "1000000", "-w", "0", "--nproc", "2"]
    proc = subprocess.Popen([sys.executable, "-m", "commprof", *long], env=env_for_tests(TMPDIR=str(tmp_path)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not any(len(list(tmp_path.glob(f"{f}/rank*.pid"))) == 2 for f in job_folders(tmp_path)):
            assert proc.poll() is None and time.monotonic() < deadline, "the ranks never checked in"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)  # the launcher alone: its finally never runs
        proc.wait()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its ranks
        except ProcessLookupError:
            pass
    (stale,) = job_folders(tmp_path)
    live, unknown = tmp_path / "commprof-job-live", tmp_path / "commprof-job-old"
    live.mkdir()
    (live / "launcher.pid").write_text(f"{os.getpid()}\n")
    unknown.mkdir()
    proc = run(*TINY, "--nproc", "2", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert job_folders(tmp_path) == ["commprof-job-live", "commprof-job-old"], stale


def test_every_command_says_each_file_it_wrote_once(tmp_path):
    """One stderr line per file written, `kind: path` as --trace's: bench (--json, -F), run (--json, --csv,
    the single run's own CSV row), profile (--json), report (--plot)."""
    scripts = os.path.join(os.path.dirname(__file__), "scripts")
    jobs = {
        "bench": ([*TINY, "--nproc", "2", "--json", "b.json", "-F", "b.csv"], ["json: b.json", "csv: b.csv"]),
        "run": (["run", "--strategy", "ddp", "--nproc", "2", "--steps", "3", "--warmup", "1", "--batch-size", "8",
                 "--eval-samples", "0", "--json", "r.json", "--csv", "r.csv"], ["json: r.json", "csv: r.csv"]),
        "profile": (["profile", "--nproc", "2", "--json", "p.json", "--", os.path.join(scripts, "collectives.py"),
                     "--steps", "2"], ["json: p.json"]),
        "report": (["report", "b.json", "--plot", "plots"], ["plot: " + os.path.join("plots", "bench-all_reduce.png")]),
    }
    for name, (argv, said) in jobs.items():
        proc = run(*argv, tmp_path=tmp_path)
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(("json: ", "csv: ", "plot: "))]
        assert lines == said, (name, proc.stderr[-3000:])
        if name == "profile":  # 2 iterations, both warm-up by default: said, not a table of nothing
            assert "the script's 2 iteration(s) were all warm-up (--warmup 4)" in " ".join(proc.stdout.split())
        for line in said:
            assert (tmp_path / line.split(": ", 1)[1]).is_file(), line
    row, = csv.DictReader((tmp_path / "r.csv").open())
    doc = json.loads((tmp_path / "r.json").read_text())
    assert (row["strategy"], int(row["nproc"])) == ("ddp", doc["env"]["world_size"])
    assert float(row["wall_ms"]) == pytest.approx(doc["summary"]["wall_ms"])


@pytest.mark.skipif(os.geteuid() != 0, reason="a disk of the job's own takes a mount namespace (root)")
def test_a_disk_full_at_the_end_leaves_the_reason_not_running(tmp_path):
    # the disk fills while the job runs (a file of another's takes what is left): the final document cannot
    # be written, and the running one said "reason": "running" for good; its reason is now written in place
    disk = tmp_path / "disk"
    disk.mkdir()
    job = (f"mount -t tmpfs -o size=2m tmpfs {disk} && cd {disk} && "
           f"({sys.executable} -m commprof run --strategy ddp --nproc 2 --steps 100 --warmup 1 --eval-samples 0 "
           f"--json {disk}/r.json >/dev/null 2>{tmp_path}/err; echo $? > {tmp_path}/code) & "
           f"while [ ! -s {disk}/r.json ]; do sleep 0.05; done; dd if=/dev/zero of={disk}/fill bs=4k 2>/dev/null; "
           f"wait; cat {tmp_path}/code; echo =====; cat {tmp_path}/err; echo =====; cat {disk}/r.json")
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", job],
                          env=env_for_tests(TMPDIR=str(tmp_path)), capture_output=True, text=True, timeout=300)
    code, err, doc = proc.stdout.split("=====\n", 2)
    assert code.strip() == "1" and err.startswith("commprof: error: cannot write "), (code, err, proc.stderr)
    doc = json.loads(doc)
    assert doc["complete"] is False and doc["reason"] != "running", doc["reason"]
    assert "No space left on device" in doc["reason"] and len(doc["iterations"]["0"]) >= 1
