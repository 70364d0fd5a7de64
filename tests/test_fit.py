"""What a user's terminal shows while a job runs: run and profile show progress on a terminal only. The tables
at 80, 120 and 200 columns are checked on recorded results in tests/unit/test_table_widths.py."""

import os
import pty
import re
import subprocess
import sys

from spawn import env_for_tests, read_terminal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commprof(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commprof", *args], env=env_for_tests(**env), capture_output=True,
                          text=True, timeout=300)


def _on_a_terminal(argv: list[str], stdout_too: bool = False) -> tuple[int, str]:
    """Run commprof with stderr (and stdout, `stdout_too`) on a pseudo-terminal; its exit code and what the
    terminal showed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "commprof", *argv],
                            stdout=slave if stdout_too else subprocess.DEVNULL, stderr=slave,
                            env=env_for_tests(TERM="xterm", COLUMNS="100"))
    os.close(slave)
    shown = read_terminal(master)
    os.close(master)
    return proc.wait(timeout=300), shown.decode(errors="replace")


def test_run_and_profile_show_progress_on_a_terminal_only(tmp_path):
    steps = ["--nproc", "2"]
    code, shown = _on_a_terminal(["run", "--strategy", "ddp", *steps, "--steps", "12", "--eval-samples", "0"])
    assert code == 0 and re.search(r"12/12\S* \d+\.\d ms/iteration", shown), shown[-2000:]
    script = os.path.join(ROOT, "tests", "scripts", "ddp_train.py")
    # --live's line comes from rank 0's live thread once a window is combined: 120 steps give it time to, mid-run
    code, shown = _on_a_terminal(["profile", *steps, "--live", "--live-window", "5", "--metrics-port", "off", "--",
                                  script, "--steps", "120"], stdout_too=True)
    # what starts is said at once; the count so far and the time so far (a script's iteration count is its own)
    assert code == 0 and shown.startswith("commprof profile: starting 2 rank(s) on gloo…"), shown[:300]
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)  # colours and cursor moves left out
    assert re.search(r"iteration \d+ \d+\.\d ms/iteration \d+:\d\d:\d\d", plain), plain[-2000:]
    # --live: once a window is combined the row is the live line, fitted to the terminal's 100 columns by
    # priority (live/monitor.py's line): the iteration, then the top finding with its cost a step and since when
    # ("iteration 15 · (contended) · exposed_comm all_reduce +1.7 ms/step (26%) since step 4"), or that none is
    live = r"iteration \d+ · .*(\+\d+\.\d ms/step( \(\d+%\))? since( step)? \d+|no finding above 3 %)"
    assert re.search(live, plain), plain[-2000:]
    assert max(len(line) for line in re.split(r"[\r\n]", plain) if "iteration" in line and " · " in line) <= 100
    # the script's own line goes above the progress line, on a line of its own, not onto it
    assert re.search(r'(^|[\r\n])\{"params": ', plain), plain[-2000:]
    # off a terminal nothing of it: tests/test_run_cli.py (a run whose stderr is a pipe)
