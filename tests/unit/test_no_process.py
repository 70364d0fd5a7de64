"""The fast lane starts no process: every way of starting one is refused inside tests/unit/ (conftest.py)."""

import multiprocessing
import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("start", [
    lambda: subprocess.run([sys.executable, "-c", "pass"]),
    lambda: subprocess.check_output(["true"]),
    lambda: os.popen("true"),
    lambda: os.system("true"),
    lambda: os.fork(),
    lambda: os.posix_spawn("/bin/true", ["true"], {}),
    lambda: os.spawnv(os.P_WAIT, "/bin/true", ["true"]),
    lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    lambda: multiprocessing.get_context("fork").Process(target=print).start(),
], ids=["subprocess.run", "check_output", "os.popen", "os.system", "os.fork", "posix_spawn", "os.spawnv",
        "mp-spawn", "mp-fork"])
def test_every_way_of_starting_a_process_is_refused(start):
    with pytest.raises(RuntimeError, match="starts no process"):
        start()


def test_torch_multiprocessing_is_refused_too():
    import torch.multiprocessing as tmp

    with pytest.raises(RuntimeError, match="starts no process"):
        tmp.start_processes(print, nprocs=1, join=False, start_method="spawn")
