"""nccl-tests' most common command lines are accepted as they are: each flag of its threads-and-GPUs model
whose value asks for what commprof does anyway (`-g 1`, `-t 1`, `-p 0`, `-N 1`, `-C 0`, `-y 0`, `-G 0`,
`-R 0`, …) configures the same job as leaving it out; any other value is one line and exit 2. Through cli's own
paths, in this process (tests/cli_fuzz.py's check): no rank starts."""

import dataclasses

import pytest
from cli_fuzz import check

from commprof.bench.nccl_flags import AS_HERE

BASE = ["bench", "all_reduce", "-b", "8", "-e", "128M", "-f", "2", "--nproc", "2"]


def test_the_most_common_all_reduce_perf_line_configures_the_plain_job():
    plain = check(BASE)
    assert plain.code == 0, plain.stderr
    every = check([*BASE, *(w for flag, value in AS_HERE.items() for w in (flag, value))])
    assert every.code == 0, every.stderr
    # the same job; only the command line it records differs
    same = dataclasses.replace(every.config, out=dataclasses.replace(every.config.out, argv=plain.config.out.argv))
    assert same == plain.config and every.nproc == plain.nproc


@pytest.mark.parametrize("flag", sorted(AS_HERE))
def test_any_other_value_is_one_line(flag):
    other = "2" if AS_HERE[flag] != "2" else "3"
    got = check([*BASE, flag, other])
    assert got.code == 2 and got.stderr.count("\n") == 1, got.stderr
    assert got.stderr.startswith(f"commprof: error: {flag} {other}: "), got.stderr


@pytest.mark.parametrize("theirs,ours", [("alltoall", "all_to_all"), ("all_reduce_perf", "all_reduce"),
                                         ("alltoall_perf", "all_to_all")])
def test_nccl_tests_names_of_collectives_are_taken(theirs, ours):
    got = check(["bench", theirs, "--nproc", "2"])
    assert got.code == 0 and got.config.collectives == (ours,), got.stderr


@pytest.mark.parametrize("argv,words", [
    (["-d", "uint32"], "dtype uint32: torch's uint32 has no arithmetic"),
    (["-d", "float,uint64"], "dtype uint64: "),
    (["-d", "fp8_e5m2"], "dtype fp8_e5m2: fp8 has no torch.distributed collective"),
    (["-o", "mulsum"], "reduce op mulsum: nccl-tests' mulsum is NCCL's PREMUL_SUM"),
])
def test_nccl_tests_names_without_a_meaning_here_are_one_line(argv, words):
    got = check(["bench", "all_reduce", "--nproc", "2", *argv])
    assert got.code == 2 and got.stderr.count("\n") == 1 and words in got.stderr, got.stderr
