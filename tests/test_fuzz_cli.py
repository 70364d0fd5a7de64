"""Rejected argv of `commprof bench` and `commprof run`, launched for real: three drawn from
tests/cli_fuzz.py's grammar end with exit 2 and one `commprof: error:` line, before any rank starts and
leaving no process behind. The same grammar fuzzed in-process (no process starts) is
tests/unit/test_cli_grammar.py.
"""

import uuid

from cli_fuzz import TAG, invalid_argv, leftovers, problem
from spawn import commprof, env_for_tests


def test_three_rejected_argv_launched_for_real(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # each should stop before writing anything; if one did not, not here
    for argv in invalid_argv(3):
        tag = uuid.uuid4().hex
        proc = commprof(*argv, env=env_for_tests(**{TAG: tag}), timeout=120)
        assert problem(proc.returncode, proc.stderr) is None and proc.returncode == 2, (argv, proc.stderr)
        assert not leftovers(tag), argv
