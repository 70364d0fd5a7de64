"""`commprof report` and `commprof predict` given files they cannot use — not JSON, cut short, 200 MB of `[`,
JSON nested too deeply, binary bytes, bytes that are not UTF-8, a folder, a FIFO without a writer,
/dev/null, an empty file, valid JSON of the wrong shape — as a result, a run or trace, and a --fabric
bench JSON: every one ends at once with exit 2 and one `commprof: error: <file>: <what is wrong>` line,
never a traceback and never a hang. Every case runs the real CLI; the cases run side by side.
Exercised by: `pytest tests/test_bad_input.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from spawn import commprof, env_for_tests, kill_session

TIMEOUT_S = 60.0
"""Every case is done within this (each takes about a second); one still running is a hang."""

FABRIC = ("--fabric", "intra=1GB/s,1us")
COMMANDS = {
    "report": lambda path: ["report", path],
    "predict": lambda path: ["predict", path, *FABRIC],
    "fabric": lambda path: ["predict", "run.json", "--fabric", path],  # --fabric is read before the inputs
}
"""argv of each command that reads a file, given the file's path."""

WRONG_SHAPE = {  # valid JSON objects, but their fields are not what the command reads
    "report": {"complete": True, "results": [{"collective": "all_reduce"}]},
    "predict": {"traceEvents": 5},
    "fabric": {"complete": True, "env": 3, "results": [{"collective": "sendrecv", "nbytes": 8, "time_us": 1}]},
}


def _file(name: str, data: bytes | str):
    def make(tmp: Path, command: str) -> str:
        path = tmp / name
        if not path.exists():
            path.write_bytes(data if isinstance(data, bytes) else data.encode())
        return str(path)
    return make


def _brackets(tmp: Path, command: str) -> str:
    """200 MB of `[`: json.loads raised RecursionError on it (exit 1)."""
    path = tmp / "brackets.json"
    if not path.exists():
        with open(path, "wb") as f:
            for _ in range(200):
                f.write(b"[" * (1 << 20))
    return str(path)


def _folder(tmp: Path, command: str) -> str:
    (tmp / "folder.json").mkdir(exist_ok=True)
    return str(tmp / "folder.json")


def _fifo(tmp: Path, command: str) -> str:
    """A FIFO no process writes to: opening it to read waits for a writer, for ever."""
    if not (tmp / "fifo.json").exists():
        os.mkfifo(tmp / "fifo.json")
    return str(tmp / "fifo.json")


def _wrong_shape(tmp: Path, command: str) -> str:
    path = tmp / f"shape-{command}.json"
    path.write_text(json.dumps(WRONG_SHAPE[command]))
    return str(path)


def _run_nested_trace(tmp: Path, command: str) -> str:
    """A traced run's JSON whose trace.json is nested too deeply."""
    (tmp / "nested-trace").mkdir(exist_ok=True)
    (tmp / "nested-trace" / "trace.json").write_text('{"traceEvents": ' + "[" * 100_000)
    (tmp / "nested-run.json").write_text(json.dumps({"config": {"out": {"trace": "nested-trace"}}, "iterations": 4}))
    return str(tmp / "nested-run.json")


def _trace_folder_fifo(tmp: Path, command: str) -> str:
    """A trace's folder whose trace.json is a FIFO."""
    (tmp / "fifo-trace").mkdir(exist_ok=True)
    if not (tmp / "fifo-trace" / "trace.json").exists():
        os.mkfifo(tmp / "fifo-trace" / "trace.json")
    return str(tmp / "fifo-trace")


KINDS = {
    # kind: (makes the file and gives its path, words the error line holds)
    "not-json": (_file("text.json", "hello, world\n"), "not a JSON object: it begins with 'h'"),
    "cut-short": (_file("cut.json", '{"complete": true, "results": [{"collective": "all_'), "not JSON, or cut short"),
    "200MB-of-brackets": (_brackets, "not a JSON object: it begins with '['"),
    "nested-too-deeply": (_file("nested.json", '{"results": ' + "[" * 100_000), "JSON nested too deeply"),
    "binary": (_file("plot.png.json", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 16), "it begins with byte 0x89"),
    "not-utf8": (_file("latin1.json", b'{"host": "caf\xe9"}'), "not UTF-8 text: byte 0xe9"),
    "folder": (_folder, "folder"),
    "fifo": (_fifo, "a FIFO, not a file"),
    "dev-null": (lambda tmp, command: os.devnull, "a character device, not a file"),
    "empty": (_file("empty.json", b""), "the file is empty"),
    "white-space": (_file("blank.json", " \n\t\n"), "only white space"),
    "json-list": (_file("list.json", "[1, 2, 3]"), "not a JSON object"),
    "wrong-shape": (_wrong_shape, "a field is missing or of the wrong type"),
}
CASES = [(command, kind) for command in COMMANDS for kind in KINDS]
CASES += [("predict", "run-with-nested-trace"), ("predict", "trace-folder-fifo")]
EXTRA = {"run-with-nested-trace": (_run_nested_trace, "not a commprof trace (JSON nested too deeply)"),
         "trace-folder-fifo": (_trace_folder_fifo, "trace.json: cannot read it (a FIFO, not a file)")}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """(path, exit code or None when it hung, stderr) of every case, all started at once."""
    tmp = tmp_path_factory.mktemp("bad-input")
    env = env_for_tests()
    started = {}
    with tempfile.TemporaryDirectory(prefix="commprof-bad-input-") as logs:
        try:
            for command, kind in CASES:
                path = {**KINDS, **EXTRA}[kind][0](tmp, command)
                err = open(Path(logs) / f"{command}-{kind}.err", "w+")
                proc = subprocess.Popen([sys.executable, "-m", "commprof", *COMMANDS[command](path)], env=env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                        start_new_session=True)
                started[(command, kind)] = (path, proc, err)
            deadline = time.monotonic() + TIMEOUT_S
            while any(p.poll() is None for _, p, _ in started.values()) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            results = {}
            for case, (path, proc, err) in started.items():
                code = proc.poll()
                kill_session(proc)  # a hung case, and anything it started
                err.seek(0)
                results[case] = (path, code, err.read())
                err.close()
    return results


@pytest.mark.parametrize("command, kind", CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_a_file_that_cannot_be_used_is_one_line_exit_2(outcomes, command, kind):
    path, code, stderr = outcomes[(command, kind)]
    words = {**KINDS, **EXTRA}[kind][1]
    assert code is not None, f"commprof {command} hung on {kind} ({path}): still running after {TIMEOUT_S:.0f} s"
    assert "Traceback" not in stderr, stderr[-3000:]
    assert code == 2 and stderr.count("\n") == 1 and stderr.startswith("commprof: error: "), (code, stderr[-3000:])
    named = str(Path(path).parent / "nested-trace" / "trace.json") if kind == "run-with-nested-trace" else path
    assert named in stderr and words in stderr, stderr  # the file that is wrong: for a run, perhaps its trace


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads a file of mode 000")
def test_a_file_without_read_permission_is_one_line_exit_2(tmp_path):
    path = tmp_path / "secret.json"
    path.write_text('{"complete": true}')
    path.chmod(0)
    for command, argv in COMMANDS.items():
        proc = commprof(*argv(str(path)), timeout=TIMEOUT_S)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (command, proc.stderr)
        assert proc.stderr.startswith("commprof: error: ") and "cannot read it (Permission denied)" in proc.stderr
