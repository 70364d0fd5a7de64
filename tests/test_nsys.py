"""`commprof nsys`: the Nsight Systems command it prints, what it does without nsys, and — with a
stand-in `nsys` on PATH (Nsight cannot be installed here) — that every rank really runs under its own
`nsys profile … --output=DIR/rank<r>` with the capture range on the `measured` NVTX range."""

import os
import stat
import sys

from spawn import commprof, env_for_tests

FAKE_NSYS = """#!{python}
import os, sys
args = sys.argv[1:]
assert args[0] == "profile", args
n = next(i for i, a in enumerate(args[1:]) if not a.startswith("--"))
flags, rest = args[1:1 + n], args[1 + n:]
out = next(f.split("=", 1)[1] for f in flags if f.startswith("--output="))
with open(out + ".flags", "w") as f:
    f.write("\\n".join(flags))
os.execv(rest[0], rest)
"""


def test_prints_the_command_with_mpi_tracing_and_the_capture_range():
    proc = commprof("nsys", "--print-only", "--output", "prof", "--", "run", "--strategy", "ddp", "--backend", "mpi")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert "--trace=cuda,nvtx,osrt,mpi" in first and "--capture-range=nvtx" in first
    assert "--nvtx-capture=measured@commprof" in first and "prof/rank{rank}" in first
    assert "nvtx_sum,nvtx_gpu_proj_sum,cuda_gpu_kern_sum prof/rank0.nsys-rep" in proc.stdout
    assert "prof/rank%q{RANK}" in proc.stdout  # the prefix for other launchers


def test_without_nsys_says_so_in_one_line(tmp_path):
    env = env_for_tests(PATH=str(tmp_path))  # no nsys anywhere on PATH
    proc = commprof("nsys", "--", "run", "--strategy", "ddp", "--nproc", "2", "--steps", "2", env=env)
    assert proc.returncode == 0
    assert proc.stderr.strip() == "commprof: nsys is not installed here; run the command above where Nsight Systems is"


def test_a_job_is_required():
    proc = commprof("nsys", "--", "train")
    assert proc.returncode == 2 and "needs a job" in proc.stderr


def test_every_rank_runs_under_its_own_nsys_profile(tmp_path):
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(FAKE_NSYS.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = env_for_tests(PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "reports"
    proc = commprof("nsys", "--output", str(out), "--", "run", "--strategy", "ddp", "--nproc", "2", "--steps", "3",
                    "--warmup", "1", "--batch-size", "8", "--eval-samples", "0", env=env)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        flags = (out / f"rank{rank}.flags").read_text().splitlines()
        assert f"--output={out}/rank{rank}" in flags and "--nvtx-capture=measured@commprof" in flags
