"""`commprof bench --groups intra|inter` without a job: the ranks' hosts laid out into the groups of each
level (ranks of one host, or one rank of each host), and the layouts that cannot be made refused in one line."""

import pytest


@pytest.mark.parametrize("level, hosts, groups", [
    ("intra", ["a", "a", "b", "b"], ((0, 1), (2, 3))),
    ("inter", ["a", "a", "b", "b"], ((0, 2), (1, 3))),
    ("inter", ["a", "b", "a", "b"], ((0, 1), (2, 3))),  # ranks dealt round-robin over the hosts
    ("intra", ["a", "a", "a"], ((0, 1, 2),)),
])
def test_host_levels_lay_out_the_ranks(level, hosts, groups):
    from commprof.bench.runner import level_layout

    layout = level_layout(level, hosts)
    assert layout.groups == groups and layout.size == len(groups[0]) and layout.level == level
    assert layout.concurrent == (len(groups) > 1) and [layout.label(i) for i in range(len(groups))] == \
        [f"{level}{i}" for i in range(len(groups))]


@pytest.mark.parametrize("level, hosts, message", [
    ("intra", ["a", "b"], "--groups intra needs at least 2 ranks per host"),
    ("inter", ["a", "a", "b"], "--groups needs the same number of ranks on every host: a 2, b 1"),
])
def test_host_levels_that_cannot_be_laid_out(level, hosts, message):
    from commprof.base.errors import UsageError
    from commprof.bench.runner import level_layout

    with pytest.raises(UsageError, match=message):
        level_layout(level, hosts)
