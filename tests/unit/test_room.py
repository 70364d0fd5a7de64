"""The launcher refuses, before any rank starts, what this host cannot hold (commprof/base/world.py check_room):
more ranks than its memory holds at a rank's own 280 MiB plus its buffers, whatever is asked; more than 4
ranks a core unless --oversubscribe. One line, exit 2, through cli's own paths in this process."""

import pytest
from cli_fuzz import check

from commprof.base.errors import UsageError
from commprof.base.world import RANK_BYTES, RANKS_PER_CORE, available_memory, check_room, usable_cores


def test_more_than_four_ranks_a_core_needs_oversubscribe():
    most = RANKS_PER_CORE * usable_cores()
    check_room(most, oversubscribe=False)
    with pytest.raises(UsageError, match=f"--nproc {most + 1}: .* --oversubscribe starts them anyway"):
        check_room(most + 1, oversubscribe=False)
    if (most + 1) * RANK_BYTES < available_memory():
        check_room(most + 1, oversubscribe=True)


def test_what_the_memory_cannot_hold_is_refused_even_oversubscribed():
    ranks = available_memory() // RANK_BYTES + 1
    with pytest.raises(UsageError, match=f"{ranks} rank\\(s\\) need about .* available"):
        check_room(ranks, oversubscribe=True)
    with pytest.raises(UsageError, match="of buffers"):
        check_room(1, oversubscribe=False, per_rank_bytes=available_memory())


@pytest.mark.parametrize("argv,words", [
    (["bench", "all_reduce", "--nproc", "100000"], "100000 rank(s) need about"),
    (["bench", "all_reduce", "--nproc", "100000", "--oversubscribe"], "100000 rank(s) need about"),
    (["bench", "all_reduce", "-e", "1T", "--nproc", "2"], "of buffers"),
    (["bench", "all_reduce", "-b", "64G", "-e", "64G", "--nproc", "1"], "of buffers"),
    (["run", "--strategy", "ddp", "--nproc", str(4 * usable_cores() + 1)], "--oversubscribe starts them anyway"),
])
def test_the_command_line_says_it_in_one_line(argv, words):
    got = check(argv)
    assert got.code == 2 and got.stderr.count("\n") == 1 and words in got.stderr, got.stderr


def test_a_job_within_the_host_is_accepted():
    got = check(["bench", "all_reduce", "-e", "16M", "--nproc", "2"])
    assert got.code == 0, got.stderr
