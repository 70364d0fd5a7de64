"""Start-up: `commprof --help` loads no subcommand's modules — no torch, no MPI — and each subcommand
still registers all of its flags when named. Measured in benchmarks/startup.py."""

import subprocess
import sys

import pytest


def _imports(*argv: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "commprof", *argv], capture_output=True,
                          text=True, timeout=120)
    modules = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return proc, modules


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["bnch"]])
def test_the_top_level_imports_no_torch(argv):
    proc, modules = _imports(*argv)
    assert proc.returncode == (2 if argv == ["bnch"] else 0), proc.stderr[-2000:]
    assert modules and not {m for m in modules if m.split(".")[0] in ("torch", "torchvision", "mpi4py", "numpy")}
    assert not {m for m in modules if m.split(".")[:2] in (["commprof", "bench"], ["commprof", "run"],
                                                           ["commprof", "comm"])}


def test_a_named_subcommand_registers_its_flags():
    proc, modules = _imports("bench", "--help")
    assert proc.returncode == 0 and "--stepfactor" in proc.stdout and "commprof.bench.config" in modules
    assert not {m for m in modules if m.split(".")[:2] == ["commprof", "run"]}


@pytest.mark.parametrize("argv", [
    ["bench", "all_reduce", "--backend", "mpi", "--nproc", "2", "-b", "8", "-e", "8", "-n", "1", "-w", "0"],
    ["run", "--strategy", "ddp", "--backend", "gloo", "--nproc", "2", "--steps", "2", "--warmup", "1",
     "--eval-samples", "0"],
], ids=["bench-mpi", "run-gloo"])
def test_the_launcher_loads_no_torch_before_its_ranks(argv):
    # -X importtime is the launcher's own: the ranks it starts print no import lines
    proc, modules = _imports(*argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "commprof.lifecycle" in modules
    assert not {m for m in modules if m.split(".")[0] in ("torch", "torchvision", "mpi4py", "numpy")}
