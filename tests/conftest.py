"""Test-wide set-up: tests/ on the path, every test outside tests/unit/ marked `job` (it starts processes:
`pytest -m job` runs the jobs alone), tests marked gpu skipped where no CUDA GPU is seen, and a check at the
end of the run that no process a test started (spawn.py marks them all) is still alive — a leaked rank fails
the run. tests/README.md says what lives where."""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from spawn import RUN_ENV, SESSION_ENV, processes, session_id  # noqa: E402

LEAK_GRACE_S = 5.0
"""Time a process of the last test gets to finish exiting before it counts as leaked."""


UNIT = Path(__file__).parent / "unit"
"""The fast lane: its tests start no process (unit/conftest.py refuses it)."""


def pytest_collection_modifyitems(config, items):
    """Tests outside tests/unit/ are marked job; tests marked gpu are skipped where torch sees no CUDA GPU
    (asked of the driver: no torch import)."""
    import pytest

    from commprof.base.backends import cuda_devices

    for item in items:
        if UNIT not in Path(item.fspath).parents:
            item.add_marker(pytest.mark.job)
    if cuda_devices():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


TERMINAL = ("COLUMNS", "LINES")
"""Set to 80 and 24 in pytest-xdist's workers, whatever the run had: the jobs' tables would then be drawn at 80
columns instead of as commprof draws them off a terminal. Each worker takes the first process's back."""


def pytest_configure(config):
    """The run's id for every process its tests start, xdist's workers' included: they inherit it, and the
    first process's terminal size."""
    os.environ.setdefault(RUN_ENV, str(os.getpid()))
    for name in TERMINAL:
        kept = f"COMMPROF_TEST_{name}"
        if not hasattr(config, "workerinput"):
            os.environ.setdefault(kept, os.environ.get(name, ""))
        elif os.environ.get(kept):
            os.environ[name] = os.environ[kept]
        else:
            os.environ.pop(name, None)


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):  # the first process checks, once every worker has finished
        return
    deadline = time.monotonic() + LEAK_GRACE_S
    left = processes(SESSION_ENV, session_id())
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes(SESSION_ENV, session_id())
    if not left:
        return
    lines = []
    for pid in left:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        lines.append(f"  pid {pid}: {cmd[:200]}")
    if lines:
        sys.stderr.write("\nprocesses started by the tests were still alive at the end (killed now):\n"
                         + "\n".join(lines) + "\n")
        session.exitstatus = 1
