"""What a user's terminal shows at 80 and 120 columns: one real bench job of two algorithms and two dtypes, its
stdout a pseudo-terminal of that size (no COLUMNS: commprof asks the terminal), never cuts a number and never
loses what tells its rows apart — both dtypes and both algorithms are named in the rows. The same tables on
recorded and built results, at more widths: tests/unit/test_table_widths.py."""

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import tempfile
import termios

import pytest
from spawn import env_for_tests, kill_session, read_terminal

JOB = ["bench", "all_reduce", "--algo", "library,ring", "-b", "8", "-e", "64K", "-f", "8", "-n", "3", "-w", "1",
       "-d", "float32,bfloat16", "--nproc", "2", "--backend", "gloo"]


def on_a_terminal(argv: list[str], columns: int, rows: int = 40) -> tuple[int, str, str]:
    """Run commprof with its stdout on a pseudo-terminal of `columns` x `rows`; its exit code, what the terminal
    showed (colours left out) and its stderr."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = env_for_tests(TERM="xterm")
    for name in ("COLUMNS", "LINES"):  # the terminal's size, as a user's shell would leave it to the program
        env.pop(name, None)
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "commprof", *argv], stdin=subprocess.DEVNULL, stdout=slave,
                                stderr=err, env=env, start_new_session=True)
        os.close(slave)
        try:
            shown = read_terminal(master)
            code = proc.wait(timeout=240)
        finally:
            kill_session(proc)
            os.close(master)
        err.seek(0)
        text = shown.decode(errors="replace").replace("\r\n", "\n")
        return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text), err.read()


def rows_of(text: str) -> list[list[str]]:
    """The body rows of the tables in `text`, each a list of its cells."""
    return [[cell.strip() for cell in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]


@pytest.mark.parametrize("columns", (80, 120))
def test_a_bench_of_two_algorithms_and_two_dtypes_on_a_terminal(columns):
    code, shown, err = on_a_terminal(JOB, columns)
    assert code == 0, err[-3000:]
    lines = shown.splitlines()
    assert all(len(line) <= columns for line in lines if line[:1] in "┏┃│└"), shown
    assert "…" not in shown, shown  # no number cut, nor anything else
    assert "algorithm ring" in " ".join(lines)
    start = max(i for i, line in enumerate(lines) if line.startswith("summary"))
    tables, summary = rows_of("\n".join(lines[:start])), rows_of("\n".join(lines[start:]))
    for row in tables:  # every number cell whole: sizes, times, bandwidths
        assert all(re.fullmatch(r"[\d.]+|float32|bfloat16|sum|none|n/a", cell) for cell in row if cell), row
    # both dtypes in the rows of each table, both algorithms in the summary's: one line a (collective, dtype)
    assert {"float32", "bfloat16"} <= {cell for row in tables for cell in row}, shown
    names = [(row[0], next((c for c in row if c in ("float32", "bfloat16")), None)) for row in summary]
    assert sorted(names) == sorted((name, dtype) for name in ("sendrecv", "all_reduce", "all_reduce/ring")
                                   for dtype in ("float32", "bfloat16")), "\n".join(lines[start:])
