"""Start-up: `commprof --help` loads no subcommand's modules — no torch, no MPI — and each subcommand
still registers all of its flags when named; `predict` and `report`, which only read files, load no torch.
Measured in benchmarks/startup.py."""

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
    assert "commprof.launcher.lifecycle" in modules
    assert not {m for m in modules if m.split(".")[0] in ("torch", "torchvision", "mpi4py", "numpy")}


def test_predict_and_report_load_no_torch(tmp_path):
    # the replay costs each op with the kernels' α–β models (kernels/*.cost): they load without torch
    out = tmp_path / "r.json"
    ran = subprocess.run([sys.executable, "-m", "commprof", "run", "--strategy", "ddp", "--nproc", "2", "--steps", "3",
                          "--warmup", "1", "--eval-samples", "0", "--trace", str(tmp_path / "t"), "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    for argv in (["predict", str(out), "--fabric", "intra=10GB/s,3us;inter=1GB/s,10us", "--ranks", "2,8"],
                 ["report", str(out)]):
        proc, modules = _imports(*argv)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert not {m for m in modules if m.split(".")[0] in ("torch", "torchvision", "mpi4py")}, argv
    # and every algorithm's model, which importtime does not see (importlib loads them)
    every = ("import sys, commprof.kernels as k; "
             "[k.find(c, a).cost(4, 1 << 20, 1e-6, 1e-9) for c, by in k.CATALOG.items() for a in by]; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    models = subprocess.run([sys.executable, "-c", every], capture_output=True, text=True, timeout=120)
    assert models.returncode == 0 and models.stdout.strip() == "[]", models.stdout + models.stderr
