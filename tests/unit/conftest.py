"""The fast lane: every test under tests/unit/ runs in this pytest process and starts no other. Each way a
process is started (subprocess, os.fork/posix_spawn/system, multiprocessing) raises ProcessStarted here, so
a test that would launch one fails naming the call instead of quietly making the lane slow.

    python3 -m pytest tests/unit -q
"""

from __future__ import annotations

import multiprocessing.process
import os
import shutil
import subprocess
from pathlib import Path

# matplotlib's first import on a machine without its font cache asks fontconfig for the fonts (`fc-list`) to
# build it: likewise here, once, not in the first test that draws a plot
import matplotlib.font_manager  # noqa: F401,E402
import pytest

# torch.distributed's first import asks ldconfig for libdl (ctypes.util.find_library runs `ldconfig -p`): it
# happens here, once, while the lane is collected, not inside whichever test would import it first
import torch.distributed  # noqa: F401


class ProcessStarted(RuntimeError):
    """A test of the fast lane tried to start a process."""


STARTERS = ((subprocess.Popen, "_execute_child"), (os, "fork"), (os, "forkpty"), (os, "posix_spawn"),
            (os, "posix_spawnp"), (os, "system"), (os, "execv"), (os, "execve"),
            (multiprocessing.process.BaseProcess, "start"))
"""Every call through which Python starts or replaces a process: subprocess.run/call/check_output/Popen and
os.popen end in Popen._execute_child, os.spawn* in fork, torch.multiprocessing in BaseProcess.start."""


@pytest.fixture(autouse=True)
def no_process(monkeypatch):
    for owner, name in STARTERS:
        if hasattr(owner, name):
            monkeypatch.setattr(owner, name, _refuse(f"{getattr(owner, '__name__', owner)}.{name}"))


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise ProcessStarted(f"{what}: tests/unit/ starts no process (a test that needs one belongs in tests/)")
    return refuse


RECORDED = Path(__file__).resolve().parents[1] / "recorded"
"""Fixtures of real jobs (tests/recorded/README.md says how each was made: tests/support/record.py)."""


@pytest.fixture
def recorded(tmp_path):
    """recorded(name) -> a copy of the recorded fixture's folder in this test's tmp_path, to read or write."""
    def copy(name: str) -> Path:
        if not (RECORDED / name).is_dir():
            raise FileNotFoundError(f"no recorded fixture {name!r}: python tests/support/record.py {name}")
        return Path(shutil.copytree(RECORDED / name, tmp_path / name))
    return copy
