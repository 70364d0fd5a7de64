"""The ranks measure with the allocator the environment gives them, as a user's job would: no huge pages unless
--huge-pages asks, under commprof's launcher, one process alone, and torchrun alike; JSON `env.allocator` says
which, and bench's header says when huge pages are on."""

import json
import subprocess
import sys

import pytest
from spawn import env_for_tests

BENCH = ["bench", "all_gather", "-b", "8", "-e", "8", "-n", "2", "-w", "1"]


def bench(tmp_path, launcher: list[str], *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / f"b{len(list(tmp_path.iterdir()))}.json"
    env = env_for_tests()
    env.pop("THP_MEM_ALLOC_ENABLE", None)
    proc = subprocess.run([*launcher, *BENCH, *flags, "--json", str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out.read_text())["env"]["allocator"]


LAUNCHERS = {
    "commprof": [sys.executable, "-m", "commprof"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "commprof"],
}


def test_no_huge_pages_unless_asked(tmp_path):
    plain, seen = bench(tmp_path, LAUNCHERS["commprof"], "--nproc", "2")
    assert seen["huge_pages"] is False and seen["THP_MEM_ALLOC_ENABLE"] is None
    assert "huge pages" not in plain.stdout


@pytest.mark.parametrize("how", ["commprof --nproc 2", "commprof --nproc 1", "torchrun"])
def test_huge_pages_when_asked(tmp_path, how):
    asked, seen = bench(tmp_path, LAUNCHERS[how.split()[0]], *how.split()[1:], "--huge-pages")
    assert seen["huge_pages"] is (seen["transparent_hugepage"] != "never") and seen["THP_MEM_ALLOC_ENABLE"] == "1"
    assert ("huge pages: torch's large CPU buffers" in asked.stdout) is seen["huge_pages"]
